// CQ arming against libmlx5 itself. A CQ of the installed libmlx5 with a completion channel
// (ibv_create_comp_channel, answered by the fake kernel with a pipe), and our CompletionQueue over
// a copy of its ring, doorbell record and UAR page, go through the same random sequence of:
// requester CQEs written into both rings and polled (ibv_poll_cq, CompletionQueue::poll) with
// random capacities, so the consumer index moves across many passes of the ring; arms for the
// next or the next solicited completion (ibv_req_notify_cq, CompletionQueue::arm); completion
// events reported by the fake kernel and taken (ibv_get_cq_event, event_received), past the
// sequence number's wrap; and batched acknowledgements (ibv_ack_cq_events). After every arm the
// arm word in the doorbell record and the whole UAR page holding the CQ doorbell register must
// be byte for byte the same; both are filled with a random byte before each arm, so an arm that
// writes nothing, or writes anywhere else, shows. Before every poll, completion_waiting() must
// say what libmlx5's poll then finds. At the end the events are acknowledged and the CQ is
// destroyed, which returns only once every event the fake kernel reported was acknowledged.
//
// One run first consumes nearly 2^24 CQEs in large batches, so that its arms carry consumer
// indices on both sides of the 24-bit wrap.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/fake_device.hpp"
#include "tests/libmlx5/fake_uverbs.hpp"
#include "tests/libmlx5/scoped_environment.hpp"
#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

constexpr std::uint32_t kSendSlots = 16;  // our tracking of the QP the CQEs name
// The arm word carries the consumer index's low 24 bits (cq.c mlx5_arm_cq). Stated here, not
// taken from the code under test.
constexpr std::uint32_t kConsumerIndexWrap = 1u << 24;

// What a run did, counted so that a generator that stops reaching a case fails the run.
struct Counts {
    std::uint32_t arms[2][4] = {};  // by command (next, solicited) and sequence number
    std::uint32_t events = 0, empty_reads = 0, acknowledgements = 0, batched_acknowledgements = 0;
    std::uint32_t cqes = 0, polls = 0, waiting[2] = {};  // completion_waiting() false, true
    std::uint32_t full_polls = 0;  // polls of a full ring
    std::uint32_t ring_passes_armed = 0;  // arms whose consumer index is past a ring wrap
    std::uint32_t index_wraps_armed = 0;  // arms whose consumer index is past the 24-bit wrap
};

struct Side {
    FakeMlx5 device;
    ibv_comp_channel* channel = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    int cq_context = 0;  // its address is the CQ's context, which ibv_get_cq_event returns
    mlx5dv_cq theirs{};
    std::uint8_t* their_page = nullptr;  // the UAR page (as the fake mapped it) of the register
    std::size_t page_length = 0;
    std::size_t register_offset = 0;  // of cq_uar in that page
    // Ours: a copy of libmlx5's ring, doorbell record and UAR page, in memory of our own.
    std::vector<std::uint8_t> ring, page;
    std::uint32_t doorbell_record[2] = {};
    std::uint64_t wr_ids[kSendSlots] = {};
    std::uint32_t wqe_ends[kSendSlots] = {};
    mlx5::SendQueueTracking tracking{};
    mlx5::CompletionTarget target{};
    mlx5::CompletionQueue ours;
    // The model: CQEs written and consumed, events taken and not yet acknowledged, and whether
    // an arm waits for its event.
    std::uint32_t written = 0, consumed = 0, unacknowledged = 0;
    bool armed = false;
    Counts counts;
};

