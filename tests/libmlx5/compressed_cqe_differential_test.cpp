// Compressed CQE sessions (transport/mlx5/compressed_session.hpp) against the installed libmlx5.
// libmlx5 v44 creates compressed CQs but never decodes a session (its poll reads format 3 as
// inline scatter), so it reads the same completions uncompressed: random work is posted to both
// queue pairs (differential_queues.hpp), then batches of CQEs for it are written into both CQ
// rings, into ours as compressed sessions and plain CQEs, into libmlx5's each session as the N
// CQEs it stands for. A session in our ring is laid out as the driver reads it: the title (format
// 3, byte_cnt N, the fields the CQEs share), the arrays of eight mini CQEs in the title's next
// entry and in every eighth entry after it, and in the entries between what a previous pass left:
// an op_own that reads as software's on the next pass unless the poller rewrites it. Mini CQEs in
// each format the CQ can be created with: a requester session's carry WQE counter and opcode, a
// responder session's the RX hash or the checksum and stride index (the responder's WQE counter is
// the title's plus the position). Both sides are polled with random capacities until empty: the
// same number of completions, every ibv_wc field libmlx5 wrote and the same CQ doorbell record
// (the consumer index advances by N per session).
//
// The coverage is required by count: sessions of each format, sessions of several arrays,
// sessions spanning the ring end, sessions followed at once by an uncompressed CQE and by another
// session, polls that end inside a session (also where the next mini CQE's array is not read
// yet), and empty polls at an entry a session left behind on the previous pass. Ours ends a poll
// before a session that follows other CQEs (completion_queue.hpp): where libmlx5's one poll
// returned n completions, ours are polled until they returned n, and each of those polls must
// return some. Responder
// sessions use a receive queue: an SRQ's WQEs are not consumed in index order, which the derived
// WQE counter assumes.
#include <doctest/doctest.h>
#include <infiniband/verbs.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/cqe_entries.hpp"
#include "tests/libmlx5/differential_queues.hpp"
#include "transport/mlx5/compressed_session.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

enum SessionFormat : std::uint32_t { kRequester, kResponderHash, kResponderChecksum, kFormats };
const char* const kFormatNames[] = {"requester (WQE counter and opcode)", "responder, RX hash", "responder, checksum and stride index"};

struct Coverage {
    std::uint64_t sessions[kFormats] = {};
    std::uint64_t several_arrays = 0;   // N > 8
    std::uint64_t spanning_end = 0;     // entries on both sides of the ring end
    std::uint64_t interrupted = 0;      // followed at once by an uncompressed CQE
    std::uint64_t back_to_back = 0;     // followed at once by another session's title
    std::uint64_t split_polls = 0;      // a poll returned inside a session
    std::uint64_t split_at_array = 0;   // ... where the next mini CQE's array entry was not read yet
    std::uint64_t stale_entries = 0;    // an empty poll at an entry a session left on the previous pass
    std::uint64_t stopped_before_session = 0;  // our poll ended before a session libmlx5's went on into
    std::uint64_t session_completions = 0, completions = 0, fields = 0;
};

struct SendWqe {
    std::uint32_t start;  // its first WQEBB
    std::uint8_t opcode;  // the WQE opcode
};

struct Session {
    std::uint32_t start, size;
};

struct State {
    DifferentialQueues queues;
    std::mt19937_64 random;
    std::deque<SendWqe> sends;           // posted, not completed, in order
    std::deque<std::uint32_t> receives;  // receive indices posted, not completed, in order
    std::uint32_t cqes = 0;              // ring entries written (free running)
    std::vector<Session> sessions;       // written since the last poll
    std::vector<std::uint32_t> written_at;  // per entry: the index last written there
    std::vector<bool> session_body;         // per entry: a session's non-title entry last
    std::vector<std::uint8_t> payload;
    Coverage coverage;
    std::string log;  // what was written since the last poll, for a failure message
    std::uint64_t below(std::uint64_t bound) { return bound == 0 ? 0 : random() % bound; }
};

std::uint8_t* their_ring(State& state) { return state.queues.their_completions.bytes; }
std::uint8_t* our_ring(State& state) { return state.queues.our_completions.bytes; }

void note_written(State& state, std::uint32_t index, bool body) {
    const std::uint32_t entry = index & (state.queues.cqe_count - 1);
    state.written_at[entry] = index;
    state.session_body[entry] = body;
}

