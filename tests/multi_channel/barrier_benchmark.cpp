// Barrier time and messages per rank against N: MultiChannel::barrier (dissemination, ceil(log2 N)
// RDMA writes per rank) beside an all-to-all barrier built on the public API (each rank writes its
// count into every peer's memory, N - 1 writes under one doorbell per peer, and waits until every
// slot holds it), the other algorithm considered. Forked processes on this host's device.
//
//   barrier_benchmark [--mode rc|dc] [--iterations I] [N ...]     (default N: 2 3 4 5 8 12 16)
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/multi_channel.hpp"
#include "tests/multi_channel/shared_exchange.hpp"

using namespace rdmachan;

namespace {

constexpr std::chrono::milliseconds kExchangeDeadline{30000};

struct Options {
    MultiChannelMode mode = MultiChannelMode::reliable_connected;
    std::uint32_t iterations = 1000;
    std::vector<std::uint32_t> worlds;
};

// What rank 0 reports, through the shared table's text of rank 0 (after the exchange).
struct Figures {
    double dissemination_us = 0;
    double all_to_all_us = 0;
    std::uint32_t rounds = 0;
};

bool all_to_all(MultiChannel& channels, std::uint64_t* slots, std::uint32_t rank,
                std::uint32_t world, std::uint64_t count, std::vector<PeerTransfer>& shares,
                std::uint64_t* source) {
    *source = count;
    if (!channels.scatter_write(shares).ok()) return false;
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        if (peer == rank) continue;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        std::uint32_t polls = 0;
        while (std::atomic_ref<std::uint64_t>(slots[peer]).load(std::memory_order_acquire) <
               count) {
            if (++polls > 256) std::this_thread::yield();
            if (std::chrono::steady_clock::now() >= until) return false;
        }
    }
    return true;
}

int run_rank(multi_test::SharedTable& table, std::uint32_t rank, std::uint32_t world,
             const Options& options, Figures* figures) try {
    PreparedMultiChannel prepared =
        MultiChannelBuilder(ChannelBuilder().max_send_wr(64).max_recv_wr(64))
            .rank(rank)
            .world_size(world)
            .mode(options.mode)
            .build();
    std::vector<std::uint64_t> slots(world + 1, 0);  // the last: the source of this rank's writes
    MemoryRegion region =
        prepared.register_memory(slots.data(), slots.size() * sizeof(std::uint64_t));
    prepared.publish_region("slots", region);
    MultiChannel channels = std::move(prepared).handshake(
        multi_test::exchange_endpoints(table, rank, world, prepared.endpoint(), kExchangeDeadline));
    std::vector<PeerTransfer> shares;
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        if (peer == rank) continue;
        shares.push_back({peer, region.slice(world * sizeof(std::uint64_t), sizeof(std::uint64_t)),
                          channels.remote_region(peer, "slots")
                              .region.slice(rank * sizeof(std::uint64_t), sizeof(std::uint64_t))});
    }
    multi_test::barrier(table, world, kExchangeDeadline);

    const std::uint32_t warmup = std::max(options.iterations / 10, 10u);
    for (std::uint32_t i = 0; i < warmup; ++i) {
        if (!channels.barrier().ok()) return 1;
    }
    auto started = std::chrono::steady_clock::now();
    for (std::uint32_t i = 0; i < options.iterations; ++i) {
        const BarrierResult result = channels.barrier();
        if (!result.ok()) {
            std::fprintf(stderr, "rank %u: %s\n", rank, result.message().c_str());
            return 1;
        }
    }
    const double dissemination =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started)
            .count();
    if (!channels.barrier().ok()) return 1;

    std::uint64_t count = 0;
    for (std::uint32_t i = 0; i < warmup; ++i) {
        if (!all_to_all(channels, slots.data(), rank, world, ++count, shares,
                        slots.data() + world)) {
            std::fprintf(stderr, "rank %u: all-to-all barrier failed\n", rank);
            return 1;
        }
    }
    started = std::chrono::steady_clock::now();
    for (std::uint32_t i = 0; i < options.iterations; ++i) {
        if (!all_to_all(channels, slots.data(), rank, world, ++count, shares, slots.data() + world))
            return 1;
    }
    const double all =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - started)
            .count();
    if (!channels.barrier().ok()) return 1;
    if (rank == 0) {
        figures->dissemination_us = dissemination / options.iterations;
        figures->all_to_all_us = all / options.iterations;
        figures->rounds = channels.barrier_rounds();
    }
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
    return 2;
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    for (int i = 1; i < argc; ++i) {
        const std::string argument = argv[i];
        if (argument == "--mode" && i + 1 < argc) {
            options.mode = std::string(argv[++i]) == "dc" ? MultiChannelMode::dynamically_connected
                                                          : MultiChannelMode::reliable_connected;
        } else if (argument == "--iterations" && i + 1 < argc) {
            options.iterations = static_cast<std::uint32_t>(std::atoi(argv[++i]));
        } else {
            options.worlds.push_back(static_cast<std::uint32_t>(std::atoi(argument.c_str())));
        }
    }
    if (options.worlds.empty()) options.worlds = {2, 3, 4, 5, 8, 12, 16};
    std::printf("mode %s, %u barriers each\n", std::string(to_string(options.mode)).c_str(),
                options.iterations);
    std::printf("%4s  %22s  %22s  %22s\n", "N", "dissemination us/barr", "msgs/rank (total)",
                "all-to-all us/barr");
    for (std::uint32_t world : options.worlds) {
        if (world < 1 || world > multi_test::kMaxRanks) return 2;
        multi_test::SharedTable* table = multi_test::create_shared_table();
        auto* figures = static_cast<Figures*>(mmap(nullptr, sizeof(Figures), PROT_READ | PROT_WRITE,
                                                   MAP_SHARED | MAP_ANONYMOUS, -1, 0));
        std::vector<pid_t> children;
        for (std::uint32_t rank = 0; rank < world; ++rank) {
            const pid_t child = fork();
            if (child == 0) _exit(run_rank(*table, rank, world, options, figures));
            children.push_back(child);
        }
        int failures = 0;
        for (pid_t child : children) {
            int status = 0;
            waitpid(child, &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
        }
        if (failures != 0) {
            std::fprintf(stderr, "N=%u: %d rank(s) failed\n", world, failures);
            return 1;
        }
        char messages[32];
        std::snprintf(messages, sizeof messages, "%u (%u)", figures->rounds,
                      figures->rounds * world);
        std::printf("%4u  %22.1f  %22s  %22.1f   (all-to-all: %u msgs/rank)\n", world,
                    figures->dissemination_us, messages, figures->all_to_all_us, world - 1);
        std::fflush(stdout);
        munmap(figures, sizeof(Figures));
        multi_test::destroy_shared_table(table);
    }
    return 0;
}
