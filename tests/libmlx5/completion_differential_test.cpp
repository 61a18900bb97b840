// Receive posting and CQE decoding against libmlx5 itself (differential_queues.hpp). Random
// receive chains go to libmlx5's receive queue and to ReceiveQueue: the return code, the number
// accepted, the doorbell record and every byte libmlx5 wrote into the receive WQEs must agree.
// Random send chains go to both send queues. Then random CQEs for the work outstanding — a
// requester completion retiring one to three WQEs or a requester error with any syndrome, a
// responder completion of each kind (send, send with immediate or invalidate, write with
// immediate: random byte count, immediate, sender QPN, SL, GRH bits, SLID, path bits, solicited
// bit) or a responder error — are written into both CQ rings, and libmlx5's ibv_poll_cq and
// CompletionQueue::poll, with random capacities, must return the same number of completions,
// the same value in every ibv_wc field libmlx5 wrote, and the same CQ doorbell record. A refused
// post must refuse the same request for the same reason (libmlx5_refusals.hpp): a full receive
// queue or SRQ, too many SGEs, and on the send side too many SGEs or inline data too large. What
// a run reached is required by count (Coverage): errors of both sides, every responder kind,
// SRQ completions out of order, full queues.
//
// Fields libmlx5 wrote: the ibv_wc array is filled with a random byte before each poll, and a
// field still holding it was not written (a field written with that value is missed, a
// different one each poll). CQEs we decode differently on purpose (docs/ARCHITECTURE.md:
// scatter-to-CQE formats, resize and unknown-QP CQEs) are not generated; responder CQEs name
// the receive libmlx5 v44 takes next (it assumes order, we read wqe_counter).
#include <doctest/doctest.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/coverage.hpp"
#include "tests/libmlx5/cqe_entries.hpp"
#include "tests/libmlx5/differential_queues.hpp"
#include "tests/libmlx5/libmlx5_refusals.hpp"
#include "tests/libmlx5/scoped_environment.hpp"
#include "tools/golden_check/post_errno.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

constexpr std::uint8_t kSyndromes[] = {
    mlx5::kSyndromeLocalLength,          mlx5::kSyndromeLocalQpOperation, mlx5::kSyndromeLocalProtection,
    mlx5::kSyndromeWorkRequestFlushed,   mlx5::kSyndromeMemoryWindowBind, mlx5::kSyndromeBadResponse,
    mlx5::kSyndromeLocalAccess,          mlx5::kSyndromeRemoteInvalidRequest, mlx5::kSyndromeRemoteAccess,
    mlx5::kSyndromeRemoteOperation,      mlx5::kSyndromeTransportRetryExceeded, mlx5::kSyndromeRnrRetryExceeded,
    mlx5::kSyndromeRemoteAborted,
};

struct SendWqe {
    std::uint32_t start;     // its first WQEBB
    std::uint8_t opcode;     // the WQE opcode
};

struct State {
    DifferentialQueues queues;
    std::mt19937_64 random;
    std::deque<SendWqe> sends;           // posted, not completed, in order
    std::deque<std::uint32_t> receives;  // receive indices posted, not completed, in order
    std::uint32_t cqes = 0;              // CQEs written
    std::uint64_t compared_fields = 0;
    std::uint32_t completions = 0, receive_posts = 0;
    Coverage coverage;
    std::string written;  // the CQEs written since the last poll, for a failure message
    std::vector<std::uint8_t> payload;
    std::uint64_t below(std::uint64_t bound) { return bound == 0 ? 0 : random() % bound; }
};

// Writes the same CQE into both rings at the next index, and says so in the failure log.
void write_cqe(State& state, std::uint8_t* cqe, std::uint8_t opcode_and_flags) {
    write_cqe_to_both(state.queues, state.cqes, cqe, opcode_and_flags);
    ++state.cqes;
    char entry[64];
    std::snprintf(entry, sizeof entry, " [opcode %u syndrome 0x%02x wqe_counter %u]", opcode_and_flags >> 4,
                  cqe[mlx5::kCqeSyndrome], static_cast<unsigned>(cqe[mlx5::kCqeWqeCounter]) << 8 | cqe[mlx5::kCqeWqeCounter + 1]);
    state.written += entry;
}

