// The safety of the software device's zero-hop writes against processes that stop or go away:
// a deregistration never returns while a peer may still write the region (a peer stopped in its
// write makes it fail, naming the peer and the key, and the region stays registered; a peer that
// died in it is reclaimed), and a write whose target exited never lands in the process that got
// its pid next.
//
// Each case holds a zero-hop write between its checks and its move (soft::delay_zero_hop_writes)
// and does to the process in that window what the case is about.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <thread>

#include "tests/soft/child_process.hpp"
#include "tests/soft/scoped_environment.hpp"
#include "tests/soft/soft_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::bytes_differing;
using rdmachan::test::ChildProcess;
using rdmachan::test::Environment;
using rdmachan::test::EndpointOptions;
using rdmachan::test::read_all;
using rdmachan::test::settle_path;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_all;
using rdmachan::test::write_request;

namespace {

constexpr std::uint32_t kWriteBytes = 4096;
constexpr std::uint8_t kPattern = 0xab;

// What the parent (the target) tells the initiator child.
struct TargetDetails {
    Address endpoint;
    std::uint64_t region_addr;
    std::uint32_t region_rkey;
};

// What the initiator child reports once its write completed.
struct WriteOutcome {
    std::uint8_t status;  // mlx5::CompletionStatus, 0xff: no completion
    std::uint64_t zero_hop_writes;
};

// The initiator child: connects to the parent's QP, then posts one zero-hop write of kWriteBytes
// into the parent's region that waits `delay` between its checks and its move; says 'p' just before
// posting, reports the outcome, and exits when the parent closes the pipe.
void initiator_child(int from_parent, int to_parent, std::chrono::milliseconds delay) {
    TargetDetails target{};
    if (!read_all(from_parent, &target, sizeof target)) ::_exit(100);
    auto device = soft::Device::open();
    SoftEndpoint endpoint(device);
    const Address mine = endpoint.address();
    if (!write_all(to_parent, &mine, sizeof mine)) ::_exit(101);
    endpoint.connect(target.endpoint);
    char connected = 0;
    if (!read_all(from_parent, &connected, 1)) ::_exit(102);
    if (!settle_path(endpoint, target.endpoint)) ::_exit(103);
    std::memset(endpoint.buffer(), kPattern, kWriteBytes);
    soft::delay_zero_hop_writes(delay);
    if (!write_all(to_parent, "p", 1)) ::_exit(104);
    const mlx5::ScatterGatherElement source = endpoint.local(0, kWriteBytes);
    const mlx5::SendWorkRequest write = write_request(1, &source, target.region_addr, target.region_rkey);
    WriteOutcome outcome{0xff, 0};
    if (endpoint.post(&write, 1) == mlx5::PostResult::ok) {
        if (const auto completion = endpoint.wait_send(std::chrono::seconds(20))) outcome.status = static_cast<std::uint8_t>(completion->status);
    }
    outcome.zero_hop_writes = device->zero_hop_writes();
    if (!write_all(to_parent, &outcome, sizeof outcome)) ::_exit(105);
    char never = 0;
    read_all(from_parent, &never, 1, 60);
    ::_exit(0);
}

// The parent's side: a target device with a region of kWriteBytes, connected to the child's QP,
// up to the moment the child's write holds the region (its slot in our table holds the key).
struct Target {
    std::shared_ptr<soft::Device> device;
    std::optional<SoftEndpoint> endpoint;
    std::shared_ptr<soft::MemoryRegion> region;
    std::uint8_t* window = nullptr;