// A CQE of random bytes naming our QP and the WQE at `wqe_counter`.
void random_cqe(State& state, std::uint8_t (&cqe)[64], std::uint32_t top_byte, std::uint32_t wqe_counter) {
    for (std::uint8_t& byte : cqe) byte = static_cast<std::uint8_t>(state.random());
    name_cqe(cqe, state.queues.user_index, top_byte | state.queues.qp->qp_num, wqe_counter);
}

// The same uncompressed CQE into both rings.
void write_plain(State& state, std::uint8_t (&cqe)[64], std::uint8_t opcode) {
    const DifferentialQueues& queues = state.queues;
    cqe[mlx5::kCqeOpOwn] = static_cast<std::uint8_t>(opcode << 4 | (cqe[mlx5::kCqeOpOwn] & 0x02) |
                                                     owner_of(state.cqes, queues.cqe_count));
    put_entry(their_ring(state), queues.cqe_count, queues.cqe_size, state.cqes, cqe);
    put_entry(our_ring(state), queues.cqe_count, queues.cqe_size, state.cqes, cqe);
    note_written(state, state.cqes, false);
    ++state.cqes;
    state.log += " plain(" + std::to_string(opcode) + ")";
}

void write_requester(State& state) {
    const auto retired = 1 + static_cast<std::uint32_t>(state.below(std::min<std::size_t>(3, state.sends.size())));
    SendWqe named{};
    for (std::uint32_t i = 0; i < retired; ++i) {
        named = state.sends.front();
        state.sends.pop_front();
    }
    std::uint8_t cqe[64];
    random_cqe(state, cqe, static_cast<std::uint32_t>(named.opcode) << 24, named.start);
    write_plain(state, cqe, mlx5::kCqeRequester);
}

constexpr std::uint8_t kResponderKinds[] = {mlx5::kCqeResponderWriteImmediate, mlx5::kCqeResponderSend,
                                            mlx5::kCqeResponderSendImmediate, mlx5::kCqeResponderSendInvalidate};

void write_responder(State& state) {
    const std::uint32_t index = state.receives.front();
    state.receives.pop_front();
    std::uint8_t cqe[64];
    random_cqe(state, cqe, static_cast<std::uint32_t>(state.random() & 0xff000000u), index);
    write_plain(state, cqe, kResponderKinds[state.below(std::size(kResponderKinds))]);
}

