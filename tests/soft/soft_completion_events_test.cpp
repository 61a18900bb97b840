// Completion events on the software device (completion_ring.hpp): a CQ armed through its arm
// doorbell record and ring_arm_doorbell() makes its eventfd readable once, for the next CQE or,
// armed for solicited ones, for a solicited or error CQE, whichever writer wrote it: the device's
// progress thread (request path), the thread that rang the doorbell (zero-hop), or a same-host peer
// completing a receive into it. An arm with a CQE already past its consumer index raises the
// event at once. The arm/complete race is run a million times at the ring level, where it is.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "tests/sanitizer_build.hpp"
#include "tests/soft/device_pair.hpp"
#include "tests/thread_handoff.hpp"
#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/soft/completion_ring.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::DevicePair;
using rdmachan::test::DevicePairSettings;
using rdmachan::test::Handoff;
using rdmachan::test::send_request;
using rdmachan::test::settle_path;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

// What the mlx5 data path's arm writes (libmlx5's mlx5_arm_cq): sequence, command, the consumer
// index the poller last wrote; then the device is told, as the NIC sees the CQ doorbell.
void arm(soft::CompletionQueue& queue, bool solicited_only, std::uint32_t sequence = 0) {
    const mlx5::CompletionQueueRing& ring = queue.ring();
    const std::uint32_t consumer = mlx5::big_to_host32(mlx5::load_acquire32(ring.doorbell_record + mlx5::kCqSetConsumerIndex)) & 0xffffff;
    const std::uint32_t word = (sequence & 3) << 28 | (solicited_only ? 1u << 24 : 0u) | consumer;
    mlx5::store_release32(ring.doorbell_record + mlx5::kCqArm, mlx5::host_to_big32(word));
    queue.ring_arm_doorbell();
}

// The op_own byte of the CQE the last poll took (a poll leaves the entry as it was written).
std::uint8_t last_polled_op_own(soft::CompletionQueue& queue) {
    const mlx5::CompletionQueueRing& ring = queue.ring();
    const std::uint32_t consumer = mlx5::big_to_host32(mlx5::load_acquire32(ring.doorbell_record + mlx5::kCqSetConsumerIndex)) & 0xffffff;
    const std::uint8_t* entry = ring.buffer + static_cast<std::size_t>((consumer - 1) & (ring.cqe_count - 1)) * ring.cqe_size;
    return entry[ring.cqe_size - mlx5::kCqeSize64 + mlx5::kCqeOpOwn];
}

bool readable(int descriptor, std::chrono::milliseconds timeout) {
    pollfd entry{descriptor, POLLIN, 0};
    return ::poll(&entry, 1, static_cast<int>(timeout.count())) == 1 && (entry.revents & POLLIN) != 0;
}

constexpr auto kLong = std::chrono::seconds(10);
constexpr auto kShort = std::chrono::milliseconds(0);

DevicePairSettings pair_settings(const char* transport, const char* zero_hop) {
    DevicePairSettings settings;
    settings.transport = transport;
    settings.zero_hop = zero_hop;
    settings.target.allocated = true;
    settings.initiator.allocated = true;
    return settings;
}

// One pair per path a CQE can be written on.
struct Path {
    const char* name;
    const char* transport;
    const char* zero_hop;
};
const Path kPaths[] = {
    {"same host, zero-hop (the initiator's thread writes the target's CQE)", "auto", "1"},
    {"same host, request path (the target's device writes it)", "shm", "0"},
    {"TCP (the target's progress thread writes it)", "tcp", "0"},
};

void send_one(SoftEndpoint& initiator, std::uint64_t wr_id, std::uint32_t flags) {
    const mlx5::ScatterGatherElement element = initiator.local(0, 64);
    mlx5::SendWorkRequest request = send_request(wr_id, &element, 1, mlx5::SendOpcode::send, flags | mlx5::kSendSignaled);
    REQUIRE(initiator.post(&request, 1) == mlx5::PostResult::ok);
    const auto sent = initiator.wait_send();
    REQUIRE(sent.has_value());
    REQUIRE(sent->status == mlx5::CompletionStatus::success);
}