    void start(ChildProcess& child) {
        device = soft::Device::open();
        endpoint.emplace(device);
        window = endpoint->buffer() + 65536;
        std::memset(window, 0, kWriteBytes);
        region = device->register_memory(endpoint->domain_pointer(), window, kWriteBytes, soft::kLocalWrite | soft::kRemoteWrite);
        const TargetDetails details{endpoint->address(), region->addr(), region->rkey()};
        REQUIRE(write_all(child.to_child, &details, sizeof details));
        Address initiator{};
        REQUIRE(read_all(child.from_child, &initiator, sizeof initiator));
        endpoint->connect(initiator);
        REQUIRE(write_all(child.to_child, "g", 1));
        char posting = 0;
        REQUIRE(read_all(child.from_child, &posting, 1));
        REQUIRE(posting == 'p');
        // The child's doorbell thread is in its delay, holding the key, once its slot says so.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (device->zero_hop_holder(region->rkey()) != static_cast<std::uint32_t>(child.pid) &&
               std::chrono::steady_clock::now() < until) {
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
        REQUIRE(device->zero_hop_holder(region->rkey()) == static_cast<std::uint32_t>(child.pid));
    }
};

std::string hex(std::uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "%#x", value);
    return text;
}

}  // namespace

TEST_CASE("deregistration while a peer is stopped in a zero-hop write: fails naming the peer and the key; the region stays registered") {
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "1");
    auto child = ChildProcess::start([](int from_parent, int to_parent) {
        initiator_child(from_parent, to_parent, std::chrono::milliseconds(3000));
    });
    Target target;
    target.start(*child);
    REQUIRE(::kill(child->pid, SIGSTOP) == 0);

    const auto began = std::chrono::steady_clock::now();
    std::string error;
    try {
        target.region->deregister();
    } catch (const soft::SoftDeviceError& refused) {
        error = refused.what();
    }
    const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
    MESSAGE("deregistration: " << (error.empty() ? "returned" : error) << " after " << waited_ms << " ms");
    CHECK(error.find("process " + std::to_string(child->pid)) != std::string::npos);
    CHECK(error.find("key " + hex(target.region->rkey())) != std::string::npos);
    CHECK(error.find("stays registered") != std::string::npos);
    CHECK(waited_ms >= 1900);
    CHECK(bytes_differing(target.window, kWriteBytes, 0) == 0);  // stopped before its move

    // Still registered: the resumed write completes, and lands.
    REQUIRE(::kill(child->pid, SIGCONT) == 0);
    WriteOutcome outcome{};
    REQUIRE(read_all(child->from_child, &outcome, sizeof outcome));
    CHECK(outcome.status == static_cast<std::uint8_t>(mlx5::CompletionStatus::success));
    CHECK(outcome.zero_hop_writes == 1);
    CHECK(bytes_differing(target.window, kWriteBytes, kPattern) == 0);
    // Nothing holds it now: deregistration succeeds, and at once.
    const auto again = std::chrono::steady_clock::now();
    CHECK(target.device->zero_hop_holder(target.region->rkey()) == 0);
    CHECK_NOTHROW(target.region->deregister());
    CHECK(std::chrono::steady_clock::now() - again < std::chrono::milliseconds(1900));
    CHECK(child->wait(10) == 0);
}

TEST_CASE("deregistration while a peer that died in a zero-hop write holds the region: its slot is reclaimed, no deadline") {
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "1");
    auto child = ChildProcess::start([](int from_parent, int to_parent) {
        initiator_child(from_parent, to_parent, std::chrono::milliseconds(3000));
    });
    Target target;
    target.start(*child);
    REQUIRE(::kill(child->pid, SIGKILL) == 0);
    // Not reaped: a zombie has exited too (no thread of it is in a write), though its pid is taken.
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    siginfo_t state{};
    while (::waitid(P_PID, static_cast<id_t>(child->pid), &state, WEXITED | WNOHANG | WNOWAIT) == 0 && state.si_pid == 0 &&
           std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    REQUIRE(state.si_pid == child->pid);

    const auto began = std::chrono::steady_clock::now();
    CHECK_NOTHROW(target.region->deregister());
    const double waited_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - began).count();
    MESSAGE("deregistration returned after " << waited_ms << " ms");
    CHECK(waited_ms < 1000);  // reclaimed, not the 2 s deadline
    CHECK(bytes_differing(target.window, kWriteBytes, 0) == 0);
    CHECK(child->wait(10) == 200 + SIGKILL);
}

