// Completion events on the generic verbs path, against the kernel's soft-RoCE inside the VM
// (tests/vm): a verbs CQ with a completion channel (armed with ibv_req_notify_cq and one poll,
// events taken with ibv_get_cq_event on a non-blocking descriptor, acknowledged in batches), and
// a Channel in event wait mode between two processes, rxe0 in this one and rxe1 in a forked one,
// through its waits and Channel::native_handle and arm. Not runnable outside the VM.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <thread>

#include "rdmachan/channel.hpp"
#include "rxe_fixture.hpp"
#include "tests/channel/process_pair_settings.hpp"
#include "tests/watchdog.hpp"

using namespace rxe_test;

namespace {

bool readable(int descriptor, int timeout_ms) {
    pollfd entry{descriptor, POLLIN, 0};
    return ::poll(&entry, 1, timeout_ms) == 1 && (entry.revents & POLLIN) != 0;
}

// A signaled 13-byte send from a into a receive b posted at `offset`, both tagged `wr_id`; returns
// once a's send completed. b's completion is not polled.
void exchange(Side& a, Side& b, std::size_t offset, std::uint64_t wr_id) {
    post_one_receive(b, offset, 64, wr_id);
    const mlx5::ScatterGatherElement element{a.address(), 13, a.memory_region->lkey()};
    mlx5::SendWorkRequest send;
    send.wr_id = wr_id;
    send.opcode = mlx5::SendOpcode::send;
    send.flags = mlx5::kSendSignaled;
    send.sg_list = &element;
    send.num_sge = 1;
    post_one_send(a, send);
    REQUIRE(wait_for_completion(*a.completion_queue).status == mlx5::CompletionStatus::success);
}

struct Topology {
    const char* name;
    bool cross;
};

}  // namespace

TEST_CASE("a verbs CQ with a completion channel on soft-RoCE: armed, it wakes at the next completion; one already there is kept") {
    // More rounds than one acknowledgement batch: a batch is acknowledged, the rest at destruction.
    constexpr std::uint64_t kRounds = CompletionQueue::kAcknowledgeBatch + 8;
    const rdmachan::test::Watchdog watchdog(std::chrono::seconds(120), "the verbs completion-event case");
    const Topology topologies[] = {{"rxe0 <-> rxe1 across the veth pair", true}, {"rxe0 loopback", false}};
    for (const Topology& topology : topologies) {
        CAPTURE(topology.name);
        Side a, b;
        SideOptions options;
        options.with_completion_channel = true;
        make_pair(topology.cross, a, b, options);
        CompletionQueue& queue = *b.completion_queue;
        const int descriptor = queue.event_descriptor();
        REQUIRE(descriptor >= 0);
        CHECK(a.completion_queue->event_descriptor() != descriptor);  // a channel per CQ
        // Nothing queued: take_event reads nothing, and returns at once (non-blocking).
        CHECK_FALSE(queue.take_event());

        // Armed on an empty CQ: readable at the next completion, not before; one event per arm.
        for (std::uint64_t round = 0; round < kRounds; ++round) {
            CAPTURE(round);
            REQUIRE(queue.arm());
            CHECK_FALSE(readable(descriptor, 0));
            exchange(a, b, 0, 600 + round);
            REQUIRE(readable(descriptor, 10000));
            CHECK(queue.take_event());
            CHECK_FALSE(queue.take_event());
            CHECK_FALSE(readable(descriptor, 0));
            CHECK(wait_for_completion(queue).wr_id == 600 + round);
        }

        // Not armed: a completion raises no event.
        exchange(a, b, 0, 700);
        CHECK(wait_for_completion(queue).wr_id == 700);
        CHECK_FALSE(readable(descriptor, 0));

        // A completion already in the CQ when it is armed raises no event on soft-RoCE (the
        // kernel's rxe_req_notify_cq reports one only for IB_CQ_REPORT_MISSED_EVENTS, which
        // uverbs never asks for): arm() is false and keeps it for the next poll. rxe writes the
        // receive's CQE before it acknowledges the send, so it is there once a's send completed;
        // should it come later, the arm was true and its event comes: take it and arm again.
        exchange(a, b, 0, 701);
        bool kept = false;
        for (int attempt = 0; attempt < 50 && !kept; ++attempt) {
            kept = !queue.arm();
            if (!kept) {
                (void)readable(descriptor, 100);
                (void)queue.take_event();
            }
        }
        REQUIRE(kept);
        CHECK_FALSE(readable(descriptor, 100));
        mlx5::Completion completions[4];
        REQUIRE(queue.poll(completions) == 1);  // the kept one, and nothing else
        CHECK(completions[0].wr_id == 701);
        CHECK(completions[0].status == mlx5::CompletionStatus::success);
        CHECK(completions[0].is_receive);
        // The request made by that arm() stands: the next completion raises the event.
        exchange(a, b, 0, 702);
        CHECK(readable(descriptor, 10000));
        CHECK(wait_for_completion(queue).wr_id == 702);
        // An event left unread when the CQ is destroyed: the kernel drops it; the events read
        // and not yet acknowledged are acknowledged by the destructor, so destruction returns.
    }
}

