// Which host, kernel boot and namespaces a process runs in: what the software device compares
// to decide a peer device shares its host (transport/soft/same_host.hpp), and what the rendezvous
// compares to decide which ranks can share one copy of the job table (handshake/host_table.hpp).
#pragma once

#include <array>
#include <cstdint>
#include <string>

namespace rdmachan::detail {

// A process's pid and memory are meaningful to another only with the same boot, user and PID
// namespace; the network namespace makes 127.0.0.1 the same loopback.
struct HostIdentity {
    std::array<std::uint8_t, 16> boot_id{};  // /proc/sys/kernel/random/boot_id
    std::uint32_t uid = 0;
    std::uint64_t network_namespace = 0;  // inode of /proc/self/ns/net
    std::uint64_t pid_namespace = 0;      // inode of /proc/self/ns/pid
    std::uint32_t pid = 0;
};

// This process's identity: boot id and namespaces read once per process image (they do not change
// across fork), uid and pid on every call (a forked child may change its user).
HostIdentity this_host_identity();

// Why `peer` is not on this host ("boot id differs", ...), or nullptr when it is.
const char* different_host_reason(const HostIdentity& mine, const HostIdentity& peer);

// The part of the identity two processes must share to read each other's memory through /proc:
// boot id, uid and both namespaces, as 32 + 8 + 16 + 16 hex digits. Equal texts: same host.
std::string host_key(const HostIdentity& identity);

}  // namespace rdmachan::detail