// libmlx5's CQ with a channel, a queue pair whose CQEs it decodes, and ours mirroring the CQ.
// `side` must not move afterwards.
std::string open_side(Side& side, int cq_entries) {
    std::string error;
    side.device = open_fake_mlx5(4, error);
    if (!error.empty()) return error;
    // A CQ number with all three bytes set, so that the register's CQN bytes are all compared.
    fake_kernel().next_cqn = 0xc3a581 + static_cast<std::uint32_t>(cq_entries);
    side.channel = ibv_create_comp_channel(side.device.context);
    if (side.channel == nullptr) return "ibv_create_comp_channel failed";
    // Non-blocking, so that a read with no event pending fails instead of waiting.
    if (fcntl(side.channel->fd, F_SETFL, fcntl(side.channel->fd, F_GETFL) | O_NONBLOCK) != 0)
        return "the channel's descriptor cannot be made non-blocking";
    side.cq = ibv_create_cq(side.device.context, cq_entries, &side.cq_context, side.channel, 0);
    if (side.cq == nullptr) return "ibv_create_cq with a completion channel failed";
    FakeMlx5 on_this_cq = side.device;
    on_this_cq.cq = side.cq;
    ibv_qp_cap caps{};
    caps.max_send_wr = kSendSlots;
    caps.max_recv_wr = 1;
    caps.max_send_sge = 1;
    caps.max_recv_sge = 1;
    side.qp = create_rts_queue_pair(on_this_cq, caps, error);
    if (side.qp == nullptr) return error;

    mlx5dv_obj object{};
    object.cq.in = side.cq;
    object.cq.out = &side.theirs;
    if (mlx5dv_init_obj(&object, MLX5DV_OBJ_CQ) != 0) return "mlx5dv_init_obj of the CQ failed";
    if (side.theirs.cq_uar == nullptr) return "libmlx5 names no UAR for the CQ";
    // The register must be in a page the fake kernel mapped: what libmlx5 stores there is read
    // from that memory.
    const FakeKernelState& kernel = fake_kernel();
    const auto* uar = static_cast<const std::uint8_t*>(side.theirs.cq_uar);
    for (int i = 0; i < kernel.page_count; ++i) {
        auto* page = static_cast<std::uint8_t*>(kernel.pages[i]);
        if (uar >= page && uar + mlx5::kCqDoorbellOffset + 8 <= page + kernel.page_lengths[i]) {
            side.their_page = page;
            side.page_length = kernel.page_lengths[i];
            side.register_offset = static_cast<std::size_t>(uar - page);
        }
    }
    if (side.their_page == nullptr) return "mlx5dv_cq.cq_uar is in no page the fake kernel mapped";

    const std::size_t ring_length = static_cast<std::size_t>(side.theirs.cqe_cnt) * side.theirs.cqe_size;
    side.ring.assign(static_cast<std::uint8_t*>(side.theirs.buf), static_cast<std::uint8_t*>(side.theirs.buf) + ring_length);
    side.page.assign(side.their_page, side.their_page + side.page_length);
    std::memcpy(side.doorbell_record, side.theirs.dbrec, sizeof side.doorbell_record);
    for (std::uint32_t i = 0; i < kSendSlots; ++i) side.wqe_ends[i] = i + 1;
    side.tracking = {side.wr_ids, side.wqe_ends, 0, 0};
    side.target.send = &side.tracking;
    side.target.send_wqe_count = kSendSlots;
    mlx5::CompletionQueueRing ring;
    ring.buffer = side.ring.data();
    ring.cqe_count = side.theirs.cqe_cnt;
    ring.cqe_size = side.theirs.cqe_size;
    ring.cqn = side.theirs.cqn;
    ring.doorbell_record = side.doorbell_record;
    ring.uar = side.page.data() + side.register_offset;
    side.ours = mlx5::CompletionQueue(ring);
    return {};
}

std::string hex(const std::uint8_t* bytes, std::size_t length) {
    std::string text;
    char byte[4];
    for (std::size_t i = 0; i < length; ++i) {
        std::snprintf(byte, sizeof byte, "%02x", bytes[i]);
        text += byte;
    }
    return text;
}

std::string hex_number(std::uint32_t value) {
    char text[16];
    std::snprintf(text, sizeof text, "%x", value);
    return text;
}

// 1 up to all of the free entries: requester CQEs for the QP, written by the fake device into
// libmlx5's ring and copied into ours.
void write_cqes(Side& side, std::mt19937_64& random) {
    const std::uint32_t room = side.theirs.cqe_cnt - (side.written - side.consumed);
    if (room == 0) return;
    // Now and then to the brim: a full ring, whose last entry is on the pass after the first.
    const auto count = random() % 8 == 0 ? room : static_cast<std::uint32_t>(1 + random() % room);
    for (std::uint32_t i = 0; i < count; ++i, ++side.written) {
        const auto wqe_counter = static_cast<std::uint32_t>(random() % kSendSlots);
        write_requester_cqe(side.written, side.qp->qp_num, mlx5::kOpcodeRdmaWrite, wqe_counter);
        const std::size_t at = static_cast<std::size_t>(side.written & (side.theirs.cqe_cnt - 1)) * side.theirs.cqe_size;
        std::memcpy(side.ring.data() + at, static_cast<std::uint8_t*>(side.theirs.buf) + at, side.theirs.cqe_size);
        ++side.counts.cqes;
    }
}