// A CQ ring driven directly: the device's side (CompletionRingView) writing requester CQEs,
// the data path's poller consuming them, and the CQ's eventfd.
struct RaceRing {
    explicit RaceRing(std::uint32_t entries_count)
        : entries(entries_count * 64),
          ring{entries.data(), entries_count, 64, doorbell, descriptor},
          consumer_ring{entries.data(), entries_count, 64, 0, doorbell, nullptr} {
        for (std::uint32_t i = 0; i < entries_count; ++i) entries[i * 64 + 63] = mlx5::kCqeInvalid << 4;
        REQUIRE(descriptor >= 0);
    }
    ~RaceRing() { ::close(descriptor); }
    RaceRing(const RaceRing&) = delete;
    RaceRing& operator=(const RaceRing&) = delete;

    // A CQE of an RDMA write with WQE counter `index`, its body written, not yet visible.
    std::uint8_t* claim(std::uint16_t index) const {
        std::uint8_t* cqe = ring.claim();
        mlx5::store_big32(cqe + mlx5::kCqeSopDropQpn, static_cast<std::uint32_t>(mlx5::kOpcodeRdmaWrite) << 24 | 1);
        mlx5::store_big16(cqe + mlx5::kCqeWqeCounter, index);
        return cqe;
    }
    bool poll_one() {
        mlx5::Completion completion;
        return queue.poll(&completion, 1, [this](std::uint32_t, std::uint32_t) { return &target; }) == 1;
    }
    // What the data path's arm writes for CQEs past `consumed`, and the device taking it.
    void arm(std::uint32_t consumed, std::uint32_t sequence = 0) {
        const std::uint32_t word = (sequence & 3) << 28 | (consumed & 0xffffff);
        mlx5::store_release32(doorbell + mlx5::kCqArm, mlx5::host_to_big32(word));
        ring.take_arm(false, consumed & 0xffffff);
    }

    std::vector<std::uint8_t> entries;
    alignas(64) std::uint32_t doorbell[16] = {};
    const int descriptor = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    const soft::CompletionRingView ring;
    const mlx5::CompletionQueueRing consumer_ring;
    std::vector<std::uint64_t> wr_ids = std::vector<std::uint64_t>(1, 0);
    std::vector<std::uint32_t> wqe_ends = std::vector<std::uint32_t>(1, 0);
    mlx5::SendQueueTracking tracking{wr_ids.data(), wqe_ends.data(), 0, 0, nullptr};
    mlx5::CompletionTarget target{&tracking, 1, nullptr, nullptr};
    mlx5::CompletionQueue queue{consumer_ring};
};

// Ends the race's writer however the consumer's side ends (a failed REQUIRE throws).
struct StopAndJoin {
    std::atomic<bool>& stop;
    std::thread& thread;
    ~StopAndJoin() {
        stop.store(true, std::memory_order_relaxed);
        if (thread.joinable()) thread.join();
    }
};

}  // namespace

TEST_CASE("an armed receive CQ raises one event for the next CQE, on every path") {
    for (const Path& path : kPaths) {
        const std::string name = path.name;
        CAPTURE(name);
        DevicePair pair(pair_settings(path.transport, path.zero_hop));
        REQUIRE(settle_path(pair.initiator, pair.remote));
        soft::CompletionQueue& queue = pair.target.receive_cq();
        const int descriptor = queue.event_descriptor();
        REQUIRE(descriptor >= 0);
        for (std::uint32_t round = 0; round < 6; ++round) {
            CAPTURE(round);
            REQUIRE(pair.target.post_receive(round, 4096, 64) == mlx5::PostResult::ok);
            CHECK_FALSE(readable(descriptor, kShort));
            arm(queue, false, round);
            CHECK_FALSE(readable(descriptor, kShort));  // armed, nothing written yet
            send_one(pair.initiator, round, 0);
            CHECK(readable(descriptor, kLong));
            CHECK(queue.take_event());
            CHECK_FALSE(queue.take_event());  // one arm, one event
            const auto received = pair.target.wait_receive();
            REQUIRE(received.has_value());
            CHECK(received->wr_id == round);
        }
        // Not armed: a CQE raises nothing.
        REQUIRE(pair.target.post_receive(99, 4096, 64) == mlx5::PostResult::ok);
        send_one(pair.initiator, 99, 0);
        REQUIRE(pair.target.wait_receive().has_value());
        CHECK_FALSE(readable(descriptor, kShort));
    }
}

