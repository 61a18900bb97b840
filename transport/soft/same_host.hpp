// The software device's same-host path: whether a peer device runs on this host (same kernel
// boot, same user, same network and PID namespaces), which path RDMACHAN_SOFT_TRANSPORT asks
// for, and the cross-memory-attach copies (process_vm_readv/process_vm_writev) that move
// payloads straight between the two processes' registered memory.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>

namespace rdmachan::soft {

// RDMACHAN_SOFT_TRANSPORT: auto (default) uses the same-host path when the peer is on this host
// and cross-memory attach works; tcp never uses it; shm requires a same-host peer (a peer on
// another host is an error naming it).
enum class TransportMode : std::uint8_t { automatic, same_host, tcp };

// Reads RDMACHAN_SOFT_TRANSPORT; throws SoftDeviceError naming the variable for any other value.
TransportMode transport_mode_from_environment();
const char* to_string(TransportMode mode);

// What two devices compare to decide they share a host: a process's pid and memory are
// meaningful to the other only with the same boot, user and PID namespace; the network
// namespace makes 127.0.0.1 the same loopback.
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

// Reads 8 bytes at `address` in process `pid` and compares them with `expected`: 0 when cross
// memory attach works and `pid` is the process that published the word, else an errno (EPERM,
// ENOSYS, ESRCH, ..., or EIO for a different value). RDMACHAN_SOFT_REFUSE_CMA=1 makes it answer
// EPERM without trying, as a ptrace-restricted or seccomp-filtered process would.
int probe_cross_memory_attach(std::uint32_t pid, std::uint64_t address, std::uint64_t expected);

// Copies `length` bytes between this process (`local`) and process `pid` (`remote`) with
// process_vm_readv / process_vm_writev, repeating on partial transfers. Returns 0 or the errno
// (EFAULT for a partial copy that cannot continue). No allocation; the vectors stay unchanged.
int read_from_process(std::uint32_t pid, const iovec* local, std::size_t local_count, const iovec* remote,
                      std::size_t remote_count, std::size_t length);
int write_to_process(std::uint32_t pid, const iovec* local, std::size_t local_count, const iovec* remote,
                     std::size_t remote_count, std::size_t length);

}  // namespace rdmachan::soft
