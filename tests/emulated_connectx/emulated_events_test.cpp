// Completion events on the emulated ConnectX, as the project's ConnectX code takes them: the mlx5
// data path's arm (arm word in the CQ doorbell record, then the CQ doorbell register on cq_uar),
// the emulator's poller that sees the register write, the channel's epoll set, ibv_get_cq_event.
//
// The stress case runs the arm/complete race a million times (fewer in sanitizer builds) through
// the transport interface the engine uses: 16 loopback RC lanes, each with a consumer thread that
// polls its receive CQ, arms it and sleeps on its channel, and one writer that sends on every lane
// once the lane's consumer took the previous message, so that each CQE lands while its consumer
// polls, arms or sleeps. A lost wake-up leaves a consumer asleep with the CQE in its ring and the
// writer waiting: the sleep's 10 s deadline fails, naming the lane and the iteration.
//
// Linked ahead of libibverbs (link-time interposition), as the refusal test, so that it can read
// the emulator's arm counts.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <infiniband/verbs.h>
#include <poll.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/emulated_connectx/emulated_connectx.hpp"
#include "tests/sanitizer_build.hpp"
#include "tests/thread_handoff.hpp"
#include "transport/device_interface.hpp"
#include "transport/mlx5/completion_queue.hpp"
#include "transport/verbs/completion_queue.hpp"
#include "transport/verbs/context.hpp"
#include "transport/verbs/mlx5_binding.hpp"

namespace emulated = rdmachan::emulated;
namespace mlx5 = rdmachan::mlx5;
namespace transport = rdmachan::transport;
namespace verbs = rdmachan::verbs;

namespace {

bool readable(int descriptor, int timeout_ms) {
    pollfd entry{descriptor, POLLIN, 0};
    return ::poll(&entry, 1, timeout_ms) == 1 && (entry.revents & POLLIN) != 0;
}

// Waits until the emulator's pollers have taken `count` arm doorbells in all.
bool arms_seen_reach(std::uint64_t count) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (emulated::arm_doorbell_counts().seen < count) {
        if (std::chrono::steady_clock::now() > until) return false;
        std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    return true;
}

constexpr std::uint32_t kMessage = 8;
constexpr std::uint32_t kReceives = 16;  // posted per lane, one re-posted per message taken

// One loopback RC connection: the writer sends on `initiator`, the lane's consumer receives on
// `target`, whose receive CQ has the completion channel under test.
struct Lane {
    std::shared_ptr<transport::CompletionQueue> events;
    std::shared_ptr<transport::QueuePair> initiator;
    std::shared_ptr<transport::QueuePair> target;
    transport::Registration memory;
    rdmachan::test::Handoff taken{0};  // the writer waits on it (tests/thread_handoff.hpp says why)
    // The consumer's counts.
    std::uint64_t sleeps = 0;
    std::uint64_t arm_refused = 0;     // arm() false: a CQE landed between the poll and the arm
    std::uint64_t raised_at_once = 0;  // readable at the first look after arm(): before the sleep
    std::string failure;
};

void connect(transport::QueuePair& from, transport::QueuePair& to,
             const transport::PortIdentity& port) {
    transport::ConnectSettings settings;
    settings.remote_gid = port.gid;
    settings.remote_lid = port.lid;
    settings.remote_qpn = to.qpn();
    settings.path_mtu = port.active_mtu;
    settings.source_gid_index = port.gid_index;
    from.connect(settings);
}

mlx5::ScatterGatherElement element(const transport::Registration& memory, std::uint32_t offset) {
    return {reinterpret_cast<std::uint64_t>(memory.data) + offset, kMessage, memory.lkey};
}

bool post_receive(Lane& lane, std::uint64_t wr_id) {
    const mlx5::ScatterGatherElement where = element(lane.memory, 0);
    mlx5::ReceiveWorkRequest request;
    request.wr_id = wr_id;
    request.sg_list = &where;
    request.num_sge = 1;
    std::uint32_t posted = 0;
    return lane.target->post_receive(&request, 1, &posted) == mlx5::PostResult::ok && posted == 1;
}

// Polls, arms, sleeps, as the engine's blocking wait does, until `total` messages were taken.
void consume(Lane& lane, std::uint32_t lane_index, std::uint32_t total, std::atomic<bool>& failed) {
    const int descriptor = lane.events->event_descriptor();
    std::array<mlx5::Completion, 8> completions;
    std::uint32_t consumed = 0;
    std::uint32_t jitter = lane_index + 1;
    while (consumed < total && !failed.load(std::memory_order_relaxed)) {
        const std::uint32_t polled = lane.events->poll(completions.data(), completions.size());
        if (polled != 0) {
            for (std::uint32_t i = 0; i < polled; ++i) {
                if (completions[i].status != mlx5::CompletionStatus::success ||
                    !completions[i].is_receive) {
                    lane.failure = "lane " + std::to_string(lane_index) + ": completion " +
                                   std::to_string(consumed) + " is " +
                                   mlx5::to_string(completions[i].status);
                    failed = true;
                    return;
                }
                ++consumed;
                if (!post_receive(lane, consumed)) {
                    lane.failure = "lane " + std::to_string(lane_index) + ": receive not re-posted";
                    failed = true;
                    return;
                }
            }
            lane.taken.store(consumed);
            continue;
        }
        // Half the time the consumer does a few tens of microseconds of other work between the
        // empty poll and the arm, so that its arms fall at every phase of the emulator's poller
        // (which takes arms and doorbells every 20 us or so): CQEs then land before the arm,
        // between the arm and the device taking it, and after.
        jitter = jitter * 1103515245u + 12345u;
        if ((jitter >> 16) % 2 == 0)
            std::this_thread::sleep_for(std::chrono::microseconds((jitter >> 17) % 64));
        if (!lane.events->arm()) {
            ++lane.arm_refused;
            continue;
        }
        ++lane.sleeps;
        if (readable(descriptor, 0)) {
            ++lane.raised_at_once;
        } else if (!readable(descriptor, 10000)) {
            lane.failure = "lost wake-up on lane " + std::to_string(lane_index) +
                           ": asleep for 10 s at iteration " + std::to_string(consumed) + " of " +
                           std::to_string(total) + " with its next message sent";
            failed = true;
            return;
        }
        lane.events->take_event();
    }
}

}  // namespace