TEST_CASE("an arm with a CQE already past its consumer index raises the event at once") {
    DevicePair pair(pair_settings("auto", "1"));
    REQUIRE(settle_path(pair.initiator, pair.remote));
    soft::CompletionQueue& queue = pair.target.receive_cq();
    REQUIRE(pair.target.post_receive(1, 4096, 64) == mlx5::PostResult::ok);
    send_one(pair.initiator, 1, 0);
    // The CQE is there (the sender's completion came after it), not yet polled.
    CHECK_FALSE(readable(queue.event_descriptor(), kShort));
    arm(queue, false);
    CHECK(readable(queue.event_descriptor(), kShort));
    CHECK(queue.take_event());
    REQUIRE(pair.target.wait_receive().has_value());
    // Polled: the consumer index moved past it, and a new arm waits for the next one.
    arm(queue, false, 1);
    CHECK_FALSE(readable(queue.event_descriptor(), kShort));
}

TEST_CASE("armed for solicited CQEs: a send without the solicited bit raises nothing, one with it does, an error does") {
    for (const Path& path : kPaths) {
        const std::string name = path.name;
        CAPTURE(name);
        DevicePair pair(pair_settings(path.transport, path.zero_hop));
        REQUIRE(settle_path(pair.initiator, pair.remote));
        soft::CompletionQueue& queue = pair.target.receive_cq();
        REQUIRE(pair.target.post_receive(1, 4096, 64) == mlx5::PostResult::ok);
        REQUIRE(pair.target.post_receive(2, 8192, 64) == mlx5::PostResult::ok);
        arm(queue, true);
        send_one(pair.initiator, 1, 0);
        REQUIRE(pair.target.wait_receive().has_value());
        CHECK_FALSE(readable(queue.event_descriptor(), kShort));
        CHECK((last_polled_op_own(queue) & mlx5::kCqeSolicitedEvent) == 0);
        // Still armed: the solicited one wakes it, though an unsolicited CQE came first.
        send_one(pair.initiator, 2, mlx5::kSendSolicited);
        CHECK(readable(queue.event_descriptor(), kLong));
        CHECK(queue.take_event());
        REQUIRE(pair.target.wait_receive().has_value());
        // Its CQE carries the SE bit, as a ConnectX writes it.
        CHECK((last_polled_op_own(queue) & mlx5::kCqeSolicitedEvent) != 0);

        // An arm for solicited CQEs with only an unsolicited one waiting past its index: nothing.
        REQUIRE(pair.target.post_receive(3, 4096, 64) == mlx5::PostResult::ok);
        send_one(pair.initiator, 3, 0);
        arm(queue, true, 1);
        CHECK_FALSE(readable(queue.event_descriptor(), kShort));
        REQUIRE(pair.target.wait_receive().has_value());

        // The initiator's send CQ, armed for solicited CQEs: a successful write raises nothing,
        // a write with a bad key completes in error and raises the event.
        soft::CompletionQueue& send_queue = pair.initiator.send_cq();
        arm(send_queue, true);
        const mlx5::ScatterGatherElement element = pair.initiator.local(0, 64);
        REQUIRE(rdmachan::test::run_signaled(pair.initiator, write_request(10, &element, pair.remote.buffer_addr, pair.remote.rkey)).status ==
                mlx5::CompletionStatus::success);
        CHECK_FALSE(readable(send_queue.event_descriptor(), kShort));
        mlx5::SendWorkRequest bad = write_request(11, &element, pair.remote.buffer_addr, pair.remote.rkey ^ 0x5a00);
        REQUIRE(pair.initiator.post(&bad, 1) == mlx5::PostResult::ok);
        const auto failed = pair.initiator.wait_send();
        REQUIRE(failed.has_value());
        CHECK(failed->status != mlx5::CompletionStatus::success);
        CHECK(readable(send_queue.event_descriptor(), kLong));
        CHECK(send_queue.take_event());
    }
}

