// Registrations count against the pinned-memory limit as the kernel counts them for
// ibv_reg_mr: a process without CAP_IPC_LOCK pins at most RLIMIT_MEMLOCK bytes, in whole pages.
// Past it, registration fails with an error that names the size, the limit and the capability;
// releasing a region makes room again. Runs in a child process that lowers its own limit and
// drops CAP_IPC_LOCK (CI runs as root, which is otherwise exempt).
#include <doctest/doctest.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <vector>

#include "rdmachan/channel.hpp"

using namespace rdmachan;

namespace {

constexpr std::size_t kLimit = 64 * 1024;

bool drop_ipc_lock() {
    __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
    __user_cap_data_struct data[2]{};
    if (syscall(SYS_capget, &header, data) != 0) return false;
    data[CAP_IPC_LOCK / 32].effective &= ~(1u << (CAP_IPC_LOCK % 32));
    return syscall(SYS_capset, &header, data) == 0;
}

#define EXPECT(condition, what)                           \
    do {                                                  \
        if (!(condition)) {                               \
            std::fprintf(stderr, "expected %s\n", what);  \
            return 1;                                     \
        }                                                 \
    } while (false)

int limited_process() {
    const rlimit limit{kLimit, kLimit};
    EXPECT(setrlimit(RLIMIT_MEMLOCK, &limit) == 0, "setrlimit(RLIMIT_MEMLOCK)");
    EXPECT(drop_ipc_lock(), "dropping CAP_IPC_LOCK");
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    PreparedChannel channel = ChannelBuilder().device("soft").build();
    // Page-aligned buffers so the pinned figure is exactly their size.
    auto* memory = static_cast<std::uint8_t*>(std::aligned_alloc(page, 4 * kLimit));
    EXPECT(memory != nullptr, "memory");
    std::optional<MemoryRegion> first = channel.register_memory(memory, kLimit / 2);
    std::string message;
    try {
        channel.register_memory(memory + kLimit, kLimit);
    } catch (const Error& error) {
        message = error.what();
    }
    std::fprintf(stderr, "refused: %s\n", message.c_str());
    EXPECT(message.find(std::to_string(kLimit) + " bytes at") != std::string::npos, "the size asked for");
    EXPECT(message.find("RLIMIT_MEMLOCK (ulimit -l) is 65536 bytes") != std::string::npos, "the limit");
    EXPECT(message.find("lacks CAP_IPC_LOCK") != std::string::npos, "the capability");
    EXPECT(message.find("32768 already pinned") != std::string::npos, "what is already pinned");
    // An unaligned region pins every page it touches: 2 pages for 2 bytes across a boundary.
    {
        MemoryRegion straddling = channel.register_memory(memory + 2 * kLimit + page - 1, 2);
        bool refused = false;
        try {
            channel.register_memory(memory + 3 * kLimit, kLimit / 2 - page);
        } catch (const Error&) {
            refused = true;
        }
        EXPECT(refused, "a 2-byte region across a page boundary counts 2 pages");
    }
    first.reset();
    MemoryRegion second = channel.register_memory(memory + kLimit, kLimit);  // room again
    EXPECT(second.length() == kLimit, "the whole limit once the first region is gone");
    std::free(memory);
    return 0;
}

}  // namespace

TEST_CASE("registration beyond RLIMIT_MEMLOCK fails naming the size and the limit; deregistration frees room") {
    const pid_t child = fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        int status = 2;
        try {
            status = limited_process();
        } catch (const std::exception& error) {
            std::fprintf(stderr, "%s\n", error.what());
        }
        _exit(status);
    }
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}
