// N processes, one MultiChannel each, connected through the rendezvous: every rank writes a
// slice to every rank (itself included) with one scatter_write carrying its rank as immediate
// data, learns of the incoming slices from the immediates, and checks every byte.
//
//   multi_channel_all_to_all [ranks] [slice bytes]
//
// The parent process plays the launcher (local_ranks.hpp): it forks the ranks and runs the
// rendezvous server (a real job would use rdmachan-demo or its launcher's environment).
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rdmachan/multi_channel.hpp"

#include "local_ranks.hpp"

namespace {

std::uint8_t pattern(std::uint32_t from, std::uint32_t to, std::uint32_t index) {
    return static_cast<std::uint8_t>(from * 29 + to * 11 + index);
}

int run_rank(const rdmachan::RendezvousSettings& settings, std::uint32_t slice) {
    const std::uint32_t rank = settings.rank;
    const std::uint32_t ranks = settings.world_size;
    // [outgoing slice for each rank][incoming slice from each rank]
    std::vector<std::uint8_t> memory(2 * static_cast<std::size_t>(ranks) * slice);
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        for (std::uint32_t i = 0; i < slice; ++i) memory[peer * slice + i] = pattern(rank, peer, i);
    }
    rdmachan::PreparedMultiChannel prepared =
        rdmachan::MultiChannelBuilder(rdmachan::ChannelBuilder().deadline(std::chrono::seconds(20))).rank(rank).world_size(ranks).build();
    rdmachan::MemoryRegion region = prepared.register_memory(memory.data(), memory.size());
    prepared.publish_region("buffer", region);
    rdmachan::MultiChannel channels = std::move(prepared).connect(settings);

    // Receives first (one per sender, for its immediate), then the writes.
    std::vector<rdmachan::PeerTransfer> receives, writes;
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        receives.push_back({peer, region.slice(0, 0), {}});
        const rdmachan::PeerRemoteMemoryRegion remote = channels.remote_region(peer, "buffer");
        writes.push_back({peer, region.slice(peer * slice, slice), remote.region.slice((ranks + rank) * static_cast<std::uint64_t>(slice), slice)});
    }
    rdmachan::PendingMultiWork incoming = channels.post_gather_receive(receives);
    const rdmachan::MultiResult written = channels.scatter_write(writes, rank);
    if (!written.ok()) {
        std::fprintf(stderr, "rank %u: scatter_write failed:\n%s\n", rank, written.message().c_str());
        return 1;
    }
    const rdmachan::MultiResult arrived = incoming.wait();
    if (!arrived.ok()) {
        std::fprintf(stderr, "rank %u: receiving the immediates failed:\n%s\n", rank, arrived.message().c_str());
        return 1;
    }
    for (const rdmachan::PeerResult& entry : arrived.results()) {
        const std::uint32_t from = entry.result.completion().immediate.value_or(~0u);
        if (from != entry.peer) {
            std::fprintf(stderr, "rank %u: the write from rank %u carried immediate %u\n", rank, entry.peer, from);
            return 1;
        }
        for (std::uint32_t i = 0; i < slice; ++i) {
            if (memory[(ranks + from) * static_cast<std::size_t>(slice) + i] != pattern(from, rank, i)) {
                std::fprintf(stderr, "rank %u: byte %u of the slice from rank %u is wrong\n", rank, i, from);
                return 1;
            }
        }
    }
    std::printf("rank %u: received %u slices of %u bytes, all verified (device %s)\n", rank, ranks, slice,
                channels.device_name().c_str());
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const std::uint32_t ranks = argc > 1 ? static_cast<std::uint32_t>(std::strtoul(argv[1], nullptr, 10)) : 4;
    const std::uint32_t slice = argc > 2 ? static_cast<std::uint32_t>(std::strtoul(argv[2], nullptr, 10)) : 65536;
    if (ranks < 1 || ranks > 64 || slice < 1 || slice > (16u << 20)) {
        std::fprintf(stderr, "usage: multi_channel_all_to_all [ranks 1..64] [slice bytes 1..16777216]\n");
        return 2;
    }
    examples::LocalRanks launcher(ranks, "multi_channel_all_to_all");
    launcher.start([slice](const rdmachan::RendezvousSettings& settings) { return run_rank(settings, slice); });
    int failures = launcher.rendezvous();
    failures += launcher.wait_all();
    if (failures != 0) {
        std::fprintf(stderr, "multi_channel_all_to_all: %d failure(s)\n", failures);
        return 1;
    }
    std::printf("multi_channel_all_to_all: %u ranks exchanged %u-byte slices all-to-all, every byte verified\n", ranks, slice);
    return 0;
}
