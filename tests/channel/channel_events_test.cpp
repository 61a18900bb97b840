// Completion events through the public API, between two processes on the software device (the
// same-host path and TCP): a blocking wait in each WaitMode, Channel::native_handle() and arm()
// as an event loop uses them, and a waiter asleep on the event when its peer dies.
//
// Whether a wait sleeps on the event or polls is told by the waiting thread's voluntary context
// switches (getrusage, RUSAGE_THREAD) over a 300 ms wait: one block is a handful, polling with
// 50 us sleeps is thousands. No figure of time is asserted.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <optional>
#include <string>
#include <thread>

#include "rdmachan/channel.hpp"
#include "tests/channel/process_pair_settings.hpp"

using namespace rdmachan;

namespace {

const char* const kToken = "channel-events-test";
constexpr std::size_t kMemory = 64 * 1024;
constexpr std::uint32_t kMessage = 64;

// What the parent asks of the child, one at a time.
struct Command {
    char what = 'q';          // 's': send kMessage bytes after `delay_ms`; 'k': die by SIGKILL; 'q': end
    std::uint32_t delay_ms = 0;
};

int child(int port_pipe, int command_pipe, WaitMode mode) try {
    PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).wait_mode(mode).build();
    MemoryRegion region = prepared.allocate_memory(kMemory);
    prepared.publish_region("memory", region);
    Channel channel = std::move(prepared).connect(test::listening_settings(kToken, port_pipe));
    Command command;
    while (read(command_pipe, &command, sizeof command) == static_cast<ssize_t>(sizeof command)) {
        if (command.what == 'k') raise(SIGKILL);
        if (command.what != 's') return 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(command.delay_ms));
        const WorkResult sent = channel.send(region.slice(0, kMessage));
        if (!sent.ok()) {
            std::fprintf(stderr, "child: send failed: %s\n", sent.error().message().c_str());
            return 1;
        }
    }
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "child: %s\n", error.what());
    return 2;
}

