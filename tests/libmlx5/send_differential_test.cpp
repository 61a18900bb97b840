// The send encoder against libmlx5 itself, on random work requests: Debian's libmlx5, as
// installed, posts each random chain into its own send queue (on the fake uverbs device,
// fake_uverbs.cpp), the project's SendQueue posts the same chain into a ring of the same shape,
// and every byte libmlx5 wrote must be what we wrote: the WQEs, the send doorbell record and
// the BlueFlame or doorbell register. The return code (0 or the errno) and the number of work
// requests accepted must agree too. The shipped golden vectors pin chosen cases; this covers
// what nobody chose: opcodes, flag sets, SGE counts and lengths, inline sizes near the limit,
// refused requests anywhere in a chain, ring wrap.
//
// Which bytes libmlx5 wrote: before each call both queues and both registers are filled with
// the same random byte; a byte of libmlx5's that differs from it afterwards was written (a
// byte written with the poison's value is missed, a different one each call). We may write
// more (reserved fields libmlx5 leaves alone). Only the WQEBBs of the WQEs posted are compared:
// a refused request may leave bytes after them (libmlx5 copies inline data before it finds the
// total too large), which no NIC reads.
//
// Where we differ from libmlx5 v44 on purpose (docs/ARCHITECTURE.md): when a chain is refused
// after its first request, libmlx5 rings the doorbell with the refused request's control
// segment; we ring it with the last WQE posted. The register is not compared then.
#include <doctest/doctest.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/fake_device.hpp"
#include "tests/libmlx5/fake_uverbs.hpp"
#include "tools/golden_check/send_errno.hpp"
#include "transport/mlx5/send_queue.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

constexpr std::uint32_t kMaxChain = 4;

struct Opcodes {
    ibv_wr_opcode verbs;
    mlx5::SendOpcode ours;
};
constexpr Opcodes kOpcodes[] = {
    {IBV_WR_RDMA_WRITE, mlx5::SendOpcode::rdma_write},
    {IBV_WR_RDMA_WRITE_WITH_IMM, mlx5::SendOpcode::rdma_write_with_immediate},
    {IBV_WR_SEND, mlx5::SendOpcode::send},
    {IBV_WR_SEND_WITH_IMM, mlx5::SendOpcode::send_with_immediate},
    {IBV_WR_RDMA_READ, mlx5::SendOpcode::rdma_read},
    {IBV_WR_ATOMIC_CMP_AND_SWP, mlx5::SendOpcode::atomic_compare_and_swap},
    {IBV_WR_ATOMIC_FETCH_AND_ADD, mlx5::SendOpcode::atomic_fetch_and_add},
};

// One side's queue: libmlx5's (from mlx5dv_init_obj) or ours (plain memory of the same shape).
struct Ring {
    std::uint8_t* buffer = nullptr;
    std::uint32_t wqe_count = 0;
    std::uint32_t* doorbell_record = nullptr;
    std::uint8_t* blueflame = nullptr;
    std::uint32_t blueflame_size = 0;
    std::size_t bytes() const { return static_cast<std::size_t>(wqe_count) * 64; }
    void poison(std::uint8_t value) const {
        std::memset(buffer, value, bytes());
        std::memset(blueflame, value, 2 * static_cast<std::size_t>(blueflame_size));
    }
};

// The first byte (offset) where libmlx5 wrote something other than what we wrote, or -1.
long first_difference(const std::uint8_t* theirs, const std::uint8_t* ours, std::size_t length, std::uint8_t poison) {
    for (std::size_t i = 0; i < length; ++i)
        if (theirs[i] != poison && theirs[i] != ours[i]) return static_cast<long>(i);
    return -1;
}

std::string hex_around(const std::uint8_t* bytes, long at, std::size_t length) {
    std::string text;
    const std::size_t from = static_cast<std::size_t>(at) / 16 * 16;
    char piece[4];
    for (std::size_t i = from; i < from + 16 && i < length; ++i) {
        std::snprintf(piece, sizeof piece, "%02x", bytes[i]);
        text += piece;
    }
    return text;
}

struct Harness {
    FakeMlx5 device;
    ibv_qp* qp = nullptr;
    ibv_qp_cap caps{};
    Ring theirs;
    Ring ours;
    std::vector<std::uint8_t> ring_memory;
    std::uint32_t doorbell_record_memory[2] = {};
    std::vector<std::uint8_t> register_memory;
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    mlx5::SendQueue queue;
    std::uint32_t cqes = 0;
    std::uint32_t posted_wqebbs = 0;  // libmlx5's producer index, as its doorbell record says
};