namespace {

const char* const kToken = "verbs-rxe-events-test";
constexpr std::size_t kMemory = 64 * 1024;
constexpr std::uint32_t kMessage = 64;

// What the parent asks of the child: 's' send kMessage bytes after `delay_ms`; 'r' receive
// kMessage bytes (a wait in event mode); 'q' end. The child answers each with 1 (done) or 0.
struct Command {
    char what = 'q';
    std::uint32_t delay_ms = 0;
};

int child(int port_pipe, int command_pipe, int answer_pipe) try {
    rdmachan::PreparedChannel prepared = rdmachan::ChannelBuilder()
                                             .device(second_device())
                                             .deadline(std::chrono::seconds(20))
                                             .wait_mode(rdmachan::WaitMode::event)
                                             .build();
    rdmachan::MemoryRegion region = prepared.allocate_memory(kMemory);
    rdmachan::Channel channel = std::move(prepared).connect(rdmachan::test::listening_settings(kToken, port_pipe));
    if (channel.native_handle() < 0) {
        std::fprintf(stderr, "child: no completion events on %s\n", second_device().c_str());
        return 1;
    }
    Command command;
    while (read(command_pipe, &command, sizeof command) == static_cast<ssize_t>(sizeof command)) {
        if (command.what == 'q') return 0;
        std::this_thread::sleep_for(std::chrono::milliseconds(command.delay_ms));
        const rdmachan::WorkResult result = command.what == 's' ? channel.send(region.slice(0, kMessage))
                                                                : channel.receive(region.slice(0, kMessage));
        if (!result.ok()) std::fprintf(stderr, "child: %c failed: %s\n", command.what, result.error().message().c_str());
        const char answer = result.ok() ? 1 : 0;
        if (write(answer_pipe, &answer, 1) != 1) return 1;
    }
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "child: %s\n", error.what());
    return 2;
}