TEST_CASE("a million arm/complete races on the emulated ConnectX: no lost wake-up") {
    constexpr std::uint32_t kLanes = 16;
    const std::uint32_t total = rdmachan::test::kSanitizerBuild ? 100'000 : 1'000'000;
    const std::uint32_t per_lane = total / kLanes;
    std::shared_ptr<transport::Device> device = transport::open_device("auto");
    REQUIRE(device->kind() == transport::DeviceKind::mlx5);
    const transport::PortIdentity port = device->port_identity(1, std::nullopt);
    std::shared_ptr<transport::ProtectionDomain> domain = device->allocate_protection_domain();
    // The writer's side: one CQ for every initiator, polled by the writer only.
    std::shared_ptr<transport::CompletionQueue> sent = domain->create_completion_queue(1024);
    std::vector<std::unique_ptr<Lane>> lanes;
    for (std::uint32_t i = 0; i < kLanes; ++i) {
        auto lane = std::make_unique<Lane>();
        lane->events = domain->create_completion_queue(64);
        REQUIRE(lane->events->event_descriptor() >= 0);
        transport::QueuePairSettings settings;
        settings.max_send_wr = 16;
        settings.max_recv_wr = kReceives;
        lane->initiator = domain->create_queue_pair(settings, sent, sent);
        lane->target = domain->create_queue_pair(settings, lane->events, lane->events);
        lane->memory = domain->allocate_memory(4096, transport::kAccessLocalWrite);
        connect(*lane->initiator, *lane->target, port);
        connect(*lane->target, *lane->initiator, port);
        for (std::uint32_t r = 0; r < kReceives; ++r) REQUIRE(post_receive(*lane, r));
        lanes.push_back(std::move(lane));
    }
    const emulated::ArmDoorbellCounts before = emulated::arm_doorbell_counts();

    std::atomic<bool> failed{false};
    std::string writer_failure;
    std::thread writer([&] {
        std::array<mlx5::Completion, 32> completions;
        std::uint32_t jitter = 1;
        std::uint64_t outstanding = 0;
        for (std::uint32_t written = 0; written < per_lane; ++written) {
            for (std::unique_ptr<Lane>& lane : lanes) {
                // Longer than a consumer's 10 s sleep, so that a lost wake-up is reported by the lane.
                const auto deadline = rdmachan::test::Handoff::Clock::now() + std::chrono::seconds(30);
                if (!lane->taken.wait([written](std::uint32_t seen) { return seen >= written; }, failed, deadline)) {
                    if (!failed.load()) {
                        writer_failure = "a lane did not take message " + std::to_string(written) + " within 30 s";
                        failed = true;
                    }
                    return;
                }
                // A varying delay spreads the CQE over the consumer's poll, arm and sleep.
                jitter = jitter * 1103515245u + 12345u;
                for (std::uint32_t delay = (jitter >> 16) % 256; delay != 0; --delay)
                    __atomic_signal_fence(__ATOMIC_SEQ_CST);
                const mlx5::ScatterGatherElement what = element(lane->memory, kMessage);
                mlx5::SendWorkRequest request;
                request.wr_id = written;
                request.opcode = mlx5::SendOpcode::send;
                request.flags = mlx5::kSendSignaled;
                request.sg_list = &what;
                request.num_sge = 1;
                while (outstanding >= 512 ||
                       lane->initiator->post_one(request) != mlx5::PostResult::ok) {
                    const std::uint32_t polled = sent->poll(completions.data(), completions.size());
                    for (std::uint32_t i = 0; i < polled; ++i) {
                        if (completions[i].status != mlx5::CompletionStatus::success) {
                            writer_failure = std::string("send completed with ") +
                                             mlx5::to_string(completions[i].status);
                            failed = true;
                            return;
                        }
                    }
                    outstanding -= polled;
                    if (failed.load(std::memory_order_relaxed)) return;
                }
                ++outstanding;
                outstanding -= sent->poll(completions.data(), completions.size());
            }
        }
    });
    std::vector<std::thread> consumers;
    for (std::uint32_t i = 0; i < kLanes; ++i) {
        consumers.emplace_back([&, i] { consume(*lanes[i], i, per_lane, failed); });
    }
    for (std::thread& consumer : consumers) consumer.join();
    writer.join();
    for (const std::unique_ptr<Lane>& lane : lanes) {
        if (!lane->failure.empty()) FAIL(lane->failure);
    }
    if (!writer_failure.empty()) FAIL(writer_failure);

    std::uint64_t sleeps = 0;
    std::uint64_t arm_refused = 0;
    std::uint64_t raised_at_once = 0;
    for (const std::unique_ptr<Lane>& lane : lanes) {
        sleeps += lane->sleeps;
        arm_refused += lane->arm_refused;
        raised_at_once += lane->raised_at_once;
    }
    const emulated::ArmDoorbellCounts after = emulated::arm_doorbell_counts();
    const std::uint64_t seen = after.seen - before.seen;
    const std::uint64_t waiting = after.completion_waiting - before.completion_waiting;
    const std::uint32_t messages = per_lane * kLanes;
    MESSAGE(messages << " messages on " << kLanes << " lanes: " << sleeps << " sleeps, "
                     << arm_refused << " arms refused (a CQE landed between the poll and the arm), "
                     << raised_at_once << " readable at once after the arm; the emulator took "
                     << seen << " arm doorbells, " << waiting
                     << " of them with a CQE already past the arm's consumer index");
    CHECK(sleeps > total / 2);  // the consumers slept for most messages
    CHECK(seen >= sleeps);      // every sleep's arm reached the device
    CHECK(waiting >
          total / 1000);  // CQEs landed between the consumer's poll and the device taking its arm
    CHECK(arm_refused + raised_at_once >
          0);  // and some between the poll and the sleep, seen by the consumer
}

