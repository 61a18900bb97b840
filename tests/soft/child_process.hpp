// Test fixture: a forked child process and the two pipes between it and the parent, with reads
// and waits that each have a deadline (a dead or stuck child fails the test, never hangs it),
// and failures that name the child.
#pragma once

#include <doctest/doctest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <thread>
#include <utility>

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

// Where a test called a ChildProcess member: as a default argument, here() is the caller's line
// (what std::source_location gives; the project's Clang 14 cannot build libstdc++'s).
struct CallSite {
    const char* file;
    unsigned line;
    static constexpr CallSite here(const char* file = __builtin_FILE(), unsigned line = __builtin_LINE()) { return {file, line}; }
};

class ChildProcess {
public:
    // What wait() returns for a child ended by `signal` (SIGKILL from kill(), a crash).
    static constexpr int ended_by(int signal) { return 200 + signal; }
    static constexpr int kNotExited = -1;

    pid_t pid = -1;
    int to_child = -1;
    int from_child = -1;
    std::string name;  // in every failure message: "the target", "the passive peer", ...

    ChildProcess(pid_t child, int to, int from, std::string child_name)
        : pid(child), to_child(to), from_child(from), name(std::move(child_name)) {}
    ChildProcess(const ChildProcess&) = delete;
    ChildProcess& operator=(const ChildProcess&) = delete;
    // A test that failed half-way: the child sees its pipe close and exits; reap it.
    ~ChildProcess() {
        if (pid > 0) wait(10);
    }

    // Forks; the child runs body(from_parent, to_parent), which must not return (it _exits).
    template <typename Body>
    static std::unique_ptr<ChildProcess> start(std::string name, Body body) {
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
        return std::make_unique<ChildProcess>(pid, down[1], up[0], std::move(name));
    }
    template <typename Body>
    static std::unique_ptr<ChildProcess> start(Body body) {
        return start("the child", std::move(body));
    }

    // Sends `value` down the pipe; a child that is gone fails the test, named. Failures here
    // say where the test called (`caller`), since doctest reports this header's line.
    template <typename Value>
    void send(const Value& value, const char* what, CallSite caller = CallSite::here()) {
        REQUIRE_MESSAGE(write_all(to_child, &value, sizeof value),
                        describe_child() << " did not take " << what << " (" << where(caller) << ")");
    }
    // Reads a `Value` the child sends, or fails the test after `seconds`, naming the child.
    template <typename Value>
    Value receive(const char* what, int seconds = 20, CallSite caller = CallSite::here()) {
        Value value{};
        REQUIRE_MESSAGE(read_all(from_child, &value, sizeof value, seconds),
                        describe_child() << " sent no " << what << " within " << seconds << " s (" << where(caller) << ")");
        return value;
    }

    // Ends the child at once (a peer that dies mid-transfer); wait() then reaps it.
    void kill() { ::kill(pid, SIGKILL); }

    // The child's exit code, ended_by(signal), or kNotExited if it had not exited by the
    // deadline (it is then killed and the test fails, naming it).
    int wait(int seconds, CallSite caller = CallSite::here()) {
        const std::string child = describe_child();
        close_pipes();  // the child reads its commands until the pipe closes
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(seconds);
        int status = 0;
        while (std::chrono::steady_clock::now() < until) {
            if (::waitpid(pid, &status, WNOHANG) == pid) {
                pid = -1;
                return WIFEXITED(status) ? WEXITSTATUS(status) : ended_by(WTERMSIG(status));
            }
            std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        FAIL_CHECK(child << " did not exit within " << seconds << " s; killed (" << where(caller) << ")");
        ::kill(pid, SIGKILL);
        ::waitpid(pid, &status, 0);
        pid = -1;
        return kNotExited;
    }

    // Waits (at most `seconds`) and checks the child's exit code; a failure names the child and
    // how it ended.
    void expect_exit(int expected, int seconds, CallSite caller = CallSite::here()) {
        const std::string child = describe_child();
        const int code = wait(seconds, caller);
        CHECK_MESSAGE(code == expected,
                      child << " " << describe(code) << ", expected: " << describe(expected) << " (" << where(caller) << ")");
    }

    static std::string describe(int code) {
        if (code == kNotExited) return "did not exit";
        if (code >= ended_by(1)) return "was ended by signal " + std::to_string(code - ended_by(0));
        return "exited with " + std::to_string(code);
    }

    std::string describe_child() const { return name + " (pid " + std::to_string(pid) + ")"; }
    static std::string where(const CallSite& caller) { return std::string(caller.file) + ":" + std::to_string(caller.line); }

    void close_pipes() {
        if (to_child >= 0) ::close(to_child);
        if (from_child >= 0) ::close(from_child);
        to_child = from_child = -1;
    }
};

}  // namespace rdmachan::test
