// The memory a MultiChannel adds per peer, RC and DC: rank 0 of a world of N on the software
// device is built and handshaken against N-1 fabricated peer endpoints (no traffic: set-up
// cost only), and heap (mallinfo2) and RSS are read before and after. The per-peer figure is
// the difference between N and a 2-rank world divided by N-2, so what every MultiChannel costs
// regardless of its world (device, protection domain, DC receive buffers) is not counted.
// RC also prints what one queue pair costs on its own (the heap and RSS of creating it).
// Usage: peer_cost_benchmark [--mode rc|dc] [N ...]   (default: dc 1024 4096)
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "rdmachan/error.hpp"
#include "rdmachan/multi_channel.hpp"

namespace {

using namespace rdmachan;

struct Usage {
    std::size_t heap = 0;  // bytes in use by malloc
    std::size_t rss = 0;   // resident bytes
};

Usage usage_now() {
    malloc_trim(0);
    Usage usage;
    usage.heap = mallinfo2().uordblks + mallinfo2().hblkhd;
    std::ifstream statm("/proc/self/statm");
    std::size_t pages = 0, resident = 0;
    statm >> pages >> resident;
    usage.rss = resident * 4096;
    return usage;
}

// A peer endpoint as a MultiChannel of that rank would publish it; distinct LIDs keep the DC
// initiators of different ranks apart, as distinct hosts would.
Endpoint fabricated_peer(std::uint32_t rank, std::uint32_t me, bool dc) {
    Endpoint endpoint;
    endpoint.rank = rank;
    endpoint.session = 0x5e55000000000000ull + rank;
    endpoint.device = DeviceKind::soft;
    endpoint.port.lid = static_cast<std::uint16_t>(1 + rank % 60000);
    endpoint.port.gid = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 127, 0, 0, 1};
    endpoint.port.mtu = 4096;
    if (dc) {
        endpoint.dc.push_back({0x100 + rank, 0xdc00000000000000ull + rank});
        for (std::uint32_t initiator = 0; initiator < 4; ++initiator)
            endpoint.dci.push_back(0x200000 + rank * 4 + initiator);
    } else {
        endpoint.rc.push_back({me, 0x300000 + rank, rank * 7 & 0xffffff});
    }
    endpoint.regions["buffer"] = {0x10000ull * (rank + 1), 4096, 0x100 + rank};
    return endpoint;
}

struct Measured {
    Usage built;       // build() alone
    Usage handshaken;  // build() + handshake
    std::uint32_t queue_pairs = 0;
};

Measured measure(std::uint32_t world, bool dc) {
    const Usage before = usage_now();
    Measured measured;
    {
        PreparedMultiChannel prepared =
            MultiChannelBuilder(ChannelBuilder().device("soft"))
                .rank(0)
                .world_size(world)
                .mode(dc ? MultiChannelMode::dynamically_connected : MultiChannelMode::reliable_connected)
                .dc_initiators(4)
                .build();
        const Usage built = usage_now();
        std::vector<Endpoint> table;
        table.reserve(world);
        Endpoint mine = prepared.endpoint();
        if (!dc) std::erase_if(mine.rc, [](const RcEntry& entry) { return entry.peer != 0; });
        table.push_back(mine);
        for (std::uint32_t rank = 1; rank < world; ++rank) table.push_back(fabricated_peer(rank, 0, dc));
        MultiChannel channels = std::move(prepared).handshake(table);
        table.clear();
        table.shrink_to_fit();
        const Usage handshaken = usage_now();
        measured.built = {built.heap - before.heap, built.rss - before.rss};
        measured.handshaken = {handshaken.heap - before.heap, handshaken.rss - before.rss};
        measured.queue_pairs = channels.queue_pair_count();
    }
    return measured;
}

}  // namespace

int main(int argc, char** argv) {
    bool dc = true;
    std::vector<std::uint32_t> worlds;
    for (int index = 1; index < argc; ++index) {
        const std::string argument = argv[index];
        if (argument == "--mode" && index + 1 < argc) {
            const std::string mode = argv[++index];
            if (mode != "rc" && mode != "dc") {
                std::fprintf(stderr, "peer_cost_benchmark: --mode must be rc or dc\n");
                return 2;
            }
            dc = mode == "dc";
        } else {
            const long world = std::atol(argument.c_str());
            if (world < 3 || world > 65536) {
                std::fprintf(stderr, "peer_cost_benchmark: world size '%s' is not in 3..65536\n", argument.c_str());
                return 2;
            }
            worlds.push_back(static_cast<std::uint32_t>(world));
        }
    }
    if (worlds.empty()) worlds = {1024, 4096};
    const char* mode = dc ? "dc" : "rc";
    try {
        // The first MultiChannel of a process also makes what lives for the whole process
        // (logger, the device's statics): measured once and dropped, so the base is a fair one.
        (void)measure(2, dc);
        const Measured base = measure(2, dc);
        for (std::uint32_t world : worlds) {
            const Measured measured = measure(world, dc);
            const double peers = world - 2.0;
            auto per_peer = [&](std::size_t at_world, std::size_t at_two) {
                return (static_cast<double>(at_world) - static_cast<double>(at_two)) / peers;
            };
            std::printf("peer cost: mode=%s peers=%u queue_pairs=%u heap_per_peer=%.0f rss_per_peer=%.0f "
                        "(build heap %.0f + handshake heap %.0f per peer)\n",
                        mode, world - 1, measured.queue_pairs,
                        per_peer(measured.handshaken.heap, base.handshaken.heap),
                        per_peer(measured.handshaken.rss, base.handshaken.rss),
                        per_peer(measured.built.heap, base.built.heap),
                        per_peer(measured.handshaken.heap - measured.built.heap,
                                 base.handshaken.heap - base.built.heap));
            std::fflush(stdout);
        }
    } catch (const Error& error) {
        std::fprintf(stderr, "peer_cost_benchmark: %s\n", error.what());
        return 1;
    }
    return 0;
}
