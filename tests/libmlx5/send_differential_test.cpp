// The send encoder against libmlx5 itself, on random work requests (differential_queues.hpp):
// Debian's libmlx5, as installed, posts each random chain into its own send queue, SendQueue
// posts the same chain into a ring of the same shape, and every byte libmlx5 wrote must be
// what we wrote: the WQEs, the send doorbell record and the BlueFlame or doorbell register.
// The return code (0 or the errno) and the number of work requests accepted must agree too.
// The shipped golden vectors pin chosen cases; this covers what nobody chose: opcodes, flag
// sets, SGE counts and lengths, inline sizes near the limit, refusals anywhere in a chain, ring
// wrap.
//
// Only the WQEBBs of the WQEs posted are compared (first_posted_difference). Where we differ from libmlx5 v44 on purpose (docs/ARCHITECTURE.md): when a chain is refused after
// its first request, libmlx5 rings the doorbell with the refused request's control segment; we
// ring it with the last WQE posted. The register is not compared then.
#include <doctest/doctest.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/differential_queues.hpp"
#include "tools/golden_check/post_errno.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

void run_random_chains(const ibv_qp_cap& wanted, bool signal_all, std::uint64_t seed, std::uint32_t calls) {
    DifferentialQueues queues;
    const std::string error = open_differential_queues(queues, wanted, signal_all);
    REQUIRE_MESSAGE(error.empty(), error);
    INFO("queue: wqe_cnt ", queues.send_wqe_count, ", max_send_sge ", queues.caps.max_send_sge, ", max_inline_data ",
         queues.caps.max_inline_data, ", sq_sig_all ", signal_all, ", BlueFlame size ", queues.blueflame_size, "; seed ", seed);
    std::mt19937_64 random(seed);
    std::vector<std::uint8_t> payload(8192);
    for (std::uint8_t& byte : payload) byte = static_cast<std::uint8_t>(random());
    std::uint32_t refused = 0, blueflame_calls = 0, cqes = 0;
    for (std::uint32_t call = 0; call < calls; ++call) {
        SendChain chain = random_send_chain(random, queues.caps, payload);
        CAPTURE(call);
        CAPTURE(chain.description);
        const auto value = static_cast<std::uint8_t>(random());
        poison_send_side(queues, value);
        const std::uint32_t first_wqebb = queues.send.tracking().producer_index;

        ibv_send_wr* bad = nullptr;
        const int their_result = ibv_post_send(queues.qp, chain.verbs.data(), &bad);
        const std::uint32_t their_posted = accepted(bad, chain.verbs);
        std::uint32_t our_posted = 0;
        const mlx5::PostResult our_result = queues.send.post(chain.ours.data(), static_cast<std::uint32_t>(chain.ours.size()), &our_posted);
        REQUIRE(rdmachan::golden::send_errno_of(our_result) == their_result);
        REQUIRE(our_posted == their_posted);
        refused += their_result != 0;
        // The register is not compared after a refusal past the first request (above).
        const bool refused_after_first = their_result != 0 && their_posted != 0;
        const std::string difference = send_side_difference(queues, first_wqebb, value, !refused_after_first);
        REQUIRE_MESSAGE(difference.empty(), difference);
        if (!refused_after_first && their_posted == 1 && queues.their_blueflame[0] != value && queues.their_blueflame[8] != value)
            ++blueflame_calls;
        REQUIRE(retire_posted(queues, cqes, first_wqebb, their_posted));
    }
    MESSAGE(calls, " random chains, ", refused, " refused (at their first or a later request), ", blueflame_calls,
            " single WQEs checked in the BlueFlame register");
    CHECK(refused > 0);
    CHECK(refused < calls / 2);
}

// Queue shapes: the golden vectors' (64 work requests, 4 SGEs, 256 bytes inline, as asked; libmlx5
// grants more), a small ring that wraps every few calls, no inline data asked and one SGE, many
// SGEs, and every WQE signaled.
struct Shape {
    std::uint32_t max_send_wr, max_send_sge, max_inline_data;
    bool signal_all;
};
constexpr Shape kShapes[] = {
    {64, 4, 256, false}, {8, 2, 64, false}, {32, 1, 0, false}, {16, 16, 200, false}, {64, 4, 256, true},
};

}  // namespace

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