// A session of `size` CQEs in format `format`: ours compressed, libmlx5's expanded.
void write_session(State& state, SessionFormat format, std::uint32_t size) {
    DifferentialQueues& queues = state.queues;
    const std::uint32_t count = queues.cqe_count;
    std::uint8_t title[64];
    std::vector<std::uint8_t> minis(static_cast<std::size_t>(size + 7) / 8 * 64);
    for (std::uint8_t& byte : minis) byte = static_cast<std::uint8_t>(state.random());
    const std::uint8_t opcode = format == kRequester ? static_cast<std::uint8_t>(mlx5::kCqeRequester) : kResponderKinds[state.below(std::size(kResponderKinds))];
    std::vector<std::uint32_t> responder_indices;
    if (format == kRequester) {
        random_cqe(state, title, 0, 0);
        for (std::uint32_t i = 0; i < size; ++i) {
            // Each CQE retires one to three WQEs and names the last, leaving one for each CQE after it.
            const std::size_t spare = state.sends.size() - (size - i);
            const auto retired = 1 + static_cast<std::uint32_t>(state.below(std::min<std::size_t>(3, spare + 1)));
            SendWqe named{};
            for (std::uint32_t r = 0; r < retired; ++r) {
                named = state.sends.front();
                state.sends.pop_front();
            }
            std::uint8_t* const mini = &minis[i * 8];
            mlx5::store_big16(mini + mlx5::kMiniCqeWqeCounter, static_cast<std::uint16_t>(named.start));
            mini[mlx5::kMiniCqeWqeOpcode] = named.opcode;
        }
        std::memcpy(title + mlx5::kCqeWqeCounter, &minis[mlx5::kMiniCqeWqeCounter], 2);
        title[mlx5::kCqeSopDropQpn] = minis[mlx5::kMiniCqeWqeOpcode];
    } else {
        random_cqe(state, title, static_cast<std::uint32_t>(state.random() & 0xff000000u), state.receives.front());
        for (std::uint32_t i = 0; i < size; ++i) {
            responder_indices.push_back(state.receives.front());
            state.receives.pop_front();
        }
    }
    const std::uint8_t solicited = title[mlx5::kCqeOpOwn] & 0x02;
    const std::uint32_t start = state.cqes;

    // libmlx5's ring: the N CQEs, each the title with its mini CQE's fields, in format 0.
    for (std::uint32_t i = 0; i < size; ++i) {
        std::uint8_t cqe[64];
        std::memcpy(cqe, title, 64);
        const std::uint8_t* const mini = &minis[i * 8];
        std::memcpy(cqe + mlx5::kCqeByteCount, mini + mlx5::kMiniCqeByteCount, 4);
        if (format == kRequester) {
            std::memcpy(cqe + mlx5::kCqeWqeCounter, mini + mlx5::kMiniCqeWqeCounter, 2);
            cqe[mlx5::kCqeSopDropQpn] = mini[mlx5::kMiniCqeWqeOpcode];
        } else {
            mlx5::store_big16(cqe + mlx5::kCqeWqeCounter, static_cast<std::uint16_t>(responder_indices[i]));
        }
        cqe[mlx5::kCqeOpOwn] = static_cast<std::uint8_t>(opcode << 4 | solicited | owner_of(start + i, count));
        put_entry(their_ring(state), count, queues.cqe_size, start + i, cqe);
    }

    // Ours: the entries after the title first (arrays, and what a previous pass left between
    // them: a plain CQE owned by software on the entry's next pass), the title last.
    for (std::uint32_t i = 1; i < size; ++i) {
        std::uint8_t entry[64];
        if (i == 1 || i % 8 == 0) {
            std::memcpy(entry, &minis[(i == 1 ? 0 : i / 8) * 64], 64);
        } else {
            for (std::uint8_t& byte : entry) byte = static_cast<std::uint8_t>(state.random());
            entry[63] = static_cast<std::uint8_t>(state.below(5) << 4 | (owner_of(start + i, count) ^ 1));
        }
        std::uint8_t first_half[64];
        for (std::uint8_t& byte : first_half) byte = static_cast<std::uint8_t>(state.random());
        put_entry(our_ring(state), count, queues.cqe_size, start + i, entry, first_half);
        note_written(state, start + i, true);
    }
    mlx5::store_big32(title + mlx5::kCqeByteCount, size);
    title[mlx5::kCqeOpOwn] = static_cast<std::uint8_t>(opcode << 4 | mlx5::kCqeFormatMask | solicited | owner_of(start, count));
    put_entry(our_ring(state), count, queues.cqe_size, start, title);
    note_written(state, start, false);

    state.cqes += size;
    state.sessions.push_back({start, size});
    ++state.coverage.sessions[format];
    state.coverage.session_completions += size;
    if (size > 8) ++state.coverage.several_arrays;
    if (start / count != (start + size - 1) / count) ++state.coverage.spanning_end;
    state.log += " session(" + std::string(kFormatNames[format]) + ", " + std::to_string(size) + " at " + std::to_string(start) + ")";
}

// One poll of libmlx5's against as many of ours as it takes to return as many completions: ours
// ends a poll before a session that follows other CQEs, and every poll must return some.
std::string poll_both(State& state) {
    DifferentialQueues& queues = state.queues;
    auto resolve = [&queues](std::uint32_t qpn, std::uint32_t) -> mlx5::CompletionTarget* {
        return qpn == queues.qp->qp_num ? &queues.target : nullptr;
    };
    for (;;) {
        const auto capacity = static_cast<std::uint32_t>(1 + state.below(state.below(4) == 0 ? 40 : 6));
        const auto poison = static_cast<std::uint8_t>(state.random());
        ibv_wc theirs[40];
        std::memset(theirs, poison, sizeof theirs);
        mlx5::Completion ours[40];
        const int their_count = ibv_poll_cq(queues.device.cq, static_cast<int>(capacity), theirs);
        if (their_count < 0) return "ibv_poll_cq failed";
        const auto wanted = static_cast<std::uint32_t>(their_count);
        std::uint32_t our_count = 0;
        do {
            const std::uint32_t polled = queues.completions.poll(ours + our_count, std::max(wanted, 1u) - our_count, resolve);
            if (polled == 0) break;
            our_count += polled;
            if (our_count < wanted) ++state.coverage.stopped_before_session;
            const std::uint32_t consumer = queues.completions.consumer_index();
            for (const Session& session : state.sessions) {
                const std::uint32_t taken = consumer - session.start;
                if (taken == 0 || taken >= session.size) continue;
                ++state.coverage.split_polls;
                if (taken % 8 == 0) ++state.coverage.split_at_array;
            }
        } while (our_count < wanted);
        if (our_count != wanted)
            return "poll of " + std::to_string(capacity) + " at consumer index " +
                   std::to_string(queues.completions.consumer_index() - our_count) + ": libmlx5 returned " +
                   std::to_string(their_count) + ", ours " + std::to_string(our_count) + "; written:" + state.log;
        if (queues.their_cq_doorbell_record[0] != queues.our_cq_doorbell_record[0]) return "CQ doorbell records differ";
        for (std::uint32_t i = 0; i < our_count; ++i) {
            const std::string difference = compare_completion(theirs[i], ours[i], poison, state.coverage.fields);
            if (!difference.empty())
                return "completion " + std::to_string(i) + " of a poll of " + std::to_string(capacity) + " ending at " +
                       std::to_string(queues.completions.consumer_index()) + ": " + difference + "; written:" + state.log;
            ++state.coverage.completions;
        }
        if (our_count == 0) {
            const std::uint32_t consumer = queues.completions.consumer_index();
            const std::uint32_t entry = consumer & (queues.cqe_count - 1);
            if (state.session_body[entry] && state.written_at[entry] + queues.cqe_count == consumer) ++state.coverage.stale_entries;
            state.sessions.clear();
            state.log.clear();
            return {};
        }
    }
}