std::string poll_both(Side& side, std::mt19937_64& random) {
    const bool waiting = side.ours.completion_waiting();
    ++side.counts.waiting[waiting ? 1 : 0];
    side.counts.full_polls += side.written - side.consumed == side.theirs.cqe_cnt;
    const auto capacity = static_cast<std::uint32_t>(1 + random() % side.theirs.cqe_cnt);
    std::vector<ibv_wc> theirs(capacity);
    std::vector<mlx5::Completion> ours(capacity);
    const int their_count = ibv_poll_cq(side.cq, static_cast<int>(capacity), theirs.data());
    const std::uint32_t our_count = side.ours.poll(ours.data(), capacity, [&side](std::uint32_t qpn, std::uint32_t) {
        return qpn == side.qp->qp_num ? &side.target : nullptr;
    });
    ++side.counts.polls;
    if (their_count < 0 || static_cast<std::uint32_t>(their_count) != our_count)
        return "poll of " + std::to_string(capacity) + ": libmlx5 returned " + std::to_string(their_count) + ", ours " +
               std::to_string(our_count);
    if (waiting != (their_count > 0))
        return "completion_waiting() said " + std::to_string(waiting) + " before libmlx5's poll found " +
               std::to_string(their_count);
    for (int i = 0; i < their_count; ++i)
        if (theirs[static_cast<std::size_t>(i)].status != IBV_WC_SUCCESS ||
            ours[static_cast<std::size_t>(i)].status != mlx5::CompletionStatus::success)
            return "a requester CQE did not complete successfully";
    side.consumed += our_count;
    if (side.consumed != side.ours.consumer_index()) return "our consumer index is not the CQEs consumed";
    if (side.theirs.dbrec[mlx5::kCqSetConsumerIndex] != side.doorbell_record[mlx5::kCqSetConsumerIndex])
        return "the consumer-index words of the doorbell records differ";
    return {};
}

// Writes and polls full rings on both sides until `consumed` CQEs were consumed, comparing the
// counts only: the way to a consumer index near the 24-bit wrap.
std::string fast_forward(Side& side, std::uint32_t consumed) {
    const std::uint32_t entries = side.theirs.cqe_cnt;
    std::vector<ibv_wc> theirs(entries);
    std::vector<mlx5::Completion> ours(entries);
    while (side.consumed < consumed) {
        const std::uint32_t count = std::min(entries, consumed - side.consumed);
        for (std::uint32_t i = 0; i < count; ++i, ++side.written) {
            write_requester_cqe(side.written, side.qp->qp_num, mlx5::kOpcodeRdmaWrite, 0);
            const std::size_t at = static_cast<std::size_t>(side.written & (entries - 1)) * side.theirs.cqe_size;
            std::memcpy(side.ring.data() + at, static_cast<std::uint8_t*>(side.theirs.buf) + at, side.theirs.cqe_size);
        }
        const int their_count = ibv_poll_cq(side.cq, static_cast<int>(entries), theirs.data());
        const std::uint32_t our_count = side.ours.poll(ours.data(), entries, [&side](std::uint32_t qpn, std::uint32_t) {
            return qpn == side.qp->qp_num ? &side.target : nullptr;
        });
        if (their_count < 0 || static_cast<std::uint32_t>(their_count) != count || our_count != count)
            return "a batch of " + std::to_string(count) + " CQEs: libmlx5 polled " + std::to_string(their_count) +
                   ", ours " + std::to_string(our_count);
        side.consumed += count;
    }
    return {};
}

