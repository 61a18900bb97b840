// Instruction counts of the mlx5 data path, measured with callgrind; see
// scripts/instruction_counts.sh and docs/PERFORMANCE.md.
//
//   data_path_benchmark [--operations N]     run the five measurements (under callgrind, or
//                                            natively as a functional check)
//   data_path_benchmark --table OUT-FILE     print the table from the dumps of such a run
//
// Only the measured_* functions are counted (callgrind --collect-atstart=no
// --toggle-collect='*measured_*'): each is one post or poll call as channel code makes it, and
// nothing else — ring set-up, CQE writing and checking happen outside them. After each
// measurement a callgrind dump named "<row> <operations>" holds that row's total.
// Every completion polled is checked (wr_id, status, opcode, QPN) so that a poller that does
// nothing cannot look cheap; every post is checked to have been accepted.
#include <valgrind/callgrind.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tests/mlx5/data_path_fixture.hpp"
#include "tests/mlx5/measured_function.hpp"
#include "tests/mlx5/send_reference.hpp"

namespace mlx5 = rdmachan::mlx5;
using namespace data_path_test;

namespace {


MEASURED_FUNCTION mlx5::PostResult measured_post_one(
    mlx5::SendQueue& queue, const mlx5::SendWorkRequest* request) {
    return queue.post(request, 1, nullptr);
}

MEASURED_FUNCTION mlx5::PostResult measured_post_batch(
    mlx5::SendQueue& queue, const mlx5::SendWorkRequest* requests) {
    return queue.post(requests, kBatch, nullptr);
}

MEASURED_FUNCTION std::uint32_t measured_poll(mlx5::CompletionQueue& queue,
                                                               mlx5::Completion* completions,
                                                               std::uint32_t capacity,
                                                               mlx5::CompletionTarget* target) {
    return queue.poll(completions, capacity, Resolver{target});
}

struct Row {
    const char* name;
    const char* label;
    std::uint32_t per_call;  // operations per measured call (divides the count per operation)
    double target;
};

constexpr Row kRows[] = {
    {"post_one", "post: one RDMA write per call, BlueFlame", 1, 100},
    {"post_batch", "post: 16 RDMA writes per call, one doorbell (per WR)", 1, 45},
    {"poll_one", "poll: one completion per call", 1, 60},
    {"poll_sixteen", "poll: 16 completions per call (per completion)", 1, 35},
    {"poll_empty", "poll: empty CQ (per call)", 1, 20},
    // Both sides' data-path work in a round trip: the post and one-completion poll targets, twice.
    {"round_trip", "round trip: our post, the peer's poll of one completion, its post, our poll", 1, 320},
};

void dump(const char* row, std::uint64_t operations) {
    char name[64];
    std::snprintf(name, sizeof name, "%s %llu", row, static_cast<unsigned long long>(operations));
    CALLGRIND_DUMP_STATS_AT(name);
}

bool fail(const char* what, std::uint64_t at) {
    std::fprintf(stderr, "data_path_benchmark: %s (operation %llu)\n", what,
                 static_cast<unsigned long long>(at));
    return false;
}

// Whether the WQE of the `posted`-th write (the last one) is the reference encoding of
// `request`, in the ring and, when it went by BlueFlame, in the BlueFlame buffer half used last.
bool matches_reference(const SendSide& send, const mlx5::SendWorkRequest& request,
                       std::uint64_t posted, bool by_blueflame) {
    const std::uint32_t index = static_cast<std::uint32_t>(posted - 1);
    const send_test::Expected expected = send_test::reference(request, index, false, nullptr, kQpn);
    const std::uint8_t* slot =
        send.ring.data() + (index & (SendSide::kWqeCount - 1)) * mlx5::kSendWqeBasicBlockSize;
    const std::uint8_t* blueflame = send.blueflame.data() + (send.queue.blueflame_offset() ^ 256);
    for (std::size_t i = 0; i < expected.bytes.size(); ++i) {
        if (!expected.mask[i]) continue;
        if (slot[i] != expected.bytes[i]) return false;
        if (by_blueflame && blueflame[i] != expected.bytes[i]) return false;
    }
    return true;
}

bool measure_posts(std::uint64_t operations) {
    SendSide send;
    for (std::uint64_t i = 0; i < operations; ++i) {
        if (measured_post_one(send.queue, &send.requests[kBatch - 1]) != mlx5::PostResult::ok)
            return fail("single post refused", i);
        send.complete_all();
    }
    // Checked against expectations independent of the code under test: every write is one
    // WQEBB, so the producer index is the number of writes posted (counted here), and the last
    // WQE must equal the one rdma-core's mlx5dv.h helpers build (tests/mlx5/send_reference.hpp),
    // both in the ring and in the BlueFlame buffer half used last.
    if (!matches_reference(send, send.requests[kBatch - 1], operations, true))
        return fail("the last single write does not match the reference WQE", operations);
    if (mlx5::big_to_host32(send.doorbell_record[1]) != (operations & 0xffff))
        return fail("doorbell record does not count the writes posted", operations);
    dump("post_one", operations);

    const std::uint64_t calls = operations / kBatch;
    for (std::uint64_t i = 0; i < calls; ++i) {
        if (measured_post_batch(send.queue, send.requests) != mlx5::PostResult::ok)
            return fail("batch refused", i);
        send.complete_all();
    }
    const std::uint64_t posted = operations + calls * kBatch;
    if (!matches_reference(send, send.requests[kBatch - 1], posted, false))
        return fail("the last batched write does not match the reference WQE", posted);
    if (mlx5::big_to_host32(send.doorbell_record[1]) != (posted & 0xffff))
        return fail("doorbell record does not count the writes posted", posted);
    dump("post_batch", calls * kBatch);
    return true;
}

bool measure_polls(std::uint64_t operations) {
    CompletionSide side;
    mlx5::Completion completions[kBatch];
    std::uint32_t round = 0;
    for (std::uint64_t done = 0; done < operations; ++round) {
        const std::uint32_t chunk = static_cast<std::uint32_t>(
            operations - done < CompletionSide::kCqeCount ? operations - done
                                                          : CompletionSide::kCqeCount);
        side.produce(round, chunk);
        for (std::uint32_t i = 0; i < chunk; ++i) {
            if (measured_poll(side.queue, completions, 1, &side.target) != 1 ||
                !CompletionSide::expected(completions, 1, round, i))
                return fail("one-completion poll did not return the expected completion", done + i);
        }
        done += chunk;
    }
    dump("poll_one", operations);

    const std::uint64_t batched = operations / kBatch * kBatch;
    for (std::uint64_t done = 0; done < batched; ++round) {
        const std::uint32_t chunk = static_cast<std::uint32_t>(
            batched - done < CompletionSide::kCqeCount ? batched - done
                                                       : CompletionSide::kCqeCount);
        side.produce(round, chunk);
        for (std::uint32_t i = 0; i < chunk; i += kBatch) {
            if (measured_poll(side.queue, completions, kBatch, &side.target) != kBatch ||
                !CompletionSide::expected(completions, kBatch, round, i))
                return fail("16-completion poll did not return the expected completions", done + i);
        }
        done += chunk;
    }
    dump("poll_sixteen", batched);

    for (std::uint64_t i = 0; i < operations; ++i) {
        if (measured_poll(side.queue, completions, kBatch, &side.target) != 0)
            return fail("an empty CQ returned a completion", i);
    }
    if (mlx5::big_to_host32(side.doorbell_record[mlx5::kCqSetConsumerIndex]) !=
        (side.queue.consumer_index() & 0xffffff))
        return fail("the CQ doorbell record does not hold the consumer index", operations);
    dump("poll_empty", operations);
    return true;
}

// A round trip as both sides' CPUs spend it on the data path: our post of a signaled write, the
// peer's poll of the one completion the round trip brings it, its post, our poll. The CQEs each
// poll finds are written between, unmeasured, as the NIC writes them.
bool measure_round_trips(std::uint64_t operations) {
    SendSide ours, theirs;
    CompletionSide our_completions, their_completions;
    mlx5::Completion completion;
    for (std::uint64_t i = 0; i < operations; ++i) {
        const auto round = static_cast<std::uint32_t>(i);
        if (measured_post_one(ours.queue, &ours.requests[kBatch - 1]) != mlx5::PostResult::ok)
            return fail("our post refused", i);
        ours.complete_all();
        their_completions.produce(round, 1);
        if (measured_poll(their_completions.queue, &completion, 1, &their_completions.target) != 1 ||
            !CompletionSide::expected(&completion, 1, round, 0))
            return fail("the peer's poll did not return the expected completion", i);
        if (measured_post_one(theirs.queue, &theirs.requests[kBatch - 1]) != mlx5::PostResult::ok)
            return fail("the peer's post refused", i);
        theirs.complete_all();
        our_completions.produce(round, 1);
        if (measured_poll(our_completions.queue, &completion, 1, &our_completions.target) != 1 ||
            !CompletionSide::expected(&completion, 1, round, 0))
            return fail("our poll did not return the expected completion", i);
    }
    if (!matches_reference(ours, ours.requests[kBatch - 1], operations, true) ||
        !matches_reference(theirs, theirs.requests[kBatch - 1], operations, true))
        return fail("a round trip's last write does not match the reference WQE", operations);
    dump("round_trip", operations);
    return true;
}

// Reads "desc: Trigger: Client Request: <row> <operations>" and "totals: <Ir>" from each dump.
int print_table(const std::string& out_file) {
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>>
        measured;  // row -> (Ir, operations)
    for (int part = 1;; ++part) {
        std::ifstream input(out_file + "." + std::to_string(part));
        if (!input) break;
        std::string line, row;
        std::uint64_t operations = 0, instructions = 0;
        bool have_total = false;
        while (std::getline(input, line)) {
            const std::string trigger = "desc: Trigger: Client Request: ";
            if (line.rfind(trigger, 0) == 0)
                std::istringstream(line.substr(trigger.size())) >> row >> operations;
            if (line.rfind("totals: ", 0) == 0)
                have_total = static_cast<bool>(std::istringstream(line.substr(8)) >> instructions);
        }
        if (!row.empty() && have_total && operations != 0)
            measured[row] = {instructions, operations};
    }
    if (measured.size() != std::size(kRows)) {
        std::fprintf(stderr, "data_path_benchmark: found %zu of %zu rows in %s.N\n",
                     measured.size(), std::size(kRows), out_file.c_str());
        return 1;
    }
    std::printf("| operation | instructions per operation | target |\n");
    std::printf("|---|---:|---:|\n");
    int missed = 0;
    for (const Row& row : kRows) {
        const auto [instructions, operations] = measured[row.name];
        const double per_operation =
            static_cast<double>(instructions) / static_cast<double>(operations);
        const bool met = per_operation <= row.target;
        missed += !met;
        std::printf("| %s | %.1f | <= %.0f%s |\n", row.label, per_operation, row.target,
                    met ? "" : " (missed)");
    }
    std::printf("\n%d of %zu targets met; counted over %llu operations per row.\n",
                static_cast<int>(std::size(kRows)) - missed, std::size(kRows),
                static_cast<unsigned long long>(measured[kRows[0].name].second));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t operations = 1000000;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--table") == 0 && i + 1 < argc) return print_table(argv[i + 1]);
        if (std::strcmp(argv[i], "--operations") == 0 && i + 1 < argc) {
            operations = std::strtoull(argv[++i], nullptr, 10);
        } else {
            std::fprintf(stderr, "usage: %s [--operations N] | --table CALLGRIND-OUT-FILE\n",
                         argv[0]);
            return 2;
        }
    }
    if (operations < kBatch) {
        std::fprintf(stderr, "data_path_benchmark: --operations must be at least %u\n", kBatch);
        return 2;
    }
    CALLGRIND_ZERO_STATS;
    if (!measure_posts(operations) || !measure_polls(operations) || !measure_round_trips(operations)) return 1;
    std::printf(
        "data_path_benchmark: %llu operations per row posted and polled, every completion "
        "checked%s\n",
        static_cast<unsigned long long>(operations),
        RUNNING_ON_VALGRIND ? "" : " (not under callgrind: nothing counted)");
    return 0;
}
