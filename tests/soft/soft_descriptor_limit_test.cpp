// The software device and the open-file limit: it raises the soft limit to the hard one, and
// when descriptors run out its error says so and names the limit.
#include <doctest/doctest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>

#include "rdmachan/channel.hpp"
#include "rdmachan/error.hpp"

TEST_CASE("opening the software device raises RLIMIT_NOFILE to the hard limit") {
    rlimit limit{};
    REQUIRE(::getrlimit(RLIMIT_NOFILE, &limit) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        // Lower the soft limit only; the device must put it back up to the hard limit.
        rlimit lowered = limit;
        lowered.rlim_cur = 256;
        if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) ::_exit(3);
        try {
            rdmachan::PreparedChannel prepared = rdmachan::ChannelBuilder().device("soft").build();
        } catch (...) {
            ::_exit(4);
        }
        rlimit after{};
        ::getrlimit(RLIMIT_NOFILE, &after);
        ::_exit(after.rlim_cur == limit.rlim_max ? 0 : 5);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

// Skipped in the ASan+UBSan build (CMake defines RDMACHAN_UBSAN_VPTR_CHECK there): UBSan's vptr
// check probes a vtable through a pipe it creates (sanitizer_common's IsAccessibleMemoryRange),
// which cannot be made in a process with no descriptor left, so it reports valid objects as
// having an invalid vptr and aborts the child. The main and TSan builds run it.
#ifdef RDMACHAN_UBSAN_VPTR_CHECK
constexpr bool kVptrCheckNeedsDescriptors = true;
#else
constexpr bool kVptrCheckNeedsDescriptors = false;
#endif

TEST_CASE("out of descriptors: the error says so and names RLIMIT_NOFILE" * doctest::skip(kVptrCheckNeedsDescriptors)) {
    int pipe_fds[2];
    REQUIRE(::pipe(pipe_fds) == 0);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(pipe_fds[0]);
        // Soft and hard limit at the lowest free descriptor: nothing more can be opened, and the
        // device cannot raise it.
        const int probe = ::dup(0);
        ::close(probe);
        rlimit lowered{static_cast<rlim_t>(probe), static_cast<rlim_t>(probe)};
        if (::setrlimit(RLIMIT_NOFILE, &lowered) != 0) ::_exit(3);
        std::string message = "no error";
        try {
            rdmachan::PreparedChannel prepared = rdmachan::ChannelBuilder().device("soft").build();
        } catch (const std::exception& error) {
            message = error.what();
        }
        (void)!::write(pipe_fds[1], message.data(), message.size());
        ::_exit(0);
    }
    ::close(pipe_fds[1]);
    std::string message;
    char chunk[512];
    for (ssize_t got; (got = ::read(pipe_fds[0], chunk, sizeof chunk)) > 0;) message.append(chunk, static_cast<std::size_t>(got));
    ::close(pipe_fds[0]);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CAPTURE(message);
    CHECK(message.find("out of file descriptors") != std::string::npos);
    CHECK(message.find("RLIMIT_NOFILE is") != std::string::npos);
}