// This process on rxe0, the child on rxe1, both waiting in event mode.
class ProcessPair {
public:
    ProcessPair() {
        // A child that ended early closes its command pipe: a write then fails instead of killing us.
        std::signal(SIGPIPE, SIG_IGN);
        int port_pipe[2], command_pipe[2], answer_pipe[2];
        REQUIRE(pipe(port_pipe) == 0);
        REQUIRE(pipe(command_pipe) == 0);
        REQUIRE(pipe(answer_pipe) == 0);
        pid_ = fork();
        REQUIRE(pid_ >= 0);
        if (pid_ == 0) {
            close(port_pipe[0]);
            close(command_pipe[1]);
            close(answer_pipe[0]);
            std::_Exit(child(port_pipe[1], command_pipe[0], answer_pipe[1]));
        }
        close(port_pipe[1]);
        close(command_pipe[0]);
        close(answer_pipe[1]);
        command_ = command_pipe[1];
        answer_ = answer_pipe[0];
        std::uint16_t port = 0;
        REQUIRE(read(port_pipe[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
        close(port_pipe[0]);
        rdmachan::PreparedChannel prepared = rdmachan::ChannelBuilder()
                                                 .device(first_device())
                                                 .deadline(std::chrono::seconds(20))
                                                 .wait_mode(rdmachan::WaitMode::event)
                                                 .build();
        region_ = prepared.allocate_memory(kMemory);
        channel_.emplace(std::move(prepared).connect(rdmachan::test::connecting_settings(kToken, port)));
    }
    ~ProcessPair() {
        command({'q', 0});
        close(command_);
        close(answer_);
        channel_.reset();
        int status = 0;
        waitpid(pid_, &status, 0);
    }
    void command(Command what) { (void)!write(command_, &what, sizeof what); }
    bool answer() {
        char done = 0;
        return read(answer_, &done, 1) == 1 && done == 1;
    }
    rdmachan::Channel& channel() { return *channel_; }
    rdmachan::MemoryRegion& region() { return region_; }

private:
    pid_t pid_ = -1;
    int command_ = -1;
    int answer_ = -1;
    rdmachan::MemoryRegion region_;
    std::optional<rdmachan::Channel> channel_;
};

long voluntary_switches() {
    rusage usage{};
    getrusage(RUSAGE_THREAD, &usage);
    return usage.ru_nvcsw;
}

}  // namespace

TEST_CASE("a Channel in event wait mode between two processes on soft-RoCE: waits sleep on the completion channel; native_handle wakes after arm") {
    const rdmachan::test::Watchdog watchdog(std::chrono::seconds(120), "the Channel event-mode case");
    ProcessPair pair;
    rdmachan::Channel& channel = pair.channel();
    const int descriptor = channel.native_handle();
    REQUIRE(descriptor >= 0);

    // A receive waited for while the peer sends 300 ms later: the waiting thread sleeps on the
    // event (a few voluntary context switches), where polling with sleeps makes thousands.
    rdmachan::PendingWork receive = channel.post_receive(pair.region().slice(0, kMessage));
    pair.command({'s', 300});
    const long before = voluntary_switches();
    const rdmachan::WorkResult received = receive.wait();
    const long switches = voluntary_switches() - before;
    REQUIRE(received.ok());
    CHECK(received.completion().bytes == kMessage);
    CHECK(pair.answer());
    MESSAGE("event mode over soft-RoCE: " << switches << " voluntary context switches while waiting 300 ms");
    CHECK(switches < 50);

    // The other way: the child's receive waits in event mode for this send.
    pair.command({'r', 0});
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    REQUIRE(channel.send(pair.region().slice(0, kMessage)).ok());
    CHECK(pair.answer());

    // As an event loop uses it: readable at the next completion after arm(), not before.
    rdmachan::PendingWork first = channel.post_receive(pair.region().slice(0, kMessage));
    REQUIRE(channel.arm());
    CHECK_FALSE(readable(descriptor, 0));
    pair.command({'s', 0});
    CHECK(readable(descriptor, 10000));
    REQUIRE(first.wait().ok());
    CHECK(pair.answer());
    REQUIRE(channel.arm());  // takes the old event: nothing to read until the next completion
    CHECK_FALSE(readable(descriptor, 0));

    // A completion waiting unpolled: arm() says so (the verbs CQ's poll after its request found
    // it, and keeps it), and the next poll returns it.
    rdmachan::PendingWork second = channel.post_receive(pair.region().slice(kMessage, kMessage));
    pair.command({'s', 0});
    CHECK(readable(descriptor, 10000));
    CHECK(pair.answer());
    CHECK_FALSE(channel.arm());
    const std::optional<rdmachan::WorkResult> taken = second.poll();
    REQUIRE(taken.has_value());
    CHECK(taken->ok());
    REQUIRE(channel.arm());
    CHECK_FALSE(readable(descriptor, 0));
    CHECK(channel.healthy());
}