std::string post_receives(State& state) {
    DifferentialQueues& queues = state.queues;
    const auto count = static_cast<std::uint32_t>(1 + state.below(8));
    for (std::uint32_t i = 0; i < count && state.receives.size() < queues.caps.max_recv_wr; ++i) {
        ibv_sge element{state.random() & 0xffffffffffffull, static_cast<std::uint32_t>(1 + state.below(4096)),
                        static_cast<std::uint32_t>(state.random())};
        ibv_recv_wr request{};
        request.wr_id = state.random();
        request.sg_list = &element;
        request.num_sge = 1;
        ibv_recv_wr* bad = nullptr;
        const mlx5::ScatterGatherElement our_element{element.addr, element.length, element.lkey};
        const mlx5::ReceiveWorkRequest ours{request.wr_id, &our_element, 1};
        std::uint32_t posted = 0;
        const std::uint32_t index = queues.receive.head();
        if (ibv_post_recv(queues.qp, &request, &bad) != 0 || queues.receive.post(&ours, 1, &posted) != mlx5::PostResult::ok)
            return "a receive was refused";
        state.receives.push_back(index);
    }
    return {};
}

std::string post_sends(State& state) {
    DifferentialQueues& queues = state.queues;
    SendChain chain = random_send_chain(state.random, queues.caps, state.payload);
    std::uint32_t start = queues.send.tracking().producer_index;
    ibv_send_wr* bad = nullptr;
    const int their_result = ibv_post_send(queues.qp, chain.verbs.data(), &bad);
    const std::uint32_t their_posted = accepted(bad, chain.verbs);
    std::uint32_t our_posted = 0;
    const mlx5::PostResult our_result = queues.send.post(chain.ours.data(), static_cast<std::uint32_t>(chain.ours.size()), &our_posted);
    if (their_posted != our_posted || (their_result == 0) != (our_result == mlx5::PostResult::ok))
        return "the send posts differ (" + chain.description + ")";
    for (std::uint32_t i = 0; i < their_posted; ++i) {
        const std::uint8_t* ctrl = queues.their_send.bytes + static_cast<std::size_t>(start & (queues.send_wqe_count - 1)) * 64;
        state.sends.push_back({start, ctrl[3]});
        start += ((ctrl[7] & 0x3f) * 16 + 63) / 64;
    }
    return {};
}

// One to six items, sessions and plain CQEs, for the work outstanding; then polls until empty.
std::string write_and_poll(State& state) {
    const auto items = static_cast<std::uint32_t>(1 + state.below(6));
    bool last_was_session = false;
    for (std::uint32_t item = 0; item < items; ++item) {
        const bool can_request = state.sends.size() >= 2, can_respond = state.receives.size() >= 2;
        const bool session = state.below(3) != 0 && (can_request || can_respond);
        if (session) {
            SessionFormat format = kRequester;
            if (!can_request || (can_respond && state.below(3) != 0)) format = state.below(2) == 0 ? kResponderHash : kResponderChecksum;
            const std::size_t available = format == kRequester ? state.sends.size() : state.receives.size();
            const auto longest = static_cast<std::uint32_t>(std::min<std::size_t>(available, 64));
            const auto size = static_cast<std::uint32_t>(2 + state.below(longest - 1));
            if (last_was_session) ++state.coverage.back_to_back;
            write_session(state, format, size);
            last_was_session = true;
            continue;
        }
        const bool request = !state.sends.empty() && (state.receives.empty() || state.below(2) == 0);
        if (request) {
            write_requester(state);
        } else if (!state.receives.empty()) {
            write_responder(state);
        } else {
            continue;
        }
        if (last_was_session) ++state.coverage.interrupted;
        last_was_session = false;
    }
    return poll_both(state);
}

