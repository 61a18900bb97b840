// Instruction counts through the public API, measured with callgrind; see
// scripts/instruction_counts.sh and docs/PERFORMANCE.md.
//
//   channel_instruction_benchmark [--operations N]   run the measurements (under callgrind, or
//                                                    natively as a functional check)
//   channel_instruction_benchmark --table OUT-FILE [--libmlx5 SINGLE BATCH]
//                                                    print the table from the dumps of such a run;
//                                                    with libmlx5's post + completion per write for
//                                                    its single and batch rows
//                                                    (libmlx5_instruction_benchmark --totals), side
//                                                    by side; both batch rows compare with its batch
//
// Counted: only the measured_* functions (callgrind --collect-atstart=no
// --toggle-collect='*measured_*'), each one public call on the calling thread — Channel::post_write
// or Channel::post_batch of a 16-write WorkBatch (posted again unchanged, and changed before
// each post, uncounted), down to the doorbell, and PendingWork::poll
// delivering the completion to its handle — through the engine, the provider's virtual calls, the
// mlx5 rings and the ring CQ's real resolver, on the software device. The device's own thread never
// enters a measured function, so it is not counted. The doorbell is where the library hands the
// work to the NIC: on a ConnectX the doorbell-record and BlueFlame stores (counted: the software
// device has both), then nothing more on the CPU; the software device is also called
// (ring_send_doorbell, which wakes its thread with a system call) — the device's work, which the
// table subtracts and shows in its own column (it reads the inclusive cost of those calls from
// the dump, so the run needs --compress-strings=no --compress-pos=no). Between the post and the counted poll, the
// benchmark waits uncounted until the write has landed and then 1 ms more, so the CQE is normally
// there when the counted poll runs; a counted poll that finds nothing is made again, counted (so
// the figure can only be higher for it) and the number of such polls is printed; every completion
// delivered must be successful, or the run fails.
#include <valgrind/callgrind.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/work_batch.hpp"
#include "tests/mlx5/measured_function.hpp"

using namespace rdmachan;