TEST_CASE("a CQE's event goes only to an arm that covers it: a late raise for a CQE consumed before the arm wakes nobody") {
    // The writer of CQE 0 is paused between making it visible and looking at the arm; the
    // consumer polls CQE 0 meanwhile and arms for the next. A NIC raises an event only for a CQE
    // at or past the arm's consumer index, so CQE 0's late look must not wake that arm: the event
    // belongs to CQE 1.
    RaceRing race(16);
    const auto write_cqe = [&](std::uint16_t index) {
        race.ring.make_visible(race.claim(index), mlx5::kCqeRequester);
        race.ring.advance();
    };

    write_cqe(0);  // visible, its event not yet looked at
    REQUIRE(race.poll_one());
    race.arm(1);
    CHECK_FALSE(readable(race.descriptor, kShort));  // nothing past the arm's consumer index yet
    race.ring.raise_event(mlx5::kCqeRequester, false);  // CQE 0's late look at the arm
    CHECK_FALSE(readable(race.descriptor, kShort));
    write_cqe(1);
    race.ring.raise_event(mlx5::kCqeRequester, false);
    CHECK(readable(race.descriptor, kShort));  // the arm was kept for CQE 1
    std::uint64_t raised = 0;
    REQUIRE(::read(race.descriptor, &raised, sizeof raised) == sizeof raised);
    CHECK(raised == 1);
}

TEST_CASE("a writer that judged an arm it was late for clears nothing: the consumer armed again meanwhile") {
    // A writer judged the consumer's arm for its CQE 0 and paused before taking it; another
    // writer's CQE 1 raised that arm; the consumer woke, took both CQEs and armed for the next.
    // The first writer's late take must leave the new arm alone: an arm word names its consumer
    // index, so the word judged is not the word there now (a word of the kind alone was: the late
    // take cleared the new arm and woke the consumer with no CQE for it).
    RaceRing race(16);
    race.arm(0);
    race.ring.make_visible(race.claim(0), mlx5::kCqeRequester);
    race.ring.advance();
    const std::uint32_t judged = race.ring.arm_it_covers(mlx5::kCqeRequester, false);
    REQUIRE(judged != 0);  // CQE 0 is at the arm's index: it would raise it
    race.ring.publish(race.claim(1), mlx5::kCqeRequester, false);
    REQUIRE(readable(race.descriptor, kShort));
    std::uint64_t raised = 0;
    REQUIRE(::read(race.descriptor, &raised, sizeof raised) == sizeof raised);
    REQUIRE(race.poll_one());
    REQUIRE(race.poll_one());
    race.arm(2, 1);
    race.ring.raise_for(judged);  // the first writer's late take
    CHECK_FALSE(readable(race.descriptor, kShort));
    race.ring.publish(race.claim(2), mlx5::kCqeRequester, false);
    CHECK(readable(race.descriptor, kShort));  // the arm was kept for CQE 2
}

// The race itself, where it is decided: a writer publishing CQEs as the device does, one at a
// time, each only once the consumer took the one before, so that it lands while the consumer
// finds the ring empty, arms, and sleeps on the descriptor. A lost wake-up leaves the consumer
// asleep with the CQE in the ring and the writer waiting for it: the wait's deadline catches it.
// Every fourth CQE is placed in the window on purpose, whatever the threads' speeds: the writer
// waits until the consumer found the ring empty and publishes it, and the consumer arms only once
// it is published, so that CQE is always there before the arm, which must then raise the event
// itself. (How often a CQE left to the threads' speeds beat the arm depends on the scheduler:
// 5% of them in a loaded CI run under ASan, against the 10% an earlier check wanted.)