std::string arm_both(Side& side, std::mt19937_64& random) {
    const bool solicited = random() % 2 == 1;
    // The same random bytes on both sides before the arm: what each writes shows against them.
    const auto poison = static_cast<std::uint8_t>(random());
    const auto record = static_cast<std::uint32_t>(random());
    std::memset(side.their_page, poison, side.page_length);
    std::memset(side.page.data(), poison, side.page_length);
    side.theirs.dbrec[mlx5::kCqArm] = record;
    side.doorbell_record[mlx5::kCqArm] = record;
    const std::uint32_t sequence = side.ours.arm_sequence();
    if (sequence > 3) return "arm_sequence() is not a 2-bit number: " + std::to_string(sequence);
    if (ibv_req_notify_cq(side.cq, solicited ? 1 : 0) != 0) return "ibv_req_notify_cq failed";
    side.ours.arm(solicited);
    const std::string what = std::string(solicited ? "solicited" : "next") + " arm with sequence number " +
                             std::to_string(sequence) + " and consumer index " + std::to_string(side.consumed);
    const auto* their_record = reinterpret_cast<const std::uint8_t*>(&side.theirs.dbrec[mlx5::kCqArm]);
    const auto* our_record = reinterpret_cast<const std::uint8_t*>(&side.doorbell_record[mlx5::kCqArm]);
    if (std::memcmp(their_record, our_record, 4) != 0)
        return what + ": the arm words differ: libmlx5 " + hex(their_record, 4) + ", ours " + hex(our_record, 4);
    const std::size_t at = side.register_offset + mlx5::kCqDoorbellOffset;
    if (std::memcmp(side.their_page + at, side.page.data() + at, 8) != 0)
        return what + ": the CQ doorbell registers differ: libmlx5 " + hex(side.their_page + at, 8) + ", ours " +
               hex(side.page.data() + at, 8);
    if (std::memcmp(side.their_page, side.page.data(), side.page_length) != 0)
        return what + ": the UAR pages differ outside the CQ doorbell register";
    ++side.counts.arms[solicited ? 1 : 0][sequence];
    side.counts.ring_passes_armed += side.consumed >= side.theirs.cqe_cnt;
    side.counts.index_wraps_armed += side.consumed >= kConsumerIndexWrap;
    side.armed = true;
    return {};
}

// An armed CQ gets an event, as the kernel reports it: libibverbs takes it from the channel.
// Unarmed, none is reported and the channel has none to give.
std::string take_event(Side& side) {
    ibv_cq* cq = nullptr;
    void* context = nullptr;
    if (!side.armed) {
        if (ibv_get_cq_event(side.channel, &cq, &context) != -1) return "ibv_get_cq_event returned an event never reported";
        ++side.counts.empty_reads;
        return {};
    }
    if (!report_completion_event(side.cq->handle)) return "the fake kernel could not report an event";
    if (ibv_get_cq_event(side.channel, &cq, &context) != 0) return "ibv_get_cq_event failed";
    if (cq != side.cq || context != &side.cq_context) return "ibv_get_cq_event named another CQ or context";
    side.ours.event_received();
    side.armed = false;
    ++side.unacknowledged;
    ++side.counts.events;
    if (side.ours.arm_sequence() != side.counts.events % 4) return "our sequence number is not the events taken, modulo 4";
    return {};
}

void acknowledge(Side& side, std::mt19937_64& random) {
    if (side.unacknowledged == 0) return;
    const auto count = static_cast<std::uint32_t>(1 + random() % side.unacknowledged);
    ibv_ack_cq_events(side.cq, count);
    side.unacknowledged -= count;
    ++side.counts.acknowledgements;
    side.counts.batched_acknowledgements += count > 1;
}

