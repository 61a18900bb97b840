// The memory a MultiChannel adds per peer, RC and DC: rank 0 of a world of N on the software
// device is built and handshaken against N-1 fabricated peer endpoints (no traffic: set-up
// cost only), and heap (mallinfo2) and RSS are read before and after. The per-peer figure is
// the difference between N and a 2-rank world divided by N-2, so what every MultiChannel costs
// regardless of its world (device, protection domain, DC receive buffers) is not counted.
// DC then posts one receive to every peer, which makes each peer's state (a DC peer's state is
// made on first use), and prints what that added per peer: the cost of a peer once contacted.
// DC is also measured connected through the TCP rendezvous, as connect(RendezvousSettings) does
// on a host whose ranks share the table: the server and the N-1 fabricated ranks are processes
// of their own (this program, started again with --serve and --fabricated-ranks), so only rank
// 0's memory is counted, and the table it maps is the host's one copy.
// RC also prints the parts of that figure that one queue pair and its completion-queue entries
// take, measured on their own (heap or RSS, whichever grew more: rings may be mapped memory).
// Usage: peer_cost_benchmark [--mode rc|dc] [N ...]   (default: dc 1024 4096)
#include <malloc.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/error.hpp"
#include "rdmachan/logging.hpp"
#include "rdmachan/multi_channel.hpp"
#include "rdmachan/rendezvous.hpp"
#include "tests/handshake/rendezvous_support.hpp"
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

constexpr const char* kJob = "peer-cost";
constexpr const char* kToken = "peer-cost-token";
constexpr std::chrono::seconds kRendezvousDeadline{300};

RendezvousSettings rank_settings(std::uint16_t port, std::uint32_t rank, std::uint32_t world) {
    return test::rendezvous_settings(port, rank, world, kJob, kToken, kRendezvousDeadline);
}

// --serve WORLD: the rendezvous server; writes its port to standard output, then serves.
int serve(std::uint32_t world) {
    RendezvousServer server({"127.0.0.1", 0, world, kJob, kToken, kRendezvousDeadline});
    server.start();
    std::printf("%u\n", server.port());
    std::fflush(stdout);
    server.wait();
    return 0;
}

// --fabricated-ranks PORT WORLD FIRST LAST: ranks [FIRST, LAST) on threads, each registering a
// fabricated DC endpoint and taking the table as a DC MultiChannel does.
int fabricated_ranks(std::uint16_t port, std::uint32_t world, std::uint32_t first, std::uint32_t last) {
    std::vector<std::thread> threads;
    std::vector<int> failed(last - first, 0);
    for (std::uint32_t rank = first; rank < last; ++rank) {
        threads.emplace_back([&, rank] {
            try {
                Rendezvous session(rank_settings(port, rank, world));
                (void)session.exchange_view(fabricated_peer(rank, 0, true));
                session.barrier();
            } catch (const Error& error) {
                std::fprintf(stderr, "peer_cost_benchmark: fabricated rank %u: %s\n", rank, error.what());
                failed[rank - first] = 1;
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    for (int one : failed)
        if (one != 0) return 1;
    return 0;
}

pid_t start_self(const std::vector<std::string>& arguments, posix_spawn_file_actions_t* actions) {
    std::vector<char*> argv;
    for (const std::string& argument : arguments) argv.push_back(const_cast<char*>(argument.c_str()));
    argv.push_back(nullptr);
    pid_t pid = 0;
    if (posix_spawn(&pid, "/proc/self/exe", actions, nullptr, argv.data(), environ) != 0)
        throw Error("peer_cost_benchmark: starting " + arguments[1] + " failed");
    return pid;
}

// Rank 0 of a DC world of `world` connected through the rendezvous: what build() and connect()
// added to its heap and RSS.
Usage measure_through_rendezvous(std::uint32_t world) {
    int port_pipe[2];
    if (::pipe(port_pipe) != 0) throw Error("peer_cost_benchmark: pipe failed");
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, port_pipe[1], 1);
    posix_spawn_file_actions_addclose(&actions, port_pipe[0]);
    const pid_t server = start_self({"peer_cost_benchmark", "--serve", std::to_string(world)}, &actions);
    posix_spawn_file_actions_destroy(&actions);
    ::close(port_pipe[1]);
    char text[16] = {};
    const ssize_t length = ::read(port_pipe[0], text, sizeof text - 1);
    ::close(port_pipe[0]);
    if (length <= 0) throw Error("peer_cost_benchmark: the rendezvous server gave no port");
    const auto port = static_cast<std::uint16_t>(std::atoi(text));
    std::vector<pid_t> children{server};
    // 16 ranks a process: each client holds a few descriptors, and thousands in one process
    // would pass the descriptor limit (docs/SCALE.md).
    for (std::uint32_t first = 1; first < world; first += 16) {
        const std::uint32_t last = std::min(world, first + 16);
        children.push_back(start_self({"peer_cost_benchmark", "--fabricated-ranks", std::to_string(port),
                                       std::to_string(world), std::to_string(first), std::to_string(last)},
                                      nullptr));
    }
    const Usage before = usage_now();
    Usage connected;
    {
        PreparedMultiChannel prepared = MultiChannelBuilder(ChannelBuilder().device("soft"))
                                            .rank(0)
                                            .world_size(world)
                                            .mode(MultiChannelMode::dynamically_connected)
                                            .dc_initiators(4)
                                            .build();
        MultiChannel channels = std::move(prepared).connect(rank_settings(port, 0, world));
        const Usage after = usage_now();
        connected = {after.heap - before.heap, after.rss - before.rss};
        if (channels.peers_contacted() != 0) throw Error("peer_cost_benchmark: the handshake made peer states");
    }
    bool all_succeeded = true;
    for (const pid_t child : children) {
        int status = 0;
        if (::waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
            all_succeeded = false;
    }
    if (!all_succeeded) throw Error("peer_cost_benchmark: a fabricated rank or the server failed (see above)");
    return connected;
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
    if (argc == 3 && std::string(argv[1]) == "--serve") return serve(static_cast<std::uint32_t>(std::atol(argv[2])));
    if (argc == 6 && std::string(argv[1]) == "--fabricated-ranks") {
        return fabricated_ranks(static_cast<std::uint16_t>(std::atol(argv[2])), static_cast<std::uint32_t>(std::atol(argv[3])),
                                static_cast<std::uint32_t>(std::atol(argv[4])), static_cast<std::uint32_t>(std::atol(argv[5])));
    }
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
        // The same for the rendezvous' own first use (OpenSSL, Asio).
        if (dc) (void)measure_through_rendezvous(2);
        const Usage rendezvous_base = dc ? measure_through_rendezvous(2) : Usage{};
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
                const Usage through = measure_through_rendezvous(world);
                std::printf("peer cost: mode=dc peers=%u through=rendezvous never_contacted_heap_per_peer=%.0f "
                            "rss_per_peer=%.0f (connect(RendezvousSettings) on a host sharing the table; its RSS "
                            "includes the pages of the host's one copy it read)\n",
                            world - 1, per_peer(through.heap, rendezvous_base.heap), per_peer(through.rss, rendezvous_base.rss));
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
