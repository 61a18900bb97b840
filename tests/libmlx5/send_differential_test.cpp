// The send encoder against libmlx5 itself, on random work requests (differential_queues.hpp):
// Debian's libmlx5, as installed, posts each random chain into its own send queue, SendQueue
// posts the same chain into a ring of the same shape, and every byte libmlx5 wrote must be
// what we wrote: the WQEs, the send doorbell record and the BlueFlame or doorbell register.
// Which request was refused, and why, must agree too: the reason libmlx5's code gives
// (libmlx5_refusals.hpp, itself checked against the errno and the requests libmlx5 took) is the
// reason our post returns. The shipped golden vectors pin chosen cases; this covers what nobody
// chose: opcodes, flag sets, SGE counts and lengths, inline sizes near the limit, refusals
// anywhere in a chain, a full queue, ring wrap. The coverage is required by count (Coverage).
//
// Only the WQEBBs of the WQEs posted are compared (first_posted_difference). Where we differ
// from libmlx5 v44 on purpose (docs/ARCHITECTURE.md): when a chain is refused after its first
// request, libmlx5 rings the doorbell with the refused request's control segment; we ring it
// with the last WQE posted. The register is not compared then.
//
// A full queue is not compared here: libmlx5 counts requests against max_post (a quarter or less
// of the ring's WQEBBs, its WQE size counting the largest request the queue pair may post), our
// SendQueue counts the ring's WQEBBs and leaves the request budget to its caller (the engine
// keeps send_in_flight within max_send_wr). Every call's WQEs are retired before the next, so
// neither queue fills. Full receive queues and SRQs are compared, by reason, in
// completion_differential_test.cpp, where both sides count alike.
#include <doctest/doctest.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/coverage.hpp"
#include "tests/libmlx5/differential_queues.hpp"
#include "tests/libmlx5/libmlx5_refusals.hpp"
#include "tools/golden_check/post_errno.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

const char* opcode_name(ibv_wr_opcode opcode) {
    switch (opcode) {
        case IBV_WR_RDMA_WRITE: return "opcode RDMA_WRITE";
        case IBV_WR_RDMA_WRITE_WITH_IMM: return "opcode RDMA_WRITE_WITH_IMM";
        case IBV_WR_SEND: return "opcode SEND";
        case IBV_WR_SEND_WITH_IMM: return "opcode SEND_WITH_IMM";
        case IBV_WR_RDMA_READ: return "opcode RDMA_READ";
        case IBV_WR_ATOMIC_CMP_AND_SWP: return "opcode ATOMIC_CMP_AND_SWP";
        case IBV_WR_ATOMIC_FETCH_AND_ADD: return "opcode ATOMIC_FETCH_AND_ADD";
        default: return "opcode other";
    }
}

// What the posted requests of a chain cover: opcodes and flags.
void count_posted(Coverage& coverage, const SendChain& chain, std::uint32_t posted) {
    for (std::uint32_t i = 0; i < posted; ++i) {
        const ibv_send_wr& request = chain.verbs[i];
        coverage.count(opcode_name(request.opcode));
        if ((request.send_flags & IBV_SEND_SIGNALED) != 0) coverage.count("flag SIGNALED");
        if ((request.send_flags & IBV_SEND_SOLICITED) != 0) coverage.count("flag SOLICITED");
        if ((request.send_flags & IBV_SEND_FENCE) != 0) coverage.count("flag FENCE");
        if ((request.send_flags & IBV_SEND_INLINE) != 0) coverage.count("flag INLINE");
    }
}

struct Shape {
    std::uint32_t max_send_wr, max_send_sge, max_inline_data;
    bool signal_all;
};

