// Test fixture: a forked child process and the two pipes between it and the parent, with reads
// and waits that each have a deadline (a dead or stuck child fails the test, never hangs it).
#pragma once

#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <thread>

namespace rdmachan::test {

inline bool write_all(int descriptor, const void* data, std::size_t length) {
    const auto* bytes = static_cast<const std::uint8_t*>(data);
    while (length != 0) {
        const ssize_t written = ::write(descriptor, bytes, length);
        if (written <= 0) return false;
        bytes += written;
        length -= static_cast<std::size_t>(written);
    }
    return true;
}

// Reads exactly `length` bytes or fails after `seconds`.
inline bool read_all(int descriptor, void* data, std::size_t length, int seconds = 20) {
    auto* out = static_cast<std::uint8_t*>(data);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
    while (length != 0 && std::chrono::steady_clock::now() < until) {
        pollfd waiting{descriptor, POLLIN, 0};
        if (::poll(&waiting, 1, 100) != 1) continue;
        const ssize_t got = ::read(descriptor, out, length);
        if (got <= 0) return false;
        out += got;
        length -= static_cast<std::size_t>(got);
    }
    return length == 0;
}

class ChildProcess {
public:
    pid_t pid = -1;
    int to_child = -1;
    int from_child = -1;

    ChildProcess(pid_t child, int to, int from) : pid(child), to_child(to), from_child(from) {}
    ChildProcess(const ChildProcess&) = delete;
    ChildProcess& operator=(const ChildProcess&) = delete;
    // A test that failed half-way: the child sees its pipe close and exits; reap it.
    ~ChildProcess() {
        if (pid > 0) wait(10);
    }

    // Forks; the child runs body(from_parent, to_parent), which must not return (it _exits).
    template <typename Body>
    static std::unique_ptr<ChildProcess> start(Body body) {
        ::signal(SIGPIPE, SIG_IGN);  // a dead child must fail the test, not kill it
        int down[2];
        int up[2];
        REQUIRE(::pipe(down) == 0);
        REQUIRE(::pipe(up) == 0);
        const pid_t pid = ::fork();
        REQUIRE(pid >= 0);
        if (pid == 0) {
            ::close(down[1]);
            ::close(up[0]);
            body(down[0], up[1]);
            ::_exit(120);
        }
        ::close(down[0]);
        ::close(up[1]);
        return std::make_unique<ChildProcess>(pid, down[1], up[0]);
    }

    // The child's exit code, or -1 if it had not exited by the deadline (it is then killed).
    int wait(int seconds) {
        close_pipes();  // the child reads its commands until the pipe closes
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
        int status = 0;
        while (std::chrono::steady_clock::now() < until) {
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                close_pipes();
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status);
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        pid = -1;
        return -1;
    }

    void close_pipes() {
        if (to_child >= 0) ::close(to_child);
        if (from_child >= 0) ::close(from_child);
        to_child = from_child = -1;
    }
};

}  // namespace rdmachan::test