void open_harness(Harness& harness, const ibv_qp_cap& wanted, bool signal_all) {
    std::string error;
    harness.device = open_fake_mlx5(1024, error);
    REQUIRE_MESSAGE(error.empty(), error);
    harness.caps = wanted;
    harness.qp = create_rts_queue_pair(harness.device, harness.caps, error, signal_all);
    REQUIRE_MESSAGE(harness.qp != nullptr, error);
    mlx5dv_qp layout{};
    mlx5dv_obj object{};
    object.qp.in = harness.qp;
    object.qp.out = &layout;
    REQUIRE(mlx5dv_init_obj(&object, MLX5DV_OBJ_QP) == 0);
    REQUIRE(layout.sq.stride == 64);
    harness.theirs = {static_cast<std::uint8_t*>(layout.sq.buf), layout.sq.wqe_cnt, reinterpret_cast<std::uint32_t*>(layout.dbrec),
                      static_cast<std::uint8_t*>(layout.bf.reg), layout.bf.size};
    harness.ring_memory.assign(harness.theirs.bytes() + 64, 0);
    harness.register_memory.assign(2 * static_cast<std::size_t>(layout.bf.size) + 64, 0);
    auto aligned = [](std::vector<std::uint8_t>& memory) {
        const auto address = reinterpret_cast<std::uintptr_t>(memory.data());
        return memory.data() + ((64 - address % 64) % 64);
    };
    harness.ours = {aligned(harness.ring_memory), layout.sq.wqe_cnt, harness.doorbell_record_memory,
                    aligned(harness.register_memory), layout.bf.size};
    harness.wr_ids.assign(layout.sq.wqe_cnt, 0);
    harness.wqe_ends.assign(layout.sq.wqe_cnt, 0);
    mlx5::SendQueueRing ring;
    ring.buffer = harness.ours.buffer;
    ring.wqe_count = harness.ours.wqe_count;
    ring.qpn = harness.qp->qp_num;
    ring.doorbell_record = harness.ours.doorbell_record;
    ring.blueflame_register = harness.ours.blueflame;
    ring.blueflame_size = harness.ours.blueflame_size;
    mlx5::SendQueueConfig config;
    config.max_sge = harness.caps.max_send_sge;
    config.max_inline_data = harness.caps.max_inline_data;
    config.signal_all = signal_all;
    harness.queue = mlx5::SendQueue(ring, {harness.wr_ids.data(), harness.wqe_ends.data(), 0, 0, nullptr}, config);
}

// Retires everything libmlx5 posted, as a completion of its last WQE would (the CQE names that
// WQE's first WQEBB), and everything we posted.
void retire_all(Harness& harness, std::uint32_t first_wqebb, std::uint32_t wqes) {
    if (wqes == 0) return;
    std::uint32_t start = first_wqebb;
    std::uint32_t last = start;
    for (std::uint32_t i = 0; i < wqes; ++i) {
        last = start;
        const std::uint8_t* ctrl = harness.theirs.buffer + static_cast<std::size_t>(start & (harness.theirs.wqe_count - 1)) * 64;
        const std::uint32_t ds = ctrl[7] & 0x3f;
        start += (ds * 16 + 63) / 64;
    }
    const std::uint8_t* ctrl = harness.theirs.buffer + static_cast<std::size_t>(last & (harness.theirs.wqe_count - 1)) * 64;
    write_requester_cqe(harness.cqes++, harness.qp->qp_num, ctrl[3], last);
    ibv_wc completion{};
    REQUIRE(ibv_poll_cq(harness.device.cq, 1, &completion) == 1);
    harness.queue.tracking().consumer_index = harness.queue.tracking().producer_index;
}

struct Chain {
    std::vector<ibv_send_wr> verbs;
    std::vector<ibv_sge> verbs_elements;
    std::vector<mlx5::SendWorkRequest> ours;
    std::vector<mlx5::ScatterGatherElement> our_elements;
    std::string description;
};