void run_random_chains(const Shape& shape, std::uint64_t seed, std::uint32_t calls) {
    ibv_qp_cap wanted{};
    wanted.max_send_wr = shape.max_send_wr;
    wanted.max_recv_wr = 1;
    wanted.max_send_sge = shape.max_send_sge;
    wanted.max_recv_sge = 1;
    wanted.max_inline_data = shape.max_inline_data;
    DifferentialQueues queues;
    const std::string error = open_differential_queues(queues, wanted, shape.signal_all);
    REQUIRE_MESSAGE(error.empty(), error);
    INFO("queue: wqe_cnt ", queues.send_wqe_count, ", max_send_wr ", queues.caps.max_send_wr, ", max_send_sge ",
         queues.caps.max_send_sge, ", max_inline_data ", queues.caps.max_inline_data, ", sq_sig_all ", shape.signal_all,
         ", BlueFlame size ", queues.blueflame_size, "; seed ", seed);
    const QueueLimits limits{queues.caps.max_send_wr, queues.caps.max_send_sge, queues.caps.max_inline_data};
    std::mt19937_64 random(seed);
    std::vector<std::uint8_t> payload(8192);
    for (std::uint8_t& byte : payload) byte = static_cast<std::uint8_t>(random());
    Coverage coverage;
    std::uint32_t cqes = 0;
    for (std::uint32_t call = 0; call < calls; ++call) {
        SendChain chain = random_send_chain(random, queues.caps, payload);
        CAPTURE(call);
        CAPTURE(chain.description);
        const auto value = static_cast<std::uint8_t>(random());
        poison_send_side(queues, value);
        const std::uint32_t first_wqebb = queues.send.tracking().producer_index;
        const Refusal expected = libmlx5_send_refusal(chain.verbs, 0, limits);

        ibv_send_wr* bad = nullptr;
        const int their_result = ibv_post_send(queues.qp, chain.verbs.data(), &bad);
        const std::uint32_t their_posted = accepted(bad, chain.verbs);
        std::uint32_t our_posted = 0;
        const mlx5::PostResult our_result = queues.send.post(chain.ours.data(), static_cast<std::uint32_t>(chain.ours.size()), &our_posted);
        const std::string derivation = check_derivation(expected, their_result, their_posted,
                                                        static_cast<std::uint32_t>(chain.verbs.size()), rdmachan::golden::send_errno_of);
        REQUIRE_MESSAGE(derivation.empty(), derivation);
        const std::string refusal = refusal_difference(expected, our_result, our_posted);
        REQUIRE_MESSAGE(refusal.empty(), refusal);
        if (their_result != 0) {
            coverage.count(std::string("refusal: ") + reason_name(expected.reason));
            if (their_posted != 0) coverage.count("refusal after the first request");
        }
        // The register is not compared after a refusal past the first request (above).
        const bool refused_after_first = their_result != 0 && their_posted != 0;
        const std::string difference = send_side_difference(queues, first_wqebb, value, !refused_after_first);
        REQUIRE_MESSAGE(difference.empty(), difference);
        count_posted(coverage, chain, their_posted);
        if (their_posted != 0 && blueflame_written(queues, value)) coverage.count("BlueFlame post");
        if (crosses_ring_end(queues, first_wqebb, queues.send.tracking().producer_index)) coverage.count("ring wrap");
        REQUIRE(retire_posted(queues, cqes, first_wqebb, their_posted));
    }
    MESSAGE(calls, " random chains on wqe_cnt ", queues.send_wqe_count, ", max_send_sge ", queues.caps.max_send_sge,
            ", max_inline_data ", queues.caps.max_inline_data, ": ", coverage.summary());
    // The coverage claimed above, by count: every opcode and flag, BlueFlame, ring wraps, and
    // the refusals by reason.
    const std::string missing = coverage.shortfalls({
        {"opcode RDMA_WRITE", calls / 5},          {"opcode RDMA_WRITE_WITH_IMM", calls / 5},
        {"opcode SEND", calls / 5},                {"opcode SEND_WITH_IMM", calls / 5},
        {"opcode RDMA_READ", calls / 5},           {"opcode ATOMIC_CMP_AND_SWP", calls / 5},
        {"opcode ATOMIC_FETCH_AND_ADD", calls / 5}, {"flag SIGNALED", calls / 5},
        {"flag SOLICITED", calls / 5},             {"flag FENCE", calls / 5},
        {"flag INLINE", calls / 5},                {"BlueFlame post", calls / 8},
        {"ring wrap", calls / 400},                {"refusal: too many SGEs", calls / 100},
        {"refusal: inline too large", calls / 100}, {"refusal after the first request", calls / 100},
    });
    CHECK_MESSAGE(missing.empty(), missing);
}

// Queue shapes: the golden vectors' (64 work requests, 4 SGEs, 256 bytes inline, as asked; libmlx5
// grants more), a small ring that wraps every few calls, no inline data asked and one SGE, many
// SGEs, and every WQE signaled.
constexpr Shape kShapes[] = {
    {64, 4, 256, false}, {8, 2, 64, false}, {32, 1, 0, false}, {16, 16, 200, false}, {64, 4, 256, true},
};

}  // namespace

TEST_CASE("the send encoder writes what the installed libmlx5 writes, for random chains of work requests") {
    std::uint64_t seed = 1;
    for (const Shape& shape : kShapes) run_random_chains(shape, seed++, 20000);
}