namespace {

// What the pid-reuse scenario saw, sent from inside its PID namespace to the test.
struct PidReuseReport {
    char failed_step[96];            // empty when every step ran
    std::int32_t target_exit;        // ChildProcess::wait's code
    std::int32_t successor_pid;      // in the namespace; must equal target_pid
    std::int32_t target_pid;
    double successor_ready_ms;       // after the post
    std::uint64_t bytes_written;     // bytes of the target's range the successor saw change
    std::uint8_t status;             // mlx5::CompletionStatus of the write, 0xff: none
    std::uint64_t zero_hop_writes;
    std::int32_t successor_exit;
};

constexpr auto kPidReuseHold = std::chrono::milliseconds(3000);

// Runs as pid 1 of a PID namespace of its own, so no other process can take the target's pid
// between its death and the successor's fork: the only forks and threads in the namespace are
// this scenario's. Every step it cannot take ends it with the step named in the report.
PidReuseReport pid_reuse_scenario() {
    PidReuseReport report{};
    report.status = 0xff;
    auto failed = [&report](const char* step) {
        std::snprintf(report.failed_step, sizeof report.failed_step, "%s", step);
        return report;
    };
    // Inside the namespace, ns_last_pid is the namespace's own counter.
    const int last_pid = ::open("/proc/sys/kernel/ns_last_pid", O_RDWR | O_CLOEXEC);
    if (last_pid < 0) return failed("opening /proc/sys/kernel/ns_last_pid");
    // The target: serves one region until it is killed.
    auto target = ChildProcess::start("the target", [](int from_parent, int to_parent) {
        auto device = soft::Device::open();
        SoftEndpoint endpoint(device);
        const Address mine = endpoint.address();
        Address parent{};
        if (!write_all(to_parent, &mine, sizeof mine) || !read_all(from_parent, &parent, sizeof parent)) ::_exit(100);
        endpoint.connect(parent);
        if (!write_all(to_parent, "r", 1)) ::_exit(101);
        char never = 0;
        read_all(from_parent, &never, 1, 60);
        ::_exit(0);
    });
    auto device = soft::Device::open();
    EndpointOptions options;
    options.timeout = 18;  // 1.07 s per try: the lost connection is what ends the write, not the retries
    options.retry_cnt = 3;
    SoftEndpoint initiator(device, options);
    Address remote{};
    if (!read_all(target->from_child, &remote, sizeof remote)) return failed("reading the target's address");
    const Address mine = initiator.address();
    if (!write_all(target->to_child, &mine, sizeof mine)) return failed("sending the target our address");
    initiator.connect(remote);
    char ready = 0;
    if (!read_all(target->from_child, &ready, 1)) return failed("waiting for the target to connect");
    if (!settle_path(initiator, remote)) return failed("settling the path to the target");
    report.target_pid = target->pid;

    // The write: checked against the live target's table, then held before its move. A jthread,
    // so that every early return below still joins it.
    std::memset(initiator.buffer(), kPattern, kWriteBytes);
    soft::delay_zero_hop_writes(kPidReuseHold);
    const auto posted = std::chrono::steady_clock::now();
    std::optional<mlx5::Completion> completion;
    std::jthread writer([&] {
        const mlx5::ScatterGatherElement source = initiator.local(0, kWriteBytes);
        const mlx5::SendWorkRequest write = write_request(7, &source, remote.buffer_addr, remote.rkey);
        if (initiator.post(&write, 1) == mlx5::PostResult::ok) completion = initiator.wait_send(std::chrono::seconds(20));
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    // Meanwhile the target dies and is reaped, and its pid goes to a process that maps the very
    // pages the write is aimed at, writable and zeroed.
    if (::kill(target->pid, SIGKILL) != 0) return failed("killing the target");
    report.target_exit = target->wait(10);
    const std::uintptr_t page = remote.buffer_addr & ~std::uintptr_t{4095};
    const std::size_t span = ((remote.buffer_addr + kWriteBytes + 4095) & ~std::uint64_t{4095}) - page;
    const std::string previous = std::to_string(report.target_pid - 1);
    if (::pwrite(last_pid, previous.data(), previous.size(), 0) != static_cast<ssize_t>(previous.size())) {
        return failed("writing ns_last_pid");
    }
    ::close(last_pid);
    auto successor = ChildProcess::start("the successor", [page, span](int from_parent, int to_parent) {
        void* mapped = ::mmap(reinterpret_cast<void*>(page), span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
        if (mapped == MAP_FAILED) ::_exit(110);
        if (!write_all(to_parent, "m", 1)) ::_exit(111);
        char check = 0;
        if (!read_all(from_parent, &check, 1)) ::_exit(112);
        // Reports how many bytes of the target's range are no longer zero.
        const std::uint64_t written = bytes_differing(static_cast<const std::uint8_t*>(mapped), span, 0);
        if (!write_all(to_parent, &written, sizeof written)) ::_exit(113);
        ::_exit(0);
    });
    report.successor_pid = successor->pid;
    char mapped = 0;
    if (!read_all(successor->from_child, &mapped, 1)) return failed("waiting for the successor to map the pages");
    report.successor_ready_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - posted).count();

    writer.join();
    soft::delay_zero_hop_writes(std::chrono::microseconds(0));
    if (!write_all(successor->to_child, "c", 1)) return failed("asking the successor for its bytes");
    report.bytes_written = ~0ull;
    if (!read_all(successor->from_child, &report.bytes_written, sizeof report.bytes_written)) {
        return failed("reading the successor's bytes");
    }
    if (completion) report.status = static_cast<std::uint8_t>(completion->status);
    report.zero_hop_writes = device->zero_hop_writes();
    report.successor_exit = successor->wait(10);
    return report;
}

}  // namespace

// Root only (CAP_SYS_ADMIN): the case runs in a PID namespace of its own, where ns_last_pid
// steers the pid the next fork gets, as CRIU does; where the namespace is refused it says so and
// checks nothing.
TEST_CASE("a zero-hop write whose target exited never lands in the process that got the target's pid") {
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "1");
    auto holder = ChildProcess::start("the pid namespace's parent", [](int, int to_parent) {
        if (::unshare(CLONE_NEWPID) != 0) ::_exit(90);
        const pid_t init = ::fork();  // pid 1 of the new namespace
        if (init < 0) ::_exit(91);
        if (init == 0) {
            PidReuseReport report{};
            try {
                report = pid_reuse_scenario();
            } catch (const std::exception& error) {
                std::snprintf(report.failed_step, sizeof report.failed_step, "threw: %s", error.what());
            } catch (...) {
                std::snprintf(report.failed_step, sizeof report.failed_step, "threw");
            }
            ::_exit(write_all(to_parent, &report, sizeof report) ? 0 : 92);
        }
        int status = 0;
        if (::waitpid(init, &status, 0) != init) ::_exit(93);
        ::_exit(WIFEXITED(status) ? WEXITSTATUS(status) : 200 + WTERMSIG(status));
    });
    PidReuseReport report{};
    const bool reported = read_all(holder->from_child, &report, sizeof report, 90);
    const int holder_exit = holder->wait(10);
    if (!reported && holder_exit == 90) {
        MESSAGE("not run: unshare(CLONE_NEWPID) is refused here (needs root)");
        return;
    }
    REQUIRE_MESSAGE(reported, "the scenario sent no report; its namespace's parent " << ChildProcess::describe(holder_exit));
    CHECK(holder_exit == 0);
    REQUIRE_MESSAGE(report.failed_step[0] == '\0', "the scenario stopped at: " << report.failed_step);
    CHECK(report.target_exit == ChildProcess::ended_by(SIGKILL));
    REQUIRE(report.successor_pid == report.target_pid);
    MESSAGE("process " << report.successor_pid << " has had the target's pid and its pages since " << report.successor_ready_ms
                       << " ms after the post");
    // The case means something only if the successor was in place before the write moved.
    REQUIRE(report.successor_ready_ms < static_cast<double>((kPidReuseHold - std::chrono::milliseconds(500)).count()));
    CHECK(report.bytes_written == 0);
    CHECK(report.status == static_cast<std::uint8_t>(mlx5::CompletionStatus::transport_retry_exceeded));
    CHECK(report.zero_hop_writes == 0);
    CHECK(report.successor_exit == 0);
}