Coverage run(const ibv_qp_cap& wanted, std::uint64_t seed, std::uint32_t steps) {
    State state;
    const std::string error = open_differential_queues(state.queues, wanted, false);
    REQUIRE_MESSAGE(error.empty(), error);
    DifferentialQueues& queues = state.queues;
    // Our CQ as created with compression; the ring has not been polled yet.
    mlx5::CompletionQueueRing ring = queues.completions.ring();
    ring.compressed_cqes = true;
    REQUIRE(queues.completions.consumer_index() == 0);
    queues.completions = mlx5::CompletionQueue(ring);
    state.written_at.assign(queues.cqe_count, 0xffffffffu);
    state.session_body.assign(queues.cqe_count, false);
    state.random.seed(seed);
    state.payload.resize(8192);
    for (std::uint8_t& byte : state.payload) byte = static_cast<std::uint8_t>(state.random());
    INFO("CQ of ", queues.cqe_count, " CQEs of ", queues.cqe_size, " bytes, send wqe_cnt ", queues.send_wqe_count, "; seed ", seed);
    for (std::uint32_t step = 0; step < steps; ++step) {
        CAPTURE(step);
        std::string failure;
        // Posts more often than CQEs are written, so that sessions can be long.
        if (state.below(2) == 0 && state.receives.size() + 8 <= queues.caps.max_recv_wr) {
            failure = post_receives(state);
        } else if (state.below(2) == 0 && state.sends.size() + 4 < queues.caps.max_send_wr) {
            failure = post_sends(state);
        } else {
            failure = write_and_poll(state);
        }
        REQUIRE_MESSAGE(failure.empty(), failure);
    }
    const Coverage& c = state.coverage;
    MESSAGE(steps, " steps, ", queues.cqe_size, "-byte CQEs: ", c.completions, " completions (", c.session_completions,
            " from sessions), ", c.fields, " fields compared; sessions: ", c.sessions[kRequester], " requester, ",
            c.sessions[kResponderHash], " hash, ", c.sessions[kResponderChecksum], " checksum; ", c.several_arrays,
            " of several arrays, ", c.spanning_end, " spanning the ring end, ", c.interrupted,
            " followed by an uncompressed CQE, ", c.back_to_back, " by another session; ", c.split_polls,
            " polls ending inside a session (", c.split_at_array, " before an unread array), ", c.stale_entries,
            " empty polls at an entry a session left on the previous pass; ", c.stopped_before_session,
            " polls of ours ended before a session");
    return state.coverage;
}

void require_coverage(const Coverage& c) {
    // About a third of what seeds 21 and 22 give: a generator that stops producing a case fails.
    for (std::uint32_t format = 0; format < kFormats; ++format) {
        CAPTURE(kFormatNames[format]);
        CHECK(c.sessions[format] >= 2500);
    }
    CHECK(c.several_arrays >= 2500);
    CHECK(c.spanning_end >= 35);
    CHECK(c.interrupted >= 3000);
    CHECK(c.back_to_back >= 3000);
    CHECK(c.split_polls >= 10000);
    CHECK(c.split_at_array >= 500);
    CHECK(c.stale_entries >= 5000);
    CHECK(c.stopped_before_session >= 2000);
    CHECK(c.session_completions * 2 >= c.completions);
}

ibv_qp_cap capabilities() {
    ibv_qp_cap caps{};
    caps.max_send_wr = 128;
    caps.max_send_sge = 2;
    caps.max_inline_data = 64;
    caps.max_recv_wr = 128;
    caps.max_recv_sge = 1;
    return caps;
}

}  // namespace

TEST_CASE("compressed CQE sessions decode to what libmlx5 reads from the same CQEs uncompressed") {
    require_coverage(run(capabilities(), 21, 100000));
}

TEST_CASE("the same with 128-byte CQEs") {
    // libmlx5 sizes a new CQ's entries by MLX5_CQE_SIZE (64 unless set).
    setenv("MLX5_CQE_SIZE", "128", 1);
    const Coverage coverage = run(capabilities(), 22, 100000);
    unsetenv("MLX5_CQE_SIZE");
    require_coverage(coverage);
}