Chain random_chain(std::mt19937_64& random, const ibv_qp_cap& caps, const std::vector<std::uint8_t>& payload) {
    Chain chain;
    auto below = [&](std::uint64_t bound) { return bound == 0 ? 0 : random() % bound; };
    const std::uint32_t count = 1 + static_cast<std::uint32_t>(below(kMaxChain));
    chain.verbs.resize(count);
    chain.ours.resize(count);
    // Sized once: the requests point into these vectors.
    chain.verbs_elements.reserve(static_cast<std::size_t>(count) * (caps.max_send_sge + 1));
    chain.our_elements.reserve(static_cast<std::size_t>(count) * (caps.max_send_sge + 1));
    for (std::uint32_t i = 0; i < count; ++i) {
        const Opcodes& opcode = kOpcodes[below(std::size(kOpcodes))];
        const bool atomic = opcode.ours == mlx5::SendOpcode::atomic_compare_and_swap ||
                            opcode.ours == mlx5::SendOpcode::atomic_fetch_and_add;
        const bool carries_data = opcode.ours != mlx5::SendOpcode::rdma_read && !atomic;
        ibv_send_wr& wr = chain.verbs[i];
        wr = {};
        wr.wr_id = random();
        wr.opcode = opcode.verbs;
        // Now and then one SGE above the queue's maximum.
        std::uint32_t elements = static_cast<std::uint32_t>(below(caps.max_send_sge + 1));
        if (below(40) == 0) elements = caps.max_send_sge + 1;
        if (atomic && below(8) != 0) elements = 1;
        if (below(3) == 0) wr.send_flags |= IBV_SEND_SIGNALED;
        if (below(4) == 0) wr.send_flags |= IBV_SEND_SOLICITED;
        if (below(6) == 0) wr.send_flags |= IBV_SEND_FENCE;
        const bool inline_data = carries_data && below(3) == 0;
        if (inline_data) wr.send_flags |= IBV_SEND_INLINE;
        // Inline: lengths that land around max_inline_data in total.
        const std::uint32_t length_bound = inline_data ? caps.max_inline_data / (elements == 0 ? 1 : elements) + 24 : 5000;
        const std::size_t first = chain.verbs_elements.size();
        for (std::uint32_t e = 0; e < elements; ++e) {
            std::uint32_t length = static_cast<std::uint32_t>(below(length_bound + 1));
            if (atomic) length = 8;
            const std::uint64_t offset = below(payload.size() - std::min<std::size_t>(length, payload.size()) + 1);
            const std::uint64_t address =
                inline_data ? reinterpret_cast<std::uintptr_t>(payload.data()) + offset : (random() & 0xffffffffffffull);
            chain.verbs_elements.push_back({address, length, static_cast<std::uint32_t>(random())});
            chain.our_elements.push_back({address, length, chain.verbs_elements.back().lkey});
        }
        wr.sg_list = elements == 0 ? nullptr : &chain.verbs_elements[first];
        wr.num_sge = static_cast<int>(elements);
        wr.imm_data = static_cast<std::uint32_t>(random());
        wr.wr.rdma.remote_addr = random();
        wr.wr.rdma.rkey = static_cast<std::uint32_t>(random());
        if (atomic) {
            wr.wr.atomic.remote_addr = random() & ~7ull;
            wr.wr.atomic.rkey = static_cast<std::uint32_t>(random());
            wr.wr.atomic.compare_add = random();
            wr.wr.atomic.swap = random();
        }
        wr.next = i + 1 < count ? &chain.verbs[i + 1] : nullptr;

        mlx5::SendWorkRequest& request = chain.ours[i];
        request.wr_id = wr.wr_id;
        request.opcode = opcode.ours;
        request.flags = ((wr.send_flags & IBV_SEND_SIGNALED) != 0 ? mlx5::kSendSignaled : 0) |
                        ((wr.send_flags & IBV_SEND_SOLICITED) != 0 ? mlx5::kSendSolicited : 0) |
                        ((wr.send_flags & IBV_SEND_FENCE) != 0 ? mlx5::kSendFence : 0) |
                        ((wr.send_flags & IBV_SEND_INLINE) != 0 ? mlx5::kSendInline : 0);
        request.sg_list = elements == 0 ? nullptr : &chain.our_elements[first];
        request.num_sge = elements;
        // The immediate goes on the wire as imm_data's bytes; ours is the number they spell.
        request.immediate = __builtin_bswap32(wr.imm_data);
        if (atomic) {
            request.remote_addr = wr.wr.atomic.remote_addr;
            request.rkey = wr.wr.atomic.rkey;
            request.compare_add = wr.wr.atomic.compare_add;
            request.swap = wr.wr.atomic.swap;
        } else {
            request.remote_addr = wr.wr.rdma.remote_addr;
            request.rkey = wr.wr.rdma.rkey;
        }
        chain.description += std::string(i == 0 ? "" : ", ") + std::to_string(static_cast<int>(opcode.verbs)) + "/sge" +
                             std::to_string(elements) + "/flags" + std::to_string(wr.send_flags);
    }
    return chain;
}

