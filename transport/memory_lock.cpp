#include "transport/memory_lock.hpp"

#include <sys/resource.h>
#include <unistd.h>

#include <fstream>
#include <string>

namespace rdmachan::transport {
namespace {

constexpr unsigned kCapabilityIpcLock = 14;  // CAP_IPC_LOCK in linux/capability.h

// The effective capability set from /proc/self/status, so no libcap is needed.
bool holds_ipc_lock() {
    std::ifstream status("/proc/self/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("CapEff:", 0) != 0) continue;
        const std::uint64_t effective = std::stoull(line.substr(7), nullptr, 16);
        return (effective >> kCapabilityIpcLock & 1) != 0;
    }
    return false;
}

}  // namespace

MemoryLockLimit memory_lock_limit() {
    MemoryLockLimit limit;
    limit.exempt = holds_ipc_lock();
    rlimit value{};
    if (getrlimit(RLIMIT_MEMLOCK, &value) == 0 && value.rlim_cur != RLIM_INFINITY) limit.bytes = value.rlim_cur;
    return limit;
}

std::uint64_t pinned_bytes(const void* address, std::size_t length) {
    const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
    const auto start = reinterpret_cast<std::uint64_t>(address);
    const std::uint64_t first = start / page * page;
    const std::uint64_t end = (start + length + page - 1) / page * page;
    return end - first;
}

std::string describe(const MemoryLockLimit& limit) {
    if (limit.exempt) return "this process holds CAP_IPC_LOCK, so RLIMIT_MEMLOCK does not apply";
    if (!limit.bytes) return "RLIMIT_MEMLOCK (ulimit -l) is unlimited";
    return "RLIMIT_MEMLOCK (ulimit -l) is " + std::to_string(*limit.bytes) +
           " bytes and this process lacks CAP_IPC_LOCK (raise it: `ulimit -l unlimited`, or memlock in "
           "/etc/security/limits.conf)";
}

}  // namespace rdmachan::transport
