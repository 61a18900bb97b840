// The memory a MultiChannel adds per peer, RC and DC: rank 0 of a world of N on the software
// device is built and handshaken against N-1 fabricated peer endpoints (no traffic: set-up
// cost only), and heap (mallinfo2) and RSS are read before and after. The per-peer figure is
// the difference between N and a 2-rank world divided by N-2, so what every MultiChannel costs
// regardless of its world (device, protection domain, DC receive buffers) is not counted.
// DC then posts one receive to every peer, which makes each peer's state (a DC peer's state is
// made on first use), and prints what that added per peer: the cost of a peer once contacted.
// RC also prints the parts of that figure that one queue pair and its completion-queue entries
// take, measured on their own (heap or RSS, whichever grew more: rings may be mapped memory).
// Usage: peer_cost_benchmark [--mode rc|dc] [N ...]   (default: dc 1024 4096)
#include <malloc.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "rdmachan/error.hpp"
#include "rdmachan/logging.hpp"
#include "rdmachan/multi_channel.hpp"
#include "transport/device_interface.hpp"

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
    // Not an IPv4-mapped GID, so the software device never dials it: an RC QP at RTS opens a
    // connection to its peer's device, and these peers do not exist (a real peer's connection
    // costs a socket and a buffer or two in each process, outside these figures).
    endpoint.port.gid = {0xfd, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, static_cast<std::uint8_t>(rank >> 8),
                         static_cast<std::uint8_t>(rank)};
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
    // DC: what one receive posted to every peer added, the handles' own memory left out: each
    // peer's state is made by its first post (a receive needs no traffic, so the fabricated
    // peers need not exist).
    Usage contacted;
    std::uint32_t peers_contacted_after_handshake = 0;
    std::uint32_t peers_contacted = 0;
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
        measured.peers_contacted_after_handshake = channels.peers_contacted();
        if (dc) {
            std::vector<PendingWork> receives;
            receives.reserve(world);
            std::vector<std::uint8_t> landing(64);
            MemoryRegion region = channels.register_memory(landing.data(), landing.size());
            const Usage before_posts = usage_now();
            for (std::uint32_t peer = 1; peer < world; ++peer) receives.push_back(channels.post_receive(peer, region.slice(0, 64)));
            const Usage after_posts = usage_now();
            measured.contacted = {after_posts.heap - before_posts.heap, after_posts.rss - before_posts.rss};
            measured.peers_contacted = channels.peers_contacted();
            // Nothing will arrive from the fabricated peers: end the receives before the channel
            // goes (each flush warns that it gave work up; thousands of such lines say nothing).
            set_log_level("error");
            for (PendingWork& receive : receives) (void)receive.flush();
            set_log_level("warn");
        }
    }
    return measured;
}

// RC: the parts of the per-peer figure that the device objects take, measured on their own
// with the engine's default settings: one queue pair (its rings and the device's state for it),
// and the completion-queue entries the engine provisions per peer (its send and receive CQs
// hold max_send_wr and max_recv_wr entries per peer).
struct RcParts {
    double queue_pair = 0;
    double completion_entries = 0;
};

RcParts measure_rc_parts(std::uint32_t count) {
    const ChannelSettings defaults = ChannelBuilder().settings();
    auto device = transport::open_device("soft");
    auto domain = device->allocate_protection_domain();
    auto small_queue = domain->create_completion_queue(defaults.cq_entries);
    transport::QueuePairSettings settings;
    settings.max_send_wr = defaults.max_send_wr;
    settings.max_recv_wr = defaults.max_recv_wr;
    settings.max_send_sge = defaults.max_send_sge;
    settings.max_recv_sge = defaults.max_recv_sge;
    settings.max_inline_data = defaults.max_inline_data;
    RcParts parts;
    {
        const Usage before = usage_now();
        std::vector<std::shared_ptr<transport::QueuePair>> queue_pairs;
        for (std::uint32_t index = 0; index < count; ++index)
            queue_pairs.push_back(domain->create_queue_pair(settings, small_queue, small_queue));
        const Usage after = usage_now();
        parts.queue_pair = std::max(static_cast<double>(after.heap) - static_cast<double>(before.heap),
                                    static_cast<double>(after.rss) - static_cast<double>(before.rss)) / count;
    }
    {
        const Usage before = usage_now();
        auto send_queue = domain->create_completion_queue(count * defaults.max_send_wr);
        auto receive_queue = domain->create_completion_queue(count * defaults.max_recv_wr);
        const Usage after = usage_now();
        parts.completion_entries = std::max(static_cast<double>(after.heap) - static_cast<double>(before.heap),
                                            static_cast<double>(after.rss) - static_cast<double>(before.rss)) / count;
    }
    return parts;
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
            if (dc) {
                const double contacted_peers = world - 1.0;
                std::printf("peer cost: mode=dc peers=%u peers_contacted_after_handshake=%u never_contacted_heap_per_peer=%.0f "
                            "contacted_heap_per_peer=%.0f contacted_rss_per_peer=%.0f (a first post, a receive, to each of "
                            "%u peers: what it added per peer, plus the never-contacted figure)\n",
                            world - 1, measured.peers_contacted_after_handshake,
                            per_peer(measured.handshaken.heap, base.handshaken.heap),
                            per_peer(measured.handshaken.heap, base.handshaken.heap) +
                                static_cast<double>(measured.contacted.heap) / contacted_peers,
                            per_peer(measured.handshaken.rss, base.handshaken.rss) +
                                static_cast<double>(measured.contacted.rss) / contacted_peers,
                            measured.peers_contacted);
            }
            if (!dc) {
                const RcParts parts = measure_rc_parts(world);
                std::printf("peer cost: mode=rc peers=%u of which queue_pair=%.0f completion_queue_entries=%.0f "
                            "(the rest: the engine's operation slots, max_send_wr + max_recv_wr per peer, and "
                            "its per-peer state)\n",
                            world - 1, parts.queue_pair, parts.completion_entries);
            }
            std::fflush(stdout);
        }
    } catch (const Error& error) {
        std::fprintf(stderr, "peer_cost_benchmark: %s\n", error.what());
        return 1;
    }
    return 0;
}