// The NIC sees every register write, also one that repeats the last: an arm written twice with
// the same sequence number, command and consumer index is taken twice.
TEST_CASE("an arm that repeats the last one's word is still taken by the device") {
    std::shared_ptr<verbs::Context> context = verbs::Context::open("mlx5_0");
    verbs::Mlx5CompletionQueue created = verbs::create_mlx5_completion_queue(context, 64);
    REQUIRE(created.completion_queue->event_descriptor() >= 0);
    REQUIRE(created.ring.uar != nullptr);
    mlx5::CompletionQueue queue(created.ring);
    const std::uint64_t start = emulated::arm_doorbell_counts().seen;
    queue.arm(false);
    REQUIRE(arms_seen_reach(start + 1));
    const std::uint32_t word = created.ring.doorbell_record[mlx5::kCqArm];
    queue.arm(false);
    CHECK(created.ring.doorbell_record[mlx5::kCqArm] == word);  // the same value, written again
    CHECK(arms_seen_reach(start + 2));
    CHECK_FALSE(readable(created.completion_queue->event_descriptor(), 0));  // no CQE: no event
}

// What libibverbs and the kernel do with a channel: EBUSY while a CQ uses it; a non-blocking
// channel answers EAGAIN when nothing was raised; ibv_destroy_cq waits for the events read but
// not acknowledged, and drops one queued unread.
TEST_CASE(
    "channel lifetime: EBUSY with a CQ, EAGAIN when empty, destroy waits for acknowledgements of "
    "events read") {
    ibv_device** list = ibv_get_device_list(nullptr);
    REQUIRE(list != nullptr);
    ibv_context* context = ibv_open_device(list[0]);
    ibv_free_device_list(list);
    REQUIRE(context != nullptr);
    ibv_comp_channel* channel = ibv_create_comp_channel(context);
    REQUIRE(channel != nullptr);
    REQUIRE(::fcntl(channel->fd, F_SETFL, ::fcntl(channel->fd, F_GETFL) | O_NONBLOCK) == 0);
    int marker = 0;
    ibv_cq* cq = ibv_create_cq(context, 16, &marker, channel, 0);
    REQUIRE(cq != nullptr);
    CHECK(cq->channel == channel);
    CHECK(channel->refcnt == 1);
    CHECK(ibv_destroy_comp_channel(channel) == EBUSY);
    CHECK(ibv_create_cq(context, 16, nullptr, channel, 1) == nullptr);  // one completion vector
    CHECK(errno == EINVAL);

    ibv_cq* taken = nullptr;
    void* taken_context = nullptr;
    CHECK(ibv_get_cq_event(channel, &taken, &taken_context) == -1);
    CHECK(errno == EAGAIN);
    CHECK_FALSE(readable(channel->fd, 0));
    CHECK(ibv_destroy_cq(cq) == 0);  // nothing read, nothing to wait for
    CHECK(channel->refcnt == 0);
    CHECK(ibv_destroy_comp_channel(channel) == 0);
    CHECK(ibv_close_device(context) == 0);
}
