// The kernel's limit on pinned memory, which every RDMA registration counts against: a process
// without CAP_IPC_LOCK may pin at most RLIMIT_MEMLOCK bytes (`ulimit -l`), counted in whole
// pages over all its registrations, and ibv_reg_mr fails with ENOMEM beyond it. The software
// device applies the same rule, and both providers name the limit when a registration fails.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>

namespace rdmachan::transport {

struct MemoryLockLimit {
    std::optional<std::uint64_t> bytes;  // none: unlimited
    bool exempt = false;                 // CAP_IPC_LOCK in the effective set: no limit applies
};

MemoryLockLimit memory_lock_limit();

// The pages a registration of [address, address + length) pins, in bytes.
std::uint64_t pinned_bytes(const void* address, std::size_t length);

// "RLIMIT_MEMLOCK (ulimit -l) is 65536 bytes and this process lacks CAP_IPC_LOCK", or why no
// limit applies.
std::string describe(const MemoryLockLimit& limit);

}  // namespace rdmachan::transport