// `steps` random steps; with `start_before_wrap`, from that many CQEs before the consumer
// index's 24-bit wrap.
// `cqe_size`: the CQE size the run must get (libmlx5 takes it from MLX5_CQE_SIZE).
void run(int cq_entries, std::uint64_t seed, std::uint32_t steps, std::uint32_t cqe_size,
         std::uint32_t start_before_wrap = 0) {
    Side side;
    const std::string error = open_side(side, cq_entries);
    REQUIRE_MESSAGE(error.empty(), error);
    REQUIRE(side.theirs.cqe_size == cqe_size);
    if (start_before_wrap != 0) {
        const std::string failure = fast_forward(side, kConsumerIndexWrap - start_before_wrap);
        REQUIRE_MESSAGE(failure.empty(), failure);
    }
    INFO("CQ of ", side.theirs.cqe_cnt, " entries of ", side.theirs.cqe_size, " bytes, cqn 0x", hex_number(side.theirs.cqn),
         "; seed ", seed);
    std::mt19937_64 random(seed);
    for (std::uint32_t step = 0; step < steps; ++step) {
        CAPTURE(step);
        std::string failure;
        switch (random() % 6) {
        case 0:
            write_cqes(side, random);
            break;
        case 1:
            failure = poll_both(side, random);
            break;
        case 2:
        case 3:
            failure = arm_both(side, random);
            break;
        case 4:
            failure = take_event(side);
            break;
        default:
            acknowledge(side, random);
            break;
        }
        REQUIRE_MESSAGE(failure.empty(), failure);
    }
    // Every event taken is acknowledged before the CQ goes: libibverbs waits for that.
    if (side.unacknowledged != 0) ibv_ack_cq_events(side.cq, side.unacknowledged);
    CHECK(side.cq->comp_events_completed == side.counts.events);
    CHECK(ibv_destroy_qp(side.qp) == 0);
    CHECK(ibv_destroy_cq(side.cq) == 0);
    CHECK(ibv_destroy_comp_channel(side.channel) == 0);

    const Counts& counts = side.counts;
    MESSAGE(steps, " steps on a CQ of ", side.theirs.cqe_cnt, " x ", side.theirs.cqe_size, " B, cqn 0x",
            hex_number(side.theirs.cqn), ": arms compared (next by sequence number ", counts.arms[0][0], "/",
            counts.arms[0][1], "/", counts.arms[0][2], "/", counts.arms[0][3], ", solicited ", counts.arms[1][0], "/",
            counts.arms[1][1], "/", counts.arms[1][2], "/", counts.arms[1][3], "), ", counts.ring_passes_armed,
            " past a ring wrap, ", counts.index_wraps_armed, " past the 24-bit wrap; ", counts.events, " events (",
            counts.events / 4, " sequence-number wraps), ", counts.empty_reads, " reads with none pending, ",
            counts.acknowledgements, " acknowledgements (", counts.batched_acknowledgements, " batched); ", counts.cqes,
            " CQEs of random steps, ", side.consumed / side.theirs.cqe_cnt, " ring passes to consumer index 0x",
            hex_number(side.consumed), ", ", counts.polls, " polls (", counts.full_polls,
            " of a full ring; completion_waiting ", counts.waiting[1], " true, ", counts.waiting[0], " false)");
    // The coverage claimed above, by count.
    for (const auto& by_command : counts.arms)
        for (const std::uint32_t arms : by_command) CHECK(arms >= steps / 400);
    CHECK(counts.events / 4 >= steps / 200);
    CHECK(counts.ring_passes_armed >= steps / 20);
    CHECK(side.consumed / side.theirs.cqe_cnt >= steps / 500);
    CHECK(counts.batched_acknowledgements >= steps / 1000);
    CHECK(counts.empty_reads >= steps / 1000);
    CHECK(counts.waiting[0] >= steps / 100);
    CHECK(counts.waiting[1] >= steps / 100);
    CHECK(counts.full_polls >= steps / 1000);
    if (start_before_wrap != 0) {
        const std::uint32_t total = counts.arms[0][0] + counts.arms[0][1] + counts.arms[0][2] + counts.arms[0][3] +
                                    counts.arms[1][0] + counts.arms[1][1] + counts.arms[1][2] + counts.arms[1][3];
        CHECK(counts.index_wraps_armed >= total / 10);
        CHECK(total - counts.index_wraps_armed >= total / 10);
    }
}

}  // namespace

TEST_CASE("CQ arms, events and acknowledgements agree with the installed libmlx5, byte for byte") {
    run(15, 21, 50000, 64);   // 16 entries
    run(200, 22, 50000, 64);  // 256 entries
}

TEST_CASE("the same across the consumer index's 24-bit wrap") {
    run(4000, 24, 20000, 64, 1800000);  // 4096 entries; about 1.8 million CQEs of random steps
}

TEST_CASE("the same with 128-byte CQEs") {
    // libmlx5 sizes a new CQ's entries by MLX5_CQE_SIZE (64 unless set).
    const ScopedEnvironment cqe_size("MLX5_CQE_SIZE", "128");
    run(7, 23, 50000, 128);
}