// Empty when libmlx5 refused what its code, as modelled, refuses, and our post refused the same
// request for the same reason; counts the refusal by reason.
std::string compare_refusals(const char* queue, const std::string& what, State& state, const Refusal& expected, int their_result,
                             std::uint32_t their_posted, std::uint32_t requests, mlx5::PostResult our_result,
                             std::uint32_t our_posted, int (*errno_of)(mlx5::PostResult)) {
    const std::string derivation = check_derivation(expected, their_result, their_posted, requests, errno_of);
    if (!derivation.empty()) return what + ": " + derivation;
    const std::string refusal = refusal_difference(expected, our_result, our_posted);
    if (!refusal.empty()) return what + ": " + refusal;
    if (expected.reason != mlx5::PostResult::ok) state.coverage.count(std::string(queue) + " refusal: " + reason_name(expected.reason));
    return {};
}

// Empty if libmlx5's SRQ ring and ours hold the same bytes, else where they first differ.
std::string compare_shared_receive_rings(const DifferentialQueues& queues) {
    const std::uint8_t* theirs = queues.their_shared_receive.bytes;
    const std::uint8_t* ours = queues.our_shared_receive.bytes;
    const auto [their_byte, our_byte] = std::mismatch(theirs, theirs + queues.their_shared_receive.length, ours);
    if (their_byte == theirs + queues.their_shared_receive.length) return {};
    const long at = their_byte - theirs;
    return "the SRQ rings differ at WQE " + std::to_string(at / queues.srq_stride) + " byte " + std::to_string(at % queues.srq_stride) +
           ": libmlx5 " + hex_around(theirs, at, queues.their_shared_receive.length) + ", ours " +
           hex_around(ours, at, queues.their_shared_receive.length);
}

// SRQ: the WQEs a post takes are the free list's from its head. The ring is not poisoned (the
// list lives in it); both rings start equal and must stay equal, byte for byte.
std::string post_shared_receives(State& state) {
    DifferentialQueues& queues = state.queues;
    ibv_qp_cap caps = queues.caps;
    caps.max_recv_sge = queues.srq_max_sge;
    ReceiveChain chain = random_receive_chain(state.random, caps);
    std::vector<std::uint32_t> taken;
    for (std::uint32_t index = queues.shared_receive.head(), i = 0; i < chain.ours.size() && index != queues.shared_receive.tail(); ++i) {
        taken.push_back(index);
        const std::uint8_t* wqe = queues.our_shared_receive.bytes + static_cast<std::size_t>(index) * queues.srq_stride;
        index = mlx5::load_big16(wqe + mlx5::kSrqNextWqeIndex);
    }
    const Refusal expected = libmlx5_shared_receive_refusal(chain.verbs, static_cast<std::uint32_t>(state.receives.size()),
                                                            queues.srq_wqe_count, queues.srq_max_sge);
    ibv_recv_wr* bad = nullptr;
    const int their_result = ibv_post_srq_recv(queues.srq, chain.verbs.data(), &bad);
    const std::uint32_t their_posted = accepted(bad, chain.verbs);
    std::uint32_t our_posted = 0;
    const mlx5::PostResult our_result =
        queues.shared_receive.post(chain.ours.data(), static_cast<std::uint32_t>(chain.ours.size()), &our_posted);
    const std::string refused = compare_refusals("SRQ", "SRQ post", state, expected, their_result, their_posted,
                                                 static_cast<std::uint32_t>(chain.verbs.size()), our_result, our_posted,
                                                 rdmachan::golden::receive_errno_of);
    if (!refused.empty()) return refused;
    if (queues.their_srq_doorbell_record[0] != queues.our_srq_doorbell_record[0]) return "SRQ doorbell records differ";
    const std::string rings = compare_shared_receive_rings(queues);
    if (!rings.empty()) return "after a post, " + rings;
    for (std::uint32_t i = 0; i < their_posted; ++i) state.receives.push_back(taken.at(i));
    ++state.receive_posts;
    return {};
}

