// Where a DC peer's first-use cost lands: rank 0 of a DC world in one process (software device)
// posts an 8-byte RDMA write to each peer, timing the post call alone, first to peers it never
// contacted (the post makes the peer's state: engine and routing state, address vector, its
// share of the slots) and then again to the same peers. Prints the median and the largest of
// each, and their ratio. The write is waited for outside the timed call.
// Usage: first_use_benchmark [RANKS] [ROUNDS]   (default 32 ranks, 5 rounds of later posts)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "rdmachan/error.hpp"
#include "rdmachan/multi_channel.hpp"

namespace {

using namespace rdmachan;
using Clock = std::chrono::steady_clock;

double median(std::vector<double> values) {
    std::sort(values.begin(), values.end());
    return values[values.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
    const long ranks_argument = argc > 1 ? std::atol(argv[1]) : 32;
    const long rounds_argument = argc > 2 ? std::atol(argv[2]) : 5;
    if (ranks_argument < 2 || ranks_argument > 256 || rounds_argument < 1 || rounds_argument > 1000) {
        std::fprintf(stderr, "first_use_benchmark: RANKS must be in 2..256 and ROUNDS in 1..1000\n");
        return 2;
    }
    const auto ranks = static_cast<std::uint32_t>(ranks_argument);
    const auto rounds = static_cast<std::uint32_t>(rounds_argument);
    try {
        std::vector<PreparedMultiChannel> prepared;
        std::vector<std::vector<std::uint8_t>> memory(ranks, std::vector<std::uint8_t>(4096));
        std::vector<MemoryRegion> regions;
        std::vector<Endpoint> table;
        for (std::uint32_t rank = 0; rank < ranks; ++rank) {
            prepared.push_back(MultiChannelBuilder()
                                   .rank(rank)
                                   .world_size(ranks)
                                   .mode(MultiChannelMode::dynamically_connected)
                                   .dc_initiators(4)
                                   .build());
            regions.push_back(prepared.back().register_memory(memory[rank].data(), memory[rank].size()));
            prepared.back().publish_region("buffer", regions.back());
            table.push_back(prepared.back().endpoint());
        }
        std::vector<MultiChannel> world;
        for (std::uint32_t rank = 0; rank < ranks; ++rank) world.push_back(std::move(prepared[rank]).handshake(table));
        MultiChannel& me = world[0];
        std::vector<RemoteMemoryRegion> remote;
        for (std::uint32_t peer = 0; peer < ranks; ++peer) remote.push_back(me.remote_region(peer, "buffer").region);
        const std::uint32_t contacted_before = me.peers_contacted();
        auto timed_write = [&](std::uint32_t peer) {
            const auto start = Clock::now();
            PendingWork write = me.post_write(peer, regions[0].slice(0, 8), remote[peer].slice(64, 8));
            const auto end = Clock::now();
            const WorkResult result = write.wait();
            if (!result.ok()) throw Error("a write to rank " + std::to_string(peer) + " failed: " + result.error().message());
            return std::chrono::duration<double, std::nano>(end - start).count();
        };
        std::vector<double> first;
        for (std::uint32_t peer = 1; peer < ranks; ++peer) first.push_back(timed_write(peer));
        std::vector<double> later;
        for (std::uint32_t round = 0; round < rounds; ++round)
            for (std::uint32_t peer = 1; peer < ranks; ++peer) later.push_back(timed_write(peer));
        const double first_median = median(first);
        const double later_median = median(later);
        std::printf("first use: mode=dc ranks=%u peers_contacted_before=%u after=%u first_post_ns=%.0f (max %.0f) "
                    "later_post_ns=%.0f (max %.0f) first_to_later=%.1f\n",
                    ranks, contacted_before, me.peers_contacted(), first_median,
                    *std::max_element(first.begin(), first.end()), later_median,
                    *std::max_element(later.begin(), later.end()), first_median / later_median);
    } catch (const Error& error) {
        std::fprintf(stderr, "first_use_benchmark: %s\n", error.what());
        return 1;
    }
    return 0;
}