TEST_CASE("a million arm/complete races on the ring: no lost wake-up, one event per arm") {
    const std::uint32_t total = rdmachan::test::kSanitizerBuild ? 100'000 : 1'000'000;
    RaceRing race(256);

    Handoff taken(0);
    Handoff found_empty(0);       // 1 + the CQEs consumed when the consumer last found none
    Handoff placed_published(0);  // 1 + the index of the last placed CQE published
    std::atomic<bool> stop{false};
    std::atomic<bool> writer_gave_up{false};
    const auto placed = [](std::uint32_t index) { return index % 4 == 0; };
    // The writer's waits outlast the consumer's (10 s), so that a stall is reported by the consumer.
    const auto writer_deadline = [] { return Handoff::Clock::now() + std::chrono::seconds(30); };
    std::thread writer([&] {
        std::uint32_t jitter = 1;
        for (std::uint32_t written = 0; written < total; ++written) {
            const bool ready =
                taken.wait([written](std::uint32_t seen) { return seen >= written; }, stop, writer_deadline()) &&
                (!placed(written) ||
                 found_empty.wait([written](std::uint32_t seen) { return seen == written + 1; }, stop, writer_deadline()));
            if (!ready) {
                writer_gave_up = !stop.load();
                return;
            }
            // A varying delay spreads the CQE over the consumer's poll, arm and sleep, whose
            // lengths differ between builds (sanitizers slow the consumer several times).
            jitter = jitter * 1103515245u + 12345u;
            for (std::uint32_t delay = placed(written) ? 0 : (jitter >> 16) % 256; delay != 0; --delay) {
                __atomic_signal_fence(__ATOMIC_SEQ_CST);
            }
            race.ring.publish(race.claim(static_cast<std::uint16_t>(written)), mlx5::kCqeRequester, false);
            if (placed(written)) placed_published.store(written + 1);
        }
    });
    const StopAndJoin ends_writer{stop, writer};

    std::uint32_t consumed = 0;
    std::uint64_t arms = 0;
    std::uint64_t raised_at_arm = 0;
    std::uint64_t placed_arms = 0;
    std::uint64_t placed_raised_at_arm = 0;
    while (consumed < total) {
        if (race.poll_one()) {
            taken.store(++consumed);
            continue;
        }
        const bool in_window = placed(consumed);
        if (in_window) {
            found_empty.store(consumed + 1);
            const std::uint32_t wanted = consumed + 1;
            if (!placed_published.wait([wanted](std::uint32_t seen) { return seen == wanted; }, stop,
                                       Handoff::Clock::now() + std::chrono::seconds(10)))
                FAIL("the writer did not publish placed CQE " << consumed << " within 10 s"
                                                              << std::string(writer_gave_up ? " (it gave up waiting)" : ""));
        }
        // Arm for CQEs past what was consumed, then sleep until the event.
        race.arm(consumed, static_cast<std::uint32_t>(arms));
        ++arms;
        const bool raised_at_once = readable(race.descriptor, kShort);
        raised_at_arm += raised_at_once ? 1 : 0;
        if (in_window) {
            ++placed_arms;
            placed_raised_at_arm += raised_at_once ? 1 : 0;
        }
        if (!readable(race.descriptor, std::chrono::seconds(10)))
            FAIL("lost wake-up: asleep for 10 s with " << consumed << " of " << total << " CQEs consumed, the next one written"
                                                       << std::string(writer_gave_up ? " (the writer gave up waiting)" : ""));
        std::uint64_t raised = 0;
        REQUIRE(::read(race.descriptor, &raised, sizeof raised) == sizeof raised);
        REQUIRE(raised == 1);  // one event per arm
    }
    MESSAGE(total << " CQEs, " << arms << " arms, " << raised_at_arm << " of them raised at once by a CQE already there; of the "
                  << placed_arms << " arms with a CQE placed between the poll and the arm, " << placed_raised_at_arm
                  << " raised at once");
    CHECK(arms > total / 2);                           // the consumer slept for most CQEs: the race was run
    CHECK(placed_arms == total / 4);                   // every placed CQE met an empty ring and an arm
    CHECK(placed_raised_at_arm == placed_arms);        // and, there before the arm, raised it at once
}