std::string post_receives(State& state) {
    DifferentialQueues& queues = state.queues;
    if (queues.srq != nullptr) return post_shared_receives(state);
    ReceiveChain chain = random_receive_chain(state.random, queues.caps);
    const auto value = static_cast<std::uint8_t>(state.random());
    std::memset(queues.their_receive.bytes, value, queues.their_receive.length);
    std::memset(queues.our_receive.bytes, value, queues.our_receive.length);
    const std::uint32_t first = queues.receive.head();
    const Refusal expected = libmlx5_receive_refusal(chain.verbs, static_cast<std::uint32_t>(state.receives.size()),
                                                     {queues.caps.max_recv_wr, queues.caps.max_recv_sge, 0});
    ibv_recv_wr* bad = nullptr;
    const int their_result = ibv_post_recv(queues.qp, chain.verbs.data(), &bad);
    const std::uint32_t their_posted = accepted(bad, chain.verbs);
    std::uint32_t our_posted = 0;
    const mlx5::PostResult our_result = queues.receive.post(chain.ours.data(), static_cast<std::uint32_t>(chain.ours.size()), &our_posted);
    const std::string refused = compare_refusals("receive", "receive post", state, expected, their_result, their_posted,
                                                 static_cast<std::uint32_t>(chain.verbs.size()), our_result, our_posted,
                                                 rdmachan::golden::receive_errno_of);
    if (!refused.empty()) return refused;
    if (queues.their_doorbell_record[0] != queues.our_doorbell_record[0]) return "receive doorbell records differ";
    for (std::uint32_t index = first; index != queues.receive.head(); ++index) {
        const std::size_t at = static_cast<std::size_t>(index & (queues.receive_wqe_count - 1)) * queues.receive_stride;
        const long difference = first_difference(queues.their_receive.bytes + at, queues.our_receive.bytes + at, queues.receive_stride, value);
        if (difference >= 0)
            return "receive WQE " + std::to_string(index) + " byte " + std::to_string(difference) + ": libmlx5 " +
                   hex_around(queues.their_receive.bytes + at, difference, queues.receive_stride) + ", ours " +
                   hex_around(queues.our_receive.bytes + at, difference, queues.receive_stride);
        state.receives.push_back(index);
    }
    ++state.receive_posts;
    return {};
}

std::string post_sends(State& state) {
    DifferentialQueues& queues = state.queues;
    SendChain chain = random_send_chain(state.random, queues.caps, state.payload);
    std::uint32_t start = queues.send.tracking().producer_index;
    const Refusal expected = libmlx5_send_refusal(chain.verbs, static_cast<std::uint32_t>(state.sends.size()),
                                                  {queues.caps.max_send_wr, queues.caps.max_send_sge, queues.caps.max_inline_data});
    ibv_send_wr* bad = nullptr;
    const int their_result = ibv_post_send(queues.qp, chain.verbs.data(), &bad);
    const std::uint32_t their_posted = accepted(bad, chain.verbs);
    std::uint32_t our_posted = 0;
    const mlx5::PostResult our_result = queues.send.post(chain.ours.data(), static_cast<std::uint32_t>(chain.ours.size()), &our_posted);
    const std::string refused = compare_refusals("send", "send post (" + chain.description + ")", state, expected, their_result,
                                                 their_posted, static_cast<std::uint32_t>(chain.verbs.size()), our_result,
                                                 our_posted, rdmachan::golden::send_errno_of);
    if (!refused.empty()) return refused;
    for (std::uint32_t i = 0; i < their_posted; ++i) {
        const std::uint8_t* ctrl = queues.their_send.bytes + static_cast<std::size_t>(start & (queues.send_wqe_count - 1)) * 64;
        state.sends.push_back({start, ctrl[3]});
        start += ((ctrl[7] & 0x3f) * 16 + 63) / 64;
    }
    if (start != queues.send.tracking().producer_index) return "the WQEs posted do not end at our producer index";
    return {};
}

// A CQE of random bytes naming our QP (by user index and QPN, `top_byte` above the QPN) and the
// WQE at `wqe_counter`; the caller sets the rest.
void start_cqe(State& state, std::uint8_t (&cqe)[64], std::uint32_t top_byte, std::uint32_t wqe_counter) {
    for (std::uint8_t& byte : cqe) byte = static_cast<std::uint8_t>(state.random());
    name_cqe(cqe, state.queues.user_index, top_byte | state.queues.qp->qp_num, wqe_counter);
}

void write_requester_completion(State& state) {
    const std::uint32_t retired = 1 + static_cast<std::uint32_t>(state.below(std::min<std::size_t>(3, state.sends.size())));
    SendWqe named{};
    for (std::uint32_t i = 0; i < retired; ++i) {
        named = state.sends.front();
        state.sends.pop_front();
    }
    std::uint8_t cqe[64];
    start_cqe(state, cqe, static_cast<std::uint32_t>(named.opcode) << 24, named.start);
    if (state.below(4) == 0) {
        cqe[mlx5::kCqeSyndrome] = state.below(5) == 0 ? static_cast<std::uint8_t>(state.random())
                                                      : kSyndromes[state.below(std::size(kSyndromes))];
        write_cqe(state, cqe, mlx5::kCqeRequesterError << 4);
        state.coverage.count("requester error");
    } else {
        write_cqe(state, cqe, static_cast<std::uint8_t>(mlx5::kCqeRequester << 4));
        state.coverage.count("requester success");
    }
}