namespace {

constexpr std::uint32_t kBatch = 16;
constexpr std::uint32_t kSlice = 4096;  // above max_inline_data: the payload is not copied into the WQE

MEASURED_FUNCTION PendingWork measured_post_write(Channel& channel, const LocalSlice& local,
                                                                   const RemoteMemoryRegion& remote) {
    return channel.post_write(local, remote);
}

MEASURED_FUNCTION PendingWork measured_post_batch(Channel& channel, const WorkBatch& batch) {
    return channel.post_batch(batch);
}

MEASURED_FUNCTION std::optional<WorkResult> measured_poll(PendingWork& work) {
    return work.poll();
}

struct Setup {
    Setup(Channel first, Channel second) : a(std::move(first)), b(std::move(second)) {}
    Channel a;
    Channel b;
    std::vector<std::uint8_t> a_memory = std::vector<std::uint8_t>(kBatch * kSlice);
    std::vector<std::uint8_t> b_memory = std::vector<std::uint8_t>(kBatch * kSlice);
    MemoryRegion a_region;
    MemoryRegion b_region;
    WorkBatch batch{kBatch};
};

Setup connect() {
    const ChannelBuilder builder = ChannelBuilder().device("soft").deadline(std::chrono::seconds(30));
    PreparedChannel first = ChannelBuilder(builder.settings()).build();
    PreparedChannel second = ChannelBuilder(builder.settings()).build();
    const ChannelEndpoint first_endpoint = first.endpoint();
    const ChannelEndpoint second_endpoint = second.endpoint();
    Channel a = std::move(first).handshake(second_endpoint);
    Channel b = std::move(second).handshake(first_endpoint);
    return Setup(std::move(a), std::move(b));
}

void dump(const char* row, std::uint64_t operations) {
    char name[64];
    std::snprintf(name, sizeof name, "%s %llu", row, static_cast<unsigned long long>(operations));
    CALLGRIND_DUMP_STATS_AT(name);
}

bool fail(const char* what, std::uint64_t at) {
    std::fprintf(stderr, "channel_instruction_benchmark: %s (operation %llu)\n", what,
                 static_cast<unsigned long long>(at));
    return false;
}

// Counted polls that found no completion yet and were made again (see measure).
std::uint64_t repeated_polls = 0;

// Uncounted: until the last byte the write(s) carry has landed at the target, then 1 ms for
// the acknowledgement and the CQE.
void settle(const volatile std::uint8_t* last_byte, std::uint8_t marker) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (*last_byte != marker && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

// One row pair: `post` counted with its completion taken uncounted, then `post` uncounted with
// the completion's delivery counted. `writes` per post; the last of them ends at `last`.
template <typename Post, typename CountedPost>
bool measure(Setup& setup, std::uint64_t operations, std::uint32_t writes, Post post, CountedPost counted_post,
             const char* post_row, const char* poll_row) {
    const volatile std::uint8_t* last = setup.b_memory.data() + writes * kSlice - 1;
    std::uint8_t marker = 0;
    auto next_marker = [&] {
        marker = static_cast<std::uint8_t>(marker % 255 + 1);
        setup.a_memory[writes * kSlice - 1] = marker;
        return marker;
    };
    for (std::uint64_t i = 0; i < operations; ++i) {
        next_marker();
        PendingWork work = counted_post();
        settle(last, marker);
        if (!work.wait().ok()) return fail("a counted post failed", i);
    }
    dump(post_row, operations * writes);
    for (std::uint64_t i = 0; i < operations; ++i) {
        next_marker();
        PendingWork work = post();
        settle(last, marker);
        std::optional<WorkResult> result = measured_poll(work);
        // The acknowledgement and the CQE can still be on their way after the settling time (a
        // loaded machine, a sanitizer build: a TSan run once found none). Polled again, counted
        // too: a poll that found nothing makes the figure higher, never lower, and how many there
        // were is printed with the figures.
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!result.has_value()) {
            if (std::chrono::steady_clock::now() > until) return fail("no completion within 30 s of the write landing", i);
            ++repeated_polls;
            std::this_thread::yield();
            result = measured_poll(work);
        }
        if (!result->ok()) return fail("a completion was not successful", i);
    }
    dump(poll_row, operations * writes);
    return true;
}

// The 16 writes again, from scratch (uncounted): a new version of the batch.
void rebuild_batch(Setup& setup, const RemoteMemoryRegion& remote) {
    setup.batch.clear();
    for (std::uint32_t i = 0; i < kBatch; ++i)
        setup.batch.write(setup.a_region.slice(i * kSlice, kSlice), remote.slice(i * kSlice, kSlice));
}

struct Row {
    const char* post;
    const char* poll;
    const char* label;
    double target;        // post + completion, per write
    std::size_t libmlx5;  // the libmlx5 figure (--libmlx5 SINGLE BATCH) it compares with
};

// A channel that posts an unchanged WorkBatch again reuses the work requests it converted the
// batch into (WorkBatch::version); libmlx5's ibv_post_send converts its 16 requests on every
// call. The third row changes the batch before each post (uncounted), so the conversion is inside
// every counted post, as libmlx5's is.
constexpr Row kRows[] = {
    {"api_post_write", "api_poll_write", "Channel::post_write: one 4 KiB RDMA write", 300, 0},
    {"api_post_batch", "api_poll_batch",
     "Channel::post_batch: the same WorkBatch of 16 4 KiB RDMA writes again, its conversion reused (per write)", 100, 1},
    {"api_post_changed_batch", "api_poll_changed_batch",
     "Channel::post_batch: a WorkBatch of 16 4 KiB RDMA writes changed before each post, converted every time (per write)",
     100, 1},
};
constexpr std::size_t kLibmlx5Figures = 2;

// The calls whose inclusive cost the table reads from each dump: the software device's doorbell
// (subtracted: the device's work), and the two layers that do what libmlx5 does, so the table can
// say how much of the rest is the library's API and engine.
enum Callee { device_doorbell, ring_post, ring_poll, callee_count };
struct CalleeName {
    const char* name;
    Callee callee;
};
constexpr CalleeName kCalleeNames[] = {
    {"rdmachan::soft::QueuePair::ring_send_doorbell(", device_doorbell},
    {"rdmachan::transport::RingQueuePair::post_one(", ring_post},
    {"rdmachan::transport::RingQueuePair::post_send(", ring_post},
    {"rdmachan::transport::RingCompletionQueue::poll(", ring_poll},
};

Callee callee_of(const std::string& name) {
    for (const CalleeName& callee : kCalleeNames)
        if (name.find(callee.name) != std::string::npos) return callee.callee;
    return callee_count;
}

struct Dump {
    std::uint64_t instructions = 0;
    std::uint64_t writes = 0;
    std::uint64_t inclusive[callee_count] = {};
};

int print_table(const std::string& out_file, const std::vector<double>& libmlx5) {
    std::map<std::string, Dump> measured;  // row -> its dump
    for (int part = 1;; ++part) {
        std::ifstream input(out_file + "." + std::to_string(part));
        if (!input) break;
        std::string line, row;
        Dump dump;
        bool have_total = false, cost_follows = false;
        Callee caller = callee_count, called = callee_count;
        while (std::getline(input, line)) {
            const std::string trigger = "desc: Trigger: Client Request: ";
            if (line.rfind(trigger, 0) == 0) std::istringstream(line.substr(trigger.size())) >> row >> dump.writes;
            if (line.rfind("totals: ", 0) == 0)
                have_total = static_cast<bool>(std::istringstream(line.substr(8)) >> dump.instructions);
            // A call's inclusive cost: "cfn=NAME", "calls=COUNT TARGET", then "POSITION COST". A
            // callee's call into itself (its cold part) is already inside its inclusive cost.
            if (cost_follows) {
                std::uint64_t position = 0, cost = 0;
                if (std::istringstream(line) >> position >> cost) dump.inclusive[called] += cost;
                cost_follows = false;
            }
            if (line.rfind("fn=", 0) == 0) caller = callee_of(line);
            if (line.rfind("cfn=", 0) == 0) called = callee_of(line);
            if (line.rfind("calls=", 0) == 0) cost_follows = called != callee_count && called != caller;
        }
        if (!row.empty() && have_total && dump.writes != 0) measured[row] = dump;
    }
    if (measured.size() != 2 * std::size(kRows)) {
        std::fprintf(stderr, "channel_instruction_benchmark: found %zu of %zu rows in %s.N\n", measured.size(),
                     2 * std::size(kRows), out_file.c_str());
        return 1;
    }
    // Each row's figures per write, computed once for both tables.
    struct Figures {
        double post = 0, poll = 0, total = 0, doorbell = 0, queue_pair = 0, completion_queue = 0;
        bool layers_found = false;
    };
    auto figures_of = [&](const Row& row) {
        const Dump& post_dump = measured[row.post];
        const Dump& poll_dump = measured[row.poll];
        const double post_writes = static_cast<double>(post_dump.writes);
        const double poll_writes = static_cast<double>(poll_dump.writes);
        Figures figures;
        figures.post = static_cast<double>(post_dump.instructions - post_dump.inclusive[device_doorbell]) / post_writes;
        figures.poll = static_cast<double>(poll_dump.instructions - poll_dump.inclusive[device_doorbell]) / poll_writes;
        figures.total = figures.post + figures.poll;
        figures.doorbell = static_cast<double>(post_dump.inclusive[device_doorbell]) / post_writes;
        figures.queue_pair = static_cast<double>(post_dump.inclusive[ring_post] - post_dump.inclusive[device_doorbell]) / post_writes;
        figures.completion_queue = static_cast<double>(poll_dump.inclusive[ring_poll]) / poll_writes;
        figures.layers_found = post_dump.inclusive[ring_post] != 0 && poll_dump.inclusive[ring_poll] != 0;
        return figures;
    };
    const bool compared = libmlx5.size() == kLibmlx5Figures;
    std::printf("| through the public API | post, to the doorbell | completion delivered to its handle | "
                "post + completion | target | software device's doorbell call (not counted)%s |\n",
                compared ? " | libmlx5's ibv_post_send + ibv_poll_cq, measured | rdmachan / libmlx5" : "");
    std::printf("|---|---:|---:|---:|---:|---:%s|\n", compared ? "|---:|---:" : "");
    int missed = 0;
    for (std::size_t index = 0; index < std::size(kRows); ++index) {
        const Row& row = kRows[index];
        const Figures figures = figures_of(row);
        const bool met = figures.total <= row.target;
        missed += !met;
        std::printf("| %s | %.1f | %.1f | %.1f | <= %.0f%s | %.1f |", row.label, figures.post, figures.poll, figures.total,
                    row.target, met ? "" : " (missed)", figures.doorbell);
        if (compared) std::printf(" %.1f | %.2fx |", libmlx5[row.libmlx5], figures.total / libmlx5[row.libmlx5]);
        std::printf("\n");
    }
    std::printf("\n%d of %zu targets met; instructions per write, counted over %llu writes per row on the "
                "calling thread only.\n",
                static_cast<int>(std::size(kRows)) - missed, std::size(kRows),
                static_cast<unsigned long long>(measured[kRows[0].post].writes));

    // Where the post + completion goes: the queue pair's post (RingQueuePair::post_one or
    // post_send: the WQE, the doorbell record, BlueFlame; its doorbell call into the software
    // device taken out) and the completion queue's poll (CQEs read, the resolver) are the work
    // libmlx5's post and poll do; the rest is the API and the engine above them.
    std::printf("\n| where the post + completion goes (per write) | queue pair's post | completion queue's poll | "
                "API and engine | post + completion |\n");
    std::printf("|---|---:|---:|---:|---:|\n");
    for (const Row& row : kRows) {
        const Figures figures = figures_of(row);
        if (!figures.layers_found) {
            std::fprintf(stderr, "channel_instruction_benchmark: %s: no call into the queue pair's post or the "
                                 "completion queue's poll found in the dumps\n", row.label);
            return 1;
        }
        std::printf("| %s | %.1f | %.1f | %.1f | %.1f |\n", row.label, figures.queue_pair, figures.completion_queue,
                    figures.total - figures.queue_pair - figures.completion_queue, figures.total);
    }
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t operations = 1000;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--table") == 0 && i + 1 < argc) {
            std::vector<double> libmlx5;
            if (i + 2 < argc && std::strcmp(argv[i + 2], "--libmlx5") == 0) {
                for (int figure = i + 3; figure < argc; ++figure) {
                    char* end = nullptr;
                    const double value = std::strtod(argv[figure], &end);
                    if (end == argv[figure] || *end != 0 || !(value > 0)) {
                        std::fprintf(stderr, "channel_instruction_benchmark: --libmlx5: '%s' is not a positive number\n",
                                     argv[figure]);
                        return 2;
                    }
                    libmlx5.push_back(value);
                }
                if (libmlx5.size() != kLibmlx5Figures) {
                    std::fprintf(stderr, "channel_instruction_benchmark: --libmlx5 takes %zu figures (single, batch); got %zu\n",
                                 kLibmlx5Figures, libmlx5.size());
                    return 2;
                }
            }
            return print_table(argv[i + 1], libmlx5);
        }
        if (std::strcmp(argv[i], "--operations") == 0 && i + 1 < argc) {
            operations = std::strtoull(argv[++i], nullptr, 10);
        } else {
            std::fprintf(stderr, "usage: %s [--operations N] | --table CALLGRIND-OUT-FILE [--libmlx5 SINGLE BATCH]\n", argv[0]);
            return 2;
        }
    }
    if (operations == 0) {
        std::fprintf(stderr, "channel_instruction_benchmark: --operations must be at least 1\n");
        return 2;
    }
    Setup setup = connect();
    setup.a_region = setup.a.register_memory(setup.a_memory.data(), setup.a_memory.size());
    setup.b_region = setup.b.register_memory(setup.b_memory.data(), setup.b_memory.size());
    const RemoteMemoryRegion remote = setup.b_region.remote();
    rebuild_batch(setup, remote);
    const LocalSlice one = setup.a_region.slice(0, kSlice);
    const RemoteMemoryRegion one_remote = remote.slice(0, kSlice);
    // Warm: one of each, uncounted (lazily set-up state is not a per-operation cost).
    if (!setup.a.post_write(one, one_remote).wait().ok() || !setup.a.post_batch(setup.batch).wait().ok()) {
        std::fprintf(stderr, "channel_instruction_benchmark: the warm-up write failed\n");
        return 1;
    }
    CALLGRIND_ZERO_STATS;
    const bool ok =
        measure(
            setup, operations, 1, [&] { return setup.a.post_write(one, one_remote); },
            [&] { return measured_post_write(setup.a, one, one_remote); }, "api_post_write", "api_poll_write") &&
        measure(
            setup, operations, kBatch, [&] { return setup.a.post_batch(setup.batch); },
            [&] { return measured_post_batch(setup.a, setup.batch); }, "api_post_batch", "api_poll_batch") &&
        measure(
            setup, operations, kBatch,
            [&] {
                rebuild_batch(setup, remote);
                return setup.a.post_batch(setup.batch);
            },
            [&] {
                rebuild_batch(setup, remote);
                return measured_post_batch(setup.a, setup.batch);
            },
            "api_post_changed_batch", "api_poll_changed_batch");
    if (!ok) return 1;
    std::printf("channel_instruction_benchmark: %llu single writes and %llu 16-write batches (unchanged, then changed before each) posted and their "
                "completions delivered, every one checked; %llu counted polls found no completion yet and were made "
                "again (counted)%s\n",
                static_cast<unsigned long long>(operations), static_cast<unsigned long long>(operations),
                static_cast<unsigned long long>(repeated_polls), RUNNING_ON_VALGRIND ? "" : " (not under callgrind: nothing counted)");
    return 0;
}
