// What a wait costs while nothing happens, and how soon it wakes when something does, in each
// WaitMode, beside the floor of a process blocked in read() on a pipe, measured the same way in
// the same run. Two processes on the software device: the waiter posts a receive and waits; the
// sender sleeps `idle` milliseconds, notes the time (CLOCK_MONOTONIC, in shared memory) and sends.
//   wake latency: from the sender's note to the waiter's return from wait(), median of the rounds;
//   CPU while idle: the waiting process's CPU time (every thread: the device's too) over the wait,
//                   as a share of one core;
//   wakes: the waiting thread's voluntary context switches per wait.
// With --load N, N processes spin on the CPUs for the whole run (a loaded machine).
//   idle_wake_benchmark [--idle-ms 200] [--rounds 10] [--transport auto|tcp] [--load N]
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/channel.hpp"
#include "tests/channel/process_pair_settings.hpp"

namespace {

const char* const kToken = "idle-wake-benchmark";
constexpr std::size_t kMessage = 8;

struct Settings {
    std::uint32_t idle_ms = 200;
    std::uint32_t rounds = 10;
    std::string transport = "auto";
    std::uint32_t load = 0;
};

std::int64_t now_ns() {
    timespec time{};
    clock_gettime(CLOCK_MONOTONIC, &time);
    return std::int64_t{time.tv_sec} * 1'000'000'000 + time.tv_nsec;
}

std::int64_t process_cpu_ns() {
    timespec time{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time);
    return std::int64_t{time.tv_sec} * 1'000'000'000 + time.tv_nsec;
}

long thread_voluntary_switches() {
    rusage usage{};
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nvcsw;
}

// Shared by the two processes: when the sender sent, per round.
struct Shared {
    std::int64_t sent_at[1024];
    std::int64_t wake_returned_at[1024];  // when the sender's call that wakes the waiter returned
};

struct Round {
    double latency_us;
    double sender_us;  // how long the sender's call took (a send waits for its own completion)
    double cpu_share;  // of one core, over the wait
    long wakes;
};

// The sender: on each byte from `go`, sleeps, notes the time, and wakes the waiter.
template <typename Wake>
void sender(int go, Shared* shared, const Settings& settings, Wake wake) {
    std::uint8_t round = 0;
    for (std::uint32_t i = 0; i < settings.rounds && read(go, &round, 1) == 1; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(settings.idle_ms));
        shared->sent_at[i] = now_ns();
        if (!wake(i)) std::_Exit(1);
        shared->wake_returned_at[i] = now_ns();
    }
}

template <typename Wait>
std::vector<Round> waiter(int go, Shared* shared, const Settings& settings, Wait wait) {
    std::vector<Round> rounds;
    for (std::uint32_t i = 0; i < settings.rounds; ++i) {
        const std::uint8_t byte = 1;
        if (write(go, &byte, 1) != 1) break;
        const std::int64_t started = now_ns();
        const std::int64_t cpu = process_cpu_ns();
        const long switches = thread_voluntary_switches();
        if (!wait(i)) break;
        const std::int64_t woke = now_ns();
        // The sender's call may still be returning: wait for its note before reading it.
        while (__atomic_load_n(&shared->wake_returned_at[i], __ATOMIC_ACQUIRE) == 0) std::this_thread::yield();
        rounds.push_back({static_cast<double>(woke - shared->sent_at[i]) / 1000.0,
                          static_cast<double>(shared->wake_returned_at[i] - shared->sent_at[i]) / 1000.0,
                          static_cast<double>(process_cpu_ns() - cpu) / static_cast<double>(woke - started),
                          thread_voluntary_switches() - switches});
    }
    return rounds;
}

std::vector<Round> run_pipe(const Settings& settings, Shared* shared) {
    std::memset(shared, 0, sizeof *shared);
    int go[2];
    int wake[2];
    if (pipe(go) != 0 || pipe(wake) != 0) return {};
    const pid_t child = fork();
    if (child == 0) {
        close(go[1]);
        close(wake[0]);
        sender(go[0], shared, settings, [&](std::uint32_t) { return write(wake[1], "w", 1) == 1; });
        std::_Exit(0);
    }
    close(go[0]);
    close(wake[1]);
    std::vector<Round> rounds = waiter(go[1], shared, settings, [&](std::uint32_t) {
        char byte = 0;
        return read(wake[0], &byte, 1) == 1;
    });
    close(go[1]);
    close(wake[0]);
    waitpid(child, nullptr, 0);
    return rounds;
}