void run_random_chains(const ibv_qp_cap& wanted, bool signal_all, std::uint64_t seed, std::uint32_t calls) {
    Harness harness;
    open_harness(harness, wanted, signal_all);
    INFO("queue: wqe_cnt ", harness.theirs.wqe_count, ", max_send_sge ", harness.caps.max_send_sge, ", max_inline_data ",
         harness.caps.max_inline_data, ", sq_sig_all ", signal_all, ", BlueFlame size ", harness.theirs.blueflame_size,
         "; seed ", seed);
    std::mt19937_64 random(seed);
    std::vector<std::uint8_t> payload(8192);
    for (std::uint8_t& byte : payload) byte = static_cast<std::uint8_t>(random());
    std::uint32_t refused = 0, blueflame_calls = 0;
    for (std::uint32_t call = 0; call < calls; ++call) {
        Chain chain = random_chain(random, harness.caps, payload);
        CAPTURE(call);
        CAPTURE(chain.description);
        const auto poison = static_cast<std::uint8_t>(random());
        harness.theirs.poison(poison);
        harness.ours.poison(poison);
        const std::uint32_t first_wqebb = harness.queue.tracking().producer_index;

        ibv_send_wr* bad = nullptr;
        const int their_result = ibv_post_send(harness.qp, chain.verbs.data(), &bad);
        const std::uint32_t their_posted = bad == nullptr ? static_cast<std::uint32_t>(chain.verbs.size())
                                                          : static_cast<std::uint32_t>(bad - chain.verbs.data());
        std::uint32_t our_posted = 0;
        const mlx5::PostResult our_result =
            harness.queue.post(chain.ours.data(), static_cast<std::uint32_t>(chain.ours.size()), &our_posted);
        REQUIRE(rdmachan::golden::send_errno_of(our_result) == their_result);
        REQUIRE(our_posted == their_posted);
        refused += their_result != 0;

        REQUIRE(harness.theirs.doorbell_record[1] == harness.ours.doorbell_record[1]);
        // The WQEBBs of the WQEs posted. A refused request may leave bytes in the ring past them
        // (libmlx5 copies inline data before it finds the total too large): no NIC reads those.
        long ring_difference = -1;
        for (std::uint32_t wqebb = first_wqebb; wqebb != harness.queue.tracking().producer_index && ring_difference < 0; ++wqebb) {
            const std::size_t at = static_cast<std::size_t>(wqebb & (harness.theirs.wqe_count - 1)) * 64;
            const long difference = first_difference(harness.theirs.buffer + at, harness.ours.buffer + at, 64, poison);
            if (difference >= 0) ring_difference = static_cast<long>(at) + difference;
        }
        INFO("WQEBB ", ring_difference / 64, " byte ", ring_difference % 64, ": libmlx5 ",
             ring_difference < 0 ? std::string() : hex_around(harness.theirs.buffer, ring_difference, harness.theirs.bytes()),
             ", ours ", ring_difference < 0 ? std::string() : hex_around(harness.ours.buffer, ring_difference, harness.ours.bytes()));
        REQUIRE(ring_difference < 0);
        const bool refused_after_first = their_result != 0 && their_posted != 0;
        if (!refused_after_first) {
            const std::size_t register_bytes = 2 * static_cast<std::size_t>(harness.theirs.blueflame_size);
            const long register_difference =
                first_difference(harness.theirs.blueflame, harness.ours.blueflame, register_bytes, poison);
            INFO("register byte ", register_difference);
            REQUIRE(register_difference < 0);
            if (their_posted == 1 && harness.theirs.blueflame[0] != poison && harness.theirs.blueflame[8] != poison) ++blueflame_calls;
        }
        retire_all(harness, first_wqebb, their_posted);
    }
    MESSAGE(calls, " random chains, ", refused, " refused (at their first or a later request), ", blueflame_calls,
            " single WQEs checked in the BlueFlame register");
    CHECK(refused > 0);
    CHECK(refused < calls / 2);
}

}  // namespace

// Queue shapes: the golden vectors' (64 work requests, 4 SGEs, 256 bytes inline, as asked; libmlx5
// grants more), a small ring that wraps every few calls, no inline data and one SGE, many SGEs
// and a large inline limit, and every WQE signaled.
struct Shape {
    std::uint32_t max_send_wr, max_send_sge, max_inline_data;
    bool signal_all;
};
constexpr Shape kShapes[] = {
    {64, 4, 256, false}, {8, 2, 64, false}, {32, 1, 0, false}, {16, 16, 200, false}, {64, 4, 256, true},
};

TEST_CASE("the send encoder writes what the installed libmlx5 writes, for random chains of work requests") {
    std::uint64_t seed = 1;
    for (const Shape& shape : kShapes) {
        ibv_qp_cap caps{};
        caps.max_send_wr = shape.max_send_wr;
        caps.max_recv_wr = 1;
        caps.max_send_sge = shape.max_send_sge;
        caps.max_recv_sge = 1;
        caps.max_inline_data = shape.max_inline_data;
        run_random_chains(caps, shape.signal_all, seed++, 20000);
    }
}
