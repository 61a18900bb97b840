// Instruction counts of CompletionQueue::poll over compressed CQE sessions (compressed_session.hpp)
// beside the same completions uncompressed, counted by callgrind as data_path_benchmark counts
// the plain rows (same fixture, same resolver, same checks):
//
//   valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*'
//            --callgrind-out-file=OUT compressed_poll_benchmark [--operations N]
//   compressed_poll_benchmark --table OUT
//
// Each session stands for 64 successful RDMA-write completions of one QP (eight arrays of mini
// CQEs in the requester format), as a NIC with compression writes a burst of them. In CTest it
// runs natively, as a check of every completion.
#include <valgrind/callgrind.h>

#include <algorithm>
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
#include "transport/mlx5/compressed_session.hpp"

namespace mlx5 = rdmachan::mlx5;
using namespace data_path_test;

namespace {

constexpr std::uint32_t kSession = 64;

MEASURED_FUNCTION std::uint32_t measured_poll(mlx5::CompletionQueue& queue, mlx5::Completion* completions,
                                              std::uint32_t capacity, mlx5::CompletionTarget* target) {
    return queue.poll(completions, capacity, Resolver{target});
}

struct Row {
    const char* name;
    const char* label;
};
constexpr Row kRows[] = {
    {"plain_sixteen", "poll: 16 completions per call, uncompressed (per completion)"},
    {"compressed_sixteen", "poll: 16 completions per call from sessions of 64 (per completion)"},
    {"compressed_one", "poll: one completion per call from sessions of 64"},
};

void dump(const char* row, std::uint64_t operations) {
    char name[64];
    std::snprintf(name, sizeof name, "%s %llu", row, static_cast<unsigned long long>(operations));
    CALLGRIND_DUMP_STATS_AT(name);
}

// `count` (a multiple of kSession) completions of the fixture's one-WQEBB writes as sessions: the
// send tracking as CompletionSide::produce leaves it, the arrays, then each title (op_own last).
void produce_sessions(CompletionSide& side, std::uint32_t& producer, std::uint32_t round, std::uint32_t count) {
    constexpr std::uint32_t kCount = CompletionSide::kCqeCount;
    for (std::uint32_t first = 0; first < count; first += kSession) {
        const std::uint32_t start = producer;
        auto entry = [&](std::uint32_t index) { return side.buffer.data() + (index & (kCount - 1)) * mlx5::kCqeSize64; };
        for (std::uint32_t i = 0; i < kSession; ++i) {
            const std::uint32_t wqe_index = (start + i) & (CompletionSide::kSendWqeCount - 1);
            side.wr_ids[wqe_index] = CompletionSide::wr_id_for(round, first + i);
            side.wqe_ends[wqe_index] = start + i + 1;
            std::uint8_t* const array = entry(start + (i < 8 ? 1 : i / 8 * 8));
            std::uint8_t* const mini = array + (i % 8) * mlx5::kMiniCqeSize;
            mlx5::store_big16(mini + mlx5::kMiniCqeWqeCounter, static_cast<std::uint16_t>(start + i));
            mini[mlx5::kMiniCqeWqeOpcode] = mlx5::kOpcodeRdmaWrite;
            mini[mlx5::kMiniCqeWqeOpcode + 1] = 0;
            mlx5::store_big32(mini + mlx5::kMiniCqeByteCount, 4096);
        }
        std::uint8_t* const title = entry(start);
        std::memset(title, 0, mlx5::kCqeOpOwn);
        mlx5::store_big32(title + mlx5::kCqeByteCount, kSession);
        mlx5::store_big32(title + mlx5::kCqeSopDropQpn, static_cast<std::uint32_t>(mlx5::kOpcodeRdmaWrite) << 24 | kQpn);
        mlx5::store_big16(title + mlx5::kCqeWqeCounter, static_cast<std::uint16_t>(start));
        const std::uint8_t owner = (start / kCount) & 1;
        mlx5::store_release8(title + mlx5::kCqeOpOwn,
                             static_cast<std::uint8_t>(mlx5::kCqeRequester << 4 | mlx5::kCqeFormatMask | owner));
        producer += kSession;
    }
}

bool fail(const char* what, std::uint64_t at) {
    std::fprintf(stderr, "compressed_poll_benchmark: %s (completion %llu)\n", what, static_cast<unsigned long long>(at));
    return false;
}

// Polls `operations` completions `per_call` at a time from rings the producer fills.
template <typename Produce>
bool measure(CompletionSide& side, std::uint64_t operations, std::uint32_t per_call, std::uint32_t& round, Produce produce) {
    mlx5::Completion completions[kBatch];
    for (std::uint64_t done = 0; done < operations; ++round) {
        const auto chunk = static_cast<std::uint32_t>(std::min<std::uint64_t>(operations - done, CompletionSide::kCqeCount / 2));
        produce(round, chunk);
        for (std::uint32_t i = 0; i < chunk; i += per_call) {
            if (measured_poll(side.queue, completions, per_call, &side.target) != per_call ||
                !CompletionSide::expected(completions, per_call, round, i))
                return fail("a poll did not return the expected completions", done + i);
        }
        done += chunk;
    }
    return true;
}

bool measure_all(std::uint64_t operations) {
    std::uint32_t round = 0;
    CompletionSide plain;
    if (!measure(plain, operations, kBatch, round, [&](std::uint32_t r, std::uint32_t n) { plain.produce(r, n); })) return false;
    dump("plain_sixteen", operations);
    for (const std::uint32_t per_call : {kBatch, 1u}) {
        CompletionSide side;
        mlx5::CompletionQueueRing ring = side.queue.ring();
        ring.compressed_cqes = true;
        side.queue = mlx5::CompletionQueue(ring);
        std::uint32_t producer = 0;
        if (!measure(side, operations, per_call, round,
                     [&](std::uint32_t r, std::uint32_t n) { produce_sessions(side, producer, r, n); }))
            return false;
        dump(per_call == 1 ? "compressed_one" : "compressed_sixteen", operations);
    }
    return true;
}

int print_table(const std::string& out_file) {
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> measured;  // row -> (Ir, operations)
    for (int part = 1;; ++part) {
        std::ifstream input(out_file + "." + std::to_string(part));
        if (!input) break;
        std::string line, row;
        std::uint64_t operations = 0, instructions = 0;
        while (std::getline(input, line)) {
            const std::string trigger = "desc: Trigger: Client Request: ";
            if (line.rfind(trigger, 0) == 0) std::istringstream(line.substr(trigger.size())) >> row >> operations;
            if (line.rfind("totals: ", 0) == 0) std::istringstream(line.substr(8)) >> instructions;
        }
        if (!row.empty() && operations != 0) measured[row] = {instructions, operations};
    }
    if (measured.size() != std::size(kRows)) {
        std::fprintf(stderr, "compressed_poll_benchmark: found %zu of %zu rows in %s.N\n", measured.size(), std::size(kRows),
                     out_file.c_str());
        return 1;
    }
    std::printf("| operation | instructions per completion |\n|---|---:|\n");
    for (const Row& row : kRows) {
        const auto [instructions, operations] = measured[row.name];
        std::printf("| %s | %.1f |\n", row.label, static_cast<double>(instructions) / static_cast<double>(operations));
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t operations = 1 << 20;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--table") == 0 && i + 1 < argc) return print_table(argv[i + 1]);
        if (std::strcmp(argv[i], "--operations") == 0 && i + 1 < argc) {
            operations = std::strtoull(argv[++i], nullptr, 10) / kSession * kSession;
        } else {
            std::fprintf(stderr, "usage: %s [--operations N] | --table CALLGRIND-OUT-FILE\n", argv[0]);
            return 2;
        }
    }
    if (operations == 0) {
        std::fprintf(stderr, "compressed_poll_benchmark: --operations must be at least %u\n", kSession);
        return 2;
    }
    CALLGRIND_ZERO_STATS;
    if (!measure_all(operations)) return 1;
    std::printf("compressed_poll_benchmark: %llu completions per row, every one checked\n",
                static_cast<unsigned long long>(operations));
    return 0;
}