void write_responder_completion(State& state) {
    // An RQ's receives complete in order; an SRQ's in any order.
    const std::size_t pick = state.queues.srq != nullptr ? state.below(state.receives.size()) : 0;
    if (pick != 0) state.coverage.count("SRQ completion out of order");
    const std::uint32_t index = state.receives[pick];
    state.receives.erase(state.receives.begin() + static_cast<std::ptrdiff_t>(pick));
    std::uint8_t cqe[64];
    // The top byte of sop_drop_qpn is not the QPN: random.
    start_cqe(state, cqe, static_cast<std::uint32_t>(state.random() & 0xff000000u), index);
    const std::uint8_t solicited = state.below(2) == 0 ? 0x02 : 0;
    if (state.below(5) == 0) {
        cqe[mlx5::kCqeSyndrome] = state.below(5) == 0 ? static_cast<std::uint8_t>(state.random())
                                                      : kSyndromes[state.below(std::size(kSyndromes))];
        // Remote-aborted with vendor syndrome 0x93 is an on-demand-paging page fault, which
        // libmlx5 handles inside the poll (it reposts the SRQ WQE); we register no ODP memory and
        // do not handle it (docs/ARCHITECTURE.md), and a NIC sends it only for ODP memory.
        if (cqe[mlx5::kCqeSyndrome] == mlx5::kSyndromeRemoteAborted && cqe[mlx5::kCqeVendorSyndrome] == 0x93)
            cqe[mlx5::kCqeVendorSyndrome] = 0x92;
        write_cqe(state, cqe, mlx5::kCqeResponderError << 4);
        state.coverage.count("responder error");
        return;
    }
    struct Kind {
        std::uint8_t opcode;
        const char* name;
    };
    constexpr Kind kinds[] = {{mlx5::kCqeResponderWriteImmediate, "responder write with immediate"},
                              {mlx5::kCqeResponderSend, "responder send"},
                              {mlx5::kCqeResponderSendImmediate, "responder send with immediate"},
                              {mlx5::kCqeResponderSendInvalidate, "responder send with invalidate"}};
    const Kind& kind = kinds[state.below(std::size(kinds))];
    // Format 0 (bits 3:2): no data scattered into the CQE.
    write_cqe(state, cqe, static_cast<std::uint8_t>(kind.opcode << 4 | solicited));
    state.coverage.count(kind.name);
}

std::string poll_both(State& state) {
    DifferentialQueues& queues = state.queues;
    for (;;) {
        const auto capacity = static_cast<std::uint32_t>(1 + state.below(6));
        const auto poison = static_cast<std::uint8_t>(state.random());
        ibv_wc theirs[6];
        mlx5::Completion ours[6];
        std::uint32_t our_count = 0;
        const std::string polled = poll_both_once(queues, capacity, poison, theirs, ours, our_count);
        if (!polled.empty()) return polled + "; CQEs written:" + state.written;
        // A completion gives its SRQ WQE back to the free list: the links must agree.
        if (queues.srq != nullptr) {
            const std::string rings = compare_shared_receive_rings(queues);
            if (!rings.empty()) return "after a poll, " + rings;
        }
        for (std::uint32_t i = 0; i < our_count; ++i) {
            const std::string difference = compare_completion(theirs[i], ours[i], poison, state.compared_fields);
            if (!difference.empty()) return "completion " + std::to_string(i) + " of a poll: " + difference;
            ++state.completions;
        }
        if (our_count == 0) {
            state.written.clear();
            return {};
        }
    }
}