std::vector<Round> run_channel(const Settings& settings, Shared* shared, rdmachan::WaitMode mode) {
    std::memset(shared, 0, sizeof *shared);
    setenv("RDMACHAN_SOFT_TRANSPORT", settings.transport.c_str(), 1);
    int port_pipe[2];
    int go[2];
    if (pipe(port_pipe) != 0 || pipe(go) != 0) return {};
    auto build = [&] {
        return rdmachan::ChannelBuilder().device("soft").wait_mode(mode).deadline(std::chrono::seconds(30)).build();
    };
    const pid_t child = fork();
    if (child == 0) {
        close(port_pipe[0]);
        close(go[1]);
        try {
            rdmachan::PreparedChannel prepared = build();
            rdmachan::MemoryRegion region = prepared.allocate_memory(4096);
            rdmachan::Channel channel = std::move(prepared).connect(rdmachan::test::listening_settings(kToken, port_pipe[1]));
            sender(go[0], shared, settings, [&](std::uint32_t) { return channel.send(region.slice(0, kMessage)).ok(); });
            // Until the waiter is done with its last receive.
            std::uint8_t end = 0;
            (void)!read(go[0], &end, 1);
        } catch (const std::exception& error) {
            std::fprintf(stderr, "sender: %s\n", error.what());
            std::_Exit(1);
        }
        std::_Exit(0);
    }
    close(port_pipe[1]);
    close(go[0]);
    std::uint16_t port = 0;
    if (read(port_pipe[0], &port, sizeof port) != static_cast<ssize_t>(sizeof port)) return {};
    std::vector<Round> rounds;
    {
        rdmachan::PreparedChannel prepared = build();
        rdmachan::MemoryRegion region = prepared.allocate_memory(4096);
        rdmachan::Channel channel = std::move(prepared).connect(rdmachan::test::connecting_settings(kToken, port));
        rounds = waiter(go[1], shared, settings, [&](std::uint32_t) {
            rdmachan::PendingWork receive = channel.post_receive(region.slice(0, kMessage));
            return receive.wait().ok();
        });
        close(go[1]);
    }
    waitpid(child, nullptr, 0);
    return rounds;
}

double median(std::vector<double> values) {
    if (values.empty()) return 0;
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

void print(const char* name, const std::vector<Round>& rounds, const Settings& settings, double floor_us) {
    std::vector<double> latency;
    std::vector<double> cpu;
    std::vector<double> wakes;
    std::vector<double> sender;
    for (const Round& round : rounds) {
        sender.push_back(round.sender_us);
        latency.push_back(round.latency_us);
        cpu.push_back(round.cpu_share);
        wakes.push_back(static_cast<double>(round.wakes));
    }
    if (rounds.size() != settings.rounds) {
        std::printf("%-9s FAILED: %zu of %u rounds\n", name, rounds.size(), settings.rounds);
        return;
    }
    const double wake = median(latency);
    std::printf("%-9s wake %8.1f us (min %.1f, max %.1f)  x%.2f of the pipe  cpu %6.3f%% of a core  wakes %6.0f per wait  "
                "sender's call %.1f us\n",
                name, wake, *std::min_element(latency.begin(), latency.end()), *std::max_element(latency.begin(), latency.end()),
                floor_us > 0 ? wake / floor_us : 0.0, 100.0 * median(cpu), median(wakes), median(sender));
}

}  // namespace

int main(int argc, char** argv) {
    Settings settings;
    for (int i = 1; i + 1 < argc; i += 2) {
        const std::string name = argv[i];
        const char* value = argv[i + 1];
        if (name == "--idle-ms") settings.idle_ms = static_cast<std::uint32_t>(std::stoul(value));
        else if (name == "--rounds") settings.rounds = std::min<std::uint32_t>(1024, static_cast<std::uint32_t>(std::stoul(value)));
        else if (name == "--transport") settings.transport = value;
        else if (name == "--load") settings.load = static_cast<std::uint32_t>(std::stoul(value));
        else {
            std::fprintf(stderr, "usage: %s [--idle-ms N] [--rounds N] [--transport auto|tcp] [--load N]\n", argv[0]);
            return 2;
        }
    }
    auto* shared = static_cast<Shared*>(mmap(nullptr, sizeof(Shared), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0));
    if (shared == MAP_FAILED) return 1;
    std::vector<pid_t> load;
    for (std::uint32_t i = 0; i < settings.load; ++i) {
        const pid_t spinner = fork();
        if (spinner == 0) {
            volatile std::uint64_t spins = 0;
            for (;;) spins = spins + 1;
        }
        load.push_back(spinner);
    }
    std::printf("idle_wake_benchmark: idle %u ms, %u rounds, transport %s, %u spinning processes\n", settings.idle_ms, settings.rounds,
                settings.transport.c_str(), settings.load);
    const std::vector<Round> pipe_rounds = run_pipe(settings, shared);
    std::vector<double> pipe_latency;
    for (const Round& round : pipe_rounds) pipe_latency.push_back(round.latency_us);
    const double floor_us = median(pipe_latency);
    print("pipe", pipe_rounds, settings, floor_us);
    int status = pipe_rounds.size() == settings.rounds ? 0 : 1;
    for (const rdmachan::WaitMode mode : {rdmachan::WaitMode::spin, rdmachan::WaitMode::adaptive, rdmachan::WaitMode::event}) {
        const std::vector<Round> rounds = run_channel(settings, shared, mode);
        print(rdmachan::to_string(mode), rounds, settings, floor_us);
        if (rounds.size() != settings.rounds) status = 1;
    }
    for (const pid_t spinner : load) {
        kill(spinner, SIGKILL);
        waitpid(spinner, nullptr, 0);
    }
    return status;
}