// A connected pair: the child in its own process, driven through `command`.
class Pair {
public:
    Pair(const char* transport, WaitMode mode) {
        REQUIRE(setenv("RDMACHAN_SOFT_TRANSPORT", transport, 1) == 0);
        int port_pipe[2];
        int command_pipe[2];
        REQUIRE(pipe(port_pipe) == 0);
        REQUIRE(pipe(command_pipe) == 0);
        pid_ = fork();
        if (pid_ == 0) {
            close(port_pipe[0]);
            close(command_pipe[1]);
            std::_Exit(child(port_pipe[1], command_pipe[0], mode));
        }
        close(port_pipe[1]);
        close(command_pipe[0]);
        command_ = command_pipe[1];
        std::uint16_t port = 0;
        REQUIRE(read(port_pipe[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
        close(port_pipe[0]);
        PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).wait_mode(mode).build();
        region_ = prepared.allocate_memory(kMemory);
        prepared.publish_region("memory", region_);
        channel_.emplace(std::move(prepared).connect(test::connecting_settings(kToken, port)));
    }

    ~Pair() {
        if (pid_ > 0) command({'q', 0});  // a child already reaped has no reader: no write
        close(command_);
        channel_.reset();
        int status = 0;
        if (pid_ > 0) waitpid(pid_, &status, 0);
        unsetenv("RDMACHAN_SOFT_TRANSPORT");
    }

    void command(Command what) { (void)!write(command_, &what, sizeof what); }
    // The child's exit status once it ended (-1: killed by a signal, whose number is `signal`).
    int wait_child(int& signal) {
        int status = 0;
        REQUIRE(waitpid(pid_, &status, 0) == pid_);
        signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
        pid_ = -1;
        return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    }

    Channel& channel() { return *channel_; }
    MemoryRegion& region() { return region_; }

private:
    pid_t pid_ = -1;
    int command_ = -1;
    MemoryRegion region_;
    std::optional<Channel> channel_;
};

// This thread's context switches so far: voluntary (it blocked or slept) and involuntary (it
// was switched out while runnable, which is also what a yield that hands the core over counts
// as).
struct Switches {
    long voluntary = 0;
    long involuntary = 0;
};

Switches switches_so_far() {
    rusage usage{};
    getrusage(RUSAGE_THREAD, &usage);
    return {usage.ru_nvcsw, usage.ru_nivcsw};
}

// How long this thread has been runnable, in ns: on a CPU plus waiting on a run queue for one
// (/proc/thread-self/schedstat's first two fields); nullopt where the kernel does not say.
std::optional<long long> runnable_nanoseconds() {
    std::ifstream schedstat("/proc/thread-self/schedstat");
    long long on_cpu = 0;
    long long waiting_for_cpu = 0;
    if (!(schedstat >> on_cpu >> waiting_for_cpu)) return std::nullopt;
    return on_cpu + waiting_for_cpu;
}

bool readable(int descriptor, int timeout_ms) {
    pollfd entry{descriptor, POLLIN, 0};
    return ::poll(&entry, 1, timeout_ms) == 1 && (entry.revents & POLLIN) != 0;
}

const char* const kTransports[] = {"auto", "tcp"};

}  // namespace

TEST_CASE("a blocked receive wakes for a send 300 ms later in every wait mode; adaptive and event sleep meanwhile") {
    for (const char* transport : kTransports) {
        for (const WaitMode mode : {WaitMode::spin, WaitMode::adaptive, WaitMode::event}) {
            const std::string name = std::string(transport) + ", " + to_string(mode);
            CAPTURE(name);
            Pair pair(transport, mode);
            CHECK(pair.channel().native_handle() >= 0);
            PendingWork receive = pair.channel().post_receive(pair.region().slice(0, kMessage));
            pair.command({'s', 300});
            const Switches before = switches_so_far();
            const std::optional<long long> runnable_before = runnable_nanoseconds();
            const WorkResult received = receive.wait();
            const std::optional<long long> runnable_after = runnable_nanoseconds();
            const Switches after = switches_so_far();
            const long long runnable_ms =
                runnable_before && runnable_after ? (*runnable_after - *runnable_before) / 1000000 : -1;
            const long voluntary = after.voluntary - before.voluntary;
            const long involuntary = after.involuntary - before.involuntary;
            REQUIRE(received.ok());
            CHECK(received.completion().bytes == kMessage);
            MESSAGE(name << ": " << voluntary << " voluntary and " << involuntary
                         << " involuntary context switches, runnable " << runnable_ms
                         << " ms, while waiting");
            // Spin mode never blocks for long. Once its spins and yields are done it sleeps 50 us
            // between polls: many short sleeps (voluntary switches; hundreds in 300 ms on a quiet
            // machine). On a loaded machine its yields can fill the whole 300 ms before it ever
            // sleeps, the thread runnable throughout: each yield hands the core to another thread
            // for a slice (0 voluntary and 75-137 involuntary with three busy loops on two cores,
            // under ASan), and when the others run at idle priority (CI's sanitizer builds beside
            // the tests) for a whole scheduler period (0 voluntary and 16 involuntary). Either way
            // it kept polling; what it never does is sleep on the completion event, runnable for
            // none of the 300 ms. Adaptive and event modes do sleep on it: one switch, a few more
            // if adaptive's spin was preempted; preempted often (25 switches under ASan beside
            // CPU-bound tests), it still slept: runnable for 4 ms of the 300.
            if (mode == WaitMode::spin) {
                const bool slept_briefly_between_polls = voluntary + involuntary > 20;
                const bool stayed_runnable = runnable_ms >= 150;
                CHECK((slept_briefly_between_polls || stayed_runnable));
            } else {
                const bool blocked_once = voluntary + involuntary < 20;
                const bool slept_most_of_it = runnable_ms >= 0 && runnable_ms < 150;
                CHECK((blocked_once || slept_most_of_it));
            }
        }
    }
}

TEST_CASE("native_handle and arm: readable at the next completion after an arm, never while armed with nothing") {
    for (const char* transport : kTransports) {
        const std::string name = transport;
        CAPTURE(name);
        Pair pair(transport, WaitMode::event);
        Channel& channel = pair.channel();
        const int descriptor = channel.native_handle();
        REQUIRE(descriptor >= 0);
        CHECK(channel.native_handle() == descriptor);  // one descriptor for the channel's life

        PendingWork first = channel.post_receive(pair.region().slice(0, kMessage));
        REQUIRE(channel.arm());
        CHECK_FALSE(readable(descriptor, 0));
        pair.command({'s', 0});
        CHECK(readable(descriptor, 10000));
        REQUIRE(first.wait().ok());
        // Arming again takes the old event: nothing to read until the next completion.
        REQUIRE(channel.arm());
        CHECK_FALSE(readable(descriptor, 0));

        // A completion waiting unpolled: arm() says so, and arms nothing.
        PendingWork second = channel.post_receive(pair.region().slice(kMessage, kMessage));
        pair.command({'s', 0});
        CHECK(readable(descriptor, 10000));
        CHECK_FALSE(channel.arm());
        const std::optional<WorkResult> taken = second.poll();
        REQUIRE(taken.has_value());
        CHECK(taken->ok());
        REQUIRE(channel.arm());
        CHECK_FALSE(readable(descriptor, 0));
    }
}

TEST_CASE("event mode: a waiter asleep on the event when its peer dies gets the error, naming the peer") {
    for (const char* transport : kTransports) {
        const std::string name = transport;
        CAPTURE(name);
        Pair pair(transport, WaitMode::event);
        Channel& channel = pair.channel();
        const RemoteMemoryRegion remote = channel.remote_region("memory");
        REQUIRE(channel.write(pair.region().slice(0, kMessage), remote.slice(0, kMessage)).ok());
        pair.command({'k', 0});
        int signal = 0;
        CHECK(pair.wait_child(signal) == -1);
        CHECK(signal == SIGKILL);
        // Writes to the dead peer until one fails. Until this device has seen the peer's
        // connection close, a same-host write still lands zero-hop in the memory the dead process
        // left mapped, as a NIC's writes land until the kernel has torn down the dead process's
        // queue pair; the first that cannot be delivered fails, and its wait sleeps on the event.
        bool failed = false;
        std::string peer;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (!failed && std::chrono::steady_clock::now() < until) {
            const WorkResult result = channel.write(pair.region().slice(0, kMessage), remote.slice(0, kMessage));
            if (!result.ok()) {
                failed = true;
                peer = result.error().peer;
            } else {
                std::this_thread::sleep_for(std::chrono::milliseconds(1));
            }
        }
        CHECK(failed);
        CHECK(peer == channel.peer());
        CHECK_FALSE(peer.empty());
        CHECK_FALSE(channel.healthy());
    }
}