// `cqe_size`: the CQE size the run must get (libmlx5 takes it from MLX5_CQE_SIZE).
void run(const ibv_qp_cap& wanted, std::uint64_t seed, std::uint32_t steps, std::uint32_t cqe_size,
         std::uint32_t shared_receive_wr = 0) {
    State state;
    const std::string error = open_differential_queues(state.queues, wanted, false, shared_receive_wr);
    REQUIRE_MESSAGE(error.empty(), error);
    REQUIRE(state.queues.cqe_size == cqe_size);
    state.random.seed(seed);
    state.payload.resize(8192);
    for (std::uint8_t& byte : state.payload) byte = static_cast<std::uint8_t>(state.random());
    DifferentialQueues& queues = state.queues;
    INFO("queues: send wqe_cnt ", queues.send_wqe_count, ", receive wqe_cnt ", queues.receive_wqe_count, " stride ",
         queues.receive_stride, ", SRQ ", queues.srq_wqe_count, " of stride ", queues.srq_stride, " and ", queues.srq_max_sge,
         " SGEs, max_recv_sge ", queues.caps.max_recv_sge, ", CQEs ", queues.cqe_count, " of ", queues.cqe_size, " bytes; seed ", seed);
    bool filling = false;
    for (std::uint32_t step = 0; step < steps; ++step) {
        CAPTURE(step);
        std::string failure;
        // Now and then a stretch of mostly receive posts, which fills the receive queue or SRQ.
        if (state.below(filling ? 50 : 1000) == 0) filling = !filling;
        const std::uint64_t choice = filling && state.below(4) != 0 ? 0 : state.below(4);
        if (choice == 0) {
            failure = post_receives(state);
        } else if (choice == 1 && state.sends.size() + 4 < queues.caps.max_send_wr) {
            failure = post_sends(state);
        } else {
            // 1 to 4 CQEs for what is outstanding, then polls until the CQ is empty.
            const auto count = static_cast<std::uint32_t>(1 + state.below(4));
            for (std::uint32_t i = 0; i < count; ++i) {
                const bool requester = !state.sends.empty() && (state.receives.empty() || state.below(2) == 0);
                if (requester) {
                    write_requester_completion(state);
                } else if (!state.receives.empty()) {
                    write_responder_completion(state);
                }
            }
            failure = poll_both(state);
        }
        REQUIRE_MESSAGE(failure.empty(), failure);
    }
    MESSAGE(steps, " steps: ", state.receive_posts, " receive posts compared, ", state.completions, " completions with ",
            state.compared_fields, " fields compared; ", state.coverage.summary());
    CHECK(state.completions > steps / 4);
    // The coverage claimed above, by count.
    const bool shared = queues.srq != nullptr;
    std::vector<std::pair<std::string, std::uint32_t>> minimums = {
        {"requester success", steps / 10},
        {"requester error", steps / 40},
        {"responder error", steps / 40},
        {"responder write with immediate", steps / 40},
        {"responder send", steps / 40},
        {"responder send with immediate", steps / 40},
        {"responder send with invalidate", steps / 40},
        {shared ? "SRQ refusal: queue full" : "receive refusal: queue full", steps / 200},
        {shared ? "SRQ refusal: too many SGEs" : "receive refusal: too many SGEs", steps / 200},
        {"send refusal: too many SGEs", steps / 200},
        {"send refusal: inline too large", steps / 200},
    };
    if (shared) minimums.push_back({"SRQ completion out of order", steps / 20});
    const std::string missing = state.coverage.shortfalls(minimums);
    CHECK_MESSAGE(missing.empty(), missing);
}

}  // namespace

TEST_CASE("receive posts and CQE decoding agree with the installed libmlx5, on random work and CQEs") {
    ibv_qp_cap caps{};
    caps.max_send_wr = 64;
    caps.max_send_sge = 4;
    caps.max_inline_data = 64;
    caps.max_recv_wr = 32;
    caps.max_recv_sge = 4;
    run(caps, 11, 20000, 64);
    caps.max_recv_wr = 8;
    caps.max_recv_sge = 1;
    caps.max_send_wr = 16;
    run(caps, 12, 20000, 64);
}

TEST_CASE("the same with 128-byte CQEs") {
    // libmlx5 sizes a new CQ's entries by MLX5_CQE_SIZE (64 unless set); the run requires 128.
    const ScopedEnvironment cqe_size("MLX5_CQE_SIZE", "128");
    ibv_qp_cap caps{};
    caps.max_send_wr = 32;
    caps.max_send_sge = 2;
    caps.max_inline_data = 64;
    caps.max_recv_wr = 16;
    caps.max_recv_sge = 2;
    run(caps, 13, 20000, 128);
}

TEST_CASE("SRQ posts, their free list and their completions, in any order, agree with the installed libmlx5") {
    ibv_qp_cap caps{};
    caps.max_send_wr = 32;
    caps.max_send_sge = 2;
    caps.max_inline_data = 64;
    caps.max_recv_sge = 3;
    run(caps, 14, 20000, 64, 31);
    caps.max_recv_sge = 1;
    run(caps, 15, 20000, 64, 7);
}
