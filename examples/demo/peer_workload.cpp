#include "examples/demo/peer_workload.hpp"

#include <chrono>
#include <cstring>
#include <ctime>
#include <optional>
#include <stdexcept>
#include <vector>

#include "examples/demo/slice_pattern.hpp"
#include "rdmachan/multi_channel.hpp"

namespace demo {
namespace {

using Clock = std::chrono::steady_clock;

// One rank's buffer: [outgoing slice per peer][incoming slice per peer][read back per peer]
// [control message out][control message in, per peer].
struct Layout {
    std::uint32_t world;
    std::uint64_t size;
    std::uint64_t outgoing(std::uint32_t peer) const { return peer * size; }
    std::uint64_t incoming(std::uint32_t peer) const { return (world + peer) * size; }
    std::uint64_t read_back(std::uint32_t peer) const { return (2ull * world + peer) * size; }
    std::uint64_t control_out() const { return 3ull * world * size; }
    std::uint64_t control_in(std::uint32_t peer) const { return control_out() + 8 + peer * 8ull; }
    std::uint64_t total() const { return control_in(world); }
};

[[noreturn]] void fail(std::uint32_t rank, const std::string& what) {
    throw std::runtime_error("rank " + std::to_string(rank) + ": " + what);
}

void require(std::uint32_t rank, const rdmachan::MultiResult& result, const char* what) {
    if (!result.ok()) fail(rank, std::string(what) + " failed:\n" + result.message());
}

rdmachan::MultiChannelMode mode_of(const std::string& name) {
    return name == "dc" ? rdmachan::MultiChannelMode::dynamically_connected
                        : rdmachan::MultiChannelMode::reliable_connected;
}

rdmachan::WaitMode wait_mode_of(const std::string& name) {
    if (name == "spin") return rdmachan::WaitMode::spin;
    return name == "event" ? rdmachan::WaitMode::event : rdmachan::WaitMode::adaptive;
}

double process_cpu_seconds() {
    timespec time{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &time);
    return static_cast<double>(time.tv_sec) + static_cast<double>(time.tv_nsec) / 1e9;
}

PeerReport run_workload(const PeerIdentity& identity, const Workload& workload, const ProgressCallback& progress) {
    // Waits spin, then sleep, without the default's yields: the local peers and their device
    // threads outnumber the cores, and a thread that yields keeps its share of the CPU under
    // Linux's scheduler, taking it from the threads that would complete the work (defaults, 4
    // peers on 2 CPUs, six alternating runs: 270-381 MB/s with the default 192 yields, 365-502
    // without).
    rdmachan::ChannelBuilder channel = rdmachan::ChannelBuilder()
                                           .device(workload.device)
                                           .deadline(workload.timeout)
                                           .backoff(64, 0, std::chrono::microseconds(50))
                                           .wait_mode(wait_mode_of(workload.wait));
    rdmachan::MultiChannelBuilder builder = rdmachan::MultiChannelBuilder(channel).mode(mode_of(workload.mode));
    builder.bootstrap(identity.pmix ? rdmachan::Bootstrap::pmix : rdmachan::Bootstrap::tcp);
    if (identity.rank) builder.rank(*identity.rank);
    if (identity.world_size) builder.world_size(*identity.world_size);
    rdmachan::PreparedMultiChannel prepared = builder.build();
    const std::uint32_t rank = prepared.rank();
    const std::uint32_t world = prepared.world_size();
    const Layout layout{world, workload.size};
    // Memory from the library: on the software device, peers on this host map it, so their
    // RDMA writes into it need no system call (transport/soft/README.md, "Allocated memory").
    rdmachan::MemoryRegion region = prepared.allocate_memory(layout.total());
    prepared.publish_region("buffer", region);
    std::optional<rdmachan::MultiChannel> connected;
    // From here a failure is stamped inside this frame, while `connected` still exists: its
    // destruction makes the other peers fail, and they must not look earlier than this one.
    try {
        if (identity.pmix) {
            connected.emplace(std::move(prepared).connect());
        } else {
            rdmachan::RendezvousSettings settings;
            settings.host = identity.rendezvous_host;
            settings.port = identity.rendezvous_port;
            settings.rank = rank;
            settings.world_size = world;
            settings.job = identity.job;
            settings.token = identity.token;
            settings.timeout = workload.timeout;
            connected.emplace(std::move(prepared).connect(settings));
        }
        rdmachan::MultiChannel& channels = *connected;
        progress("connected", 0);
        if (workload.fail_rank == rank) fail(rank, "failing on purpose (--fail-rank " + std::to_string(rank) + ")");

        std::vector<rdmachan::PeerRemoteMemoryRegion> remotes;
        std::vector<std::uint32_t> everyone;
        for (std::uint32_t peer = 0; peer < world; ++peer) {
            remotes.push_back(channels.remote_region(peer, "buffer"));
            everyone.push_back(peer);
        }
        std::vector<rdmachan::PeerTransfer> writes, reads, notices, controls;
        for (std::uint32_t peer = 0; peer < world; ++peer) {
            writes.push_back({peer, region.slice(layout.outgoing(peer), workload.size),
                              remotes[peer].region.slice(layout.incoming(rank), workload.size)});
            reads.push_back({peer, region.slice(layout.read_back(peer), workload.size),
                             remotes[peer].region.slice(layout.incoming(rank), workload.size)});
            notices.push_back({peer, region.slice(0, 0), {}});  // receives the write's immediate only
            controls.push_back({peer, region.slice(layout.control_in(peer), 8), {}});
        }

        // A timed run keeps a fixed reservoir of latency samples, so its memory stays flat.
        constexpr std::size_t kLatencySamples = 65536;
        std::vector<double> latencies;
        // Touched up front: filling it later would grow the resident memory for minutes.
        if (workload.duration) latencies.assign(kLatencySamples, 0.0);
        std::uint64_t latencies_seen = 0;
        std::uint64_t reservoir_state = 0x9e3779b97f4a7c15ull ^ rank;
        // Rank 0 decides when a timed run ends and says so in its control message; every peer
        // stops after the same iteration.
        constexpr std::uint64_t kStopFlag = 1ull << 40;
        bool stop = false;
        auto* bytes = static_cast<std::uint8_t*>(region.data());
        // Every receive is posted before any peer can send into it, so no message waits out an RNR
        // NAK (0.64 ms at the default min_rnr_timer; a ConnectX answers the same way). The first
        // notices are posted before this rank says it is ready, and nobody writes before every
        // peer said so; later ones before the last control message of the iteration before went
        // out, and every peer writes only once it has every control message; the control receives
        // are posted before this rank's writes, which every peer waits for before it sends its
        // control message. Each queue pair's receive queue then holds them in the order its
        // messages come: ready, notices(0), controls(0), notices(1), ...
        constexpr std::uint64_t kReady = 0x7eadf00000000000ull;
        rdmachan::PendingMultiWork ready_arrivals = channels.post_gather_receive(controls);
        std::optional<rdmachan::PendingMultiWork> arrivals;
        arrivals.emplace(channels.post_gather_receive(notices));
        std::memcpy(bytes + layout.control_out(), &kReady, sizeof kReady);
        require(rank, channels.multicast_send(everyone, region.slice(layout.control_out(), 8)), "multicast_send (ready)");
        require(rank, ready_arrivals.wait(), "receiving the peers' ready messages");
        for (std::uint32_t peer = 0; peer < world; ++peer) {
            std::uint64_t received = 0;
            std::memcpy(&received, bytes + layout.control_in(peer), sizeof received);
            if (received != kReady) fail(rank, "the ready message from rank " + std::to_string(peer) + " is wrong");
        }
        // The clock starts once every peer is ready: the ranks leave the rendezvous's barrier up
        // to a few milliseconds apart on a loaded host, and the first to leave would otherwise
        // count waiting for the last as transfer time.
        const Clock::time_point started = Clock::now();
        const double cpu_started = process_cpu_seconds();
        // A timed run stops after the iteration rank 0 announced as the last in the control
        // message before it, so every peer knows not to post notices for another.
        bool last = !workload.duration && workload.iterations == 1;
        for (std::uint32_t iteration = 0; workload.duration ? !stop : iteration < workload.iterations; ++iteration) {
            for (std::uint32_t peer = 0; peer < world; ++peer)
                SlicePattern(rank, peer, iteration).fill(bytes + layout.outgoing(peer), workload.size);

            rdmachan::PendingMultiWork control_arrivals = channels.post_gather_receive(controls);
            const Clock::time_point before = Clock::now();
            require(rank, channels.scatter_write(writes, iteration << 16 | rank), "scatter_write");
            const double latency = std::chrono::duration<double, std::micro>(Clock::now() - before).count();
            if (!workload.duration) {
                latencies.push_back(latency);
            } else if (latencies_seen < kLatencySamples) {
                latencies[latencies_seen] = latency;
            } else {
                reservoir_state = reservoir_state * 6364136223846793005ull + 1442695040888963407ull;
                const std::uint64_t slot = (reservoir_state >> 11) % (latencies_seen + 1);
                if (slot < kLatencySamples) latencies[slot] = latency;
            }
            ++latencies_seen;
            const rdmachan::MultiResult arrived = arrivals->wait();
            arrivals.reset();
            require(rank, arrived, "receiving the writes' immediates");
            for (const rdmachan::PeerResult& entry : arrived.results()) {
                const std::uint32_t immediate = entry.result.completion().immediate.value_or(~0u);
                if (immediate != (iteration << 16 | entry.peer))
                    fail(rank, "the write from rank " + std::to_string(entry.peer) + " carried immediate " +
                                   std::to_string(immediate) + " in iteration " + std::to_string(iteration));
                const std::uint64_t wrong =
                    SlicePattern(entry.peer, rank, iteration).first_difference(bytes + layout.incoming(entry.peer), workload.size);
                if (wrong != workload.size)
                    fail(rank, "byte " + std::to_string(wrong) + " of the slice from rank " + std::to_string(entry.peer) +
                                   " is wrong in iteration " + std::to_string(iteration));
            }

            // Read back what this rank wrote into every peer.
            require(rank, channels.gather_read(reads), "gather_read");
            for (std::uint32_t peer = 0; peer < world; ++peer)
                if (std::memcmp(bytes + layout.read_back(peer), bytes + layout.outgoing(peer), workload.size) != 0)
                    fail(rank, "reading back the slice written to rank " + std::to_string(peer) +
                                   " gave other bytes in iteration " + std::to_string(iteration));

            // The control message: "iteration done" to everyone; nobody writes the next iteration's
            // slices before every peer has checked this one's. Receives for those slices first.
            if (!last) arrivals.emplace(channels.post_gather_receive(notices));
            const std::uint64_t done = 0xd0e0000000000000ull | iteration;
            const bool time_is_up = workload.duration && rank == 0 && Clock::now() - started >= *workload.duration;
            const std::uint64_t sent = time_is_up ? done | kStopFlag : done;
            std::memcpy(bytes + layout.control_out(), &sent, sizeof sent);
            require(rank, channels.multicast_send(everyone, region.slice(layout.control_out(), 8)), "multicast_send");
            require(rank, control_arrivals.wait(), "receiving the control messages");
            for (std::uint32_t peer = 0; peer < world; ++peer) {
                std::uint64_t received = 0;
                std::memcpy(&received, bytes + layout.control_in(peer), sizeof received);
                const bool stop_sent = peer == 0 && workload.duration && (received & kStopFlag) != 0;
                if ((stop_sent ? received & ~kStopFlag : received) != done)
                    fail(rank, "the control message from rank " + std::to_string(peer) + " is wrong in iteration " +
                                   std::to_string(iteration));
                if (stop_sent) last = true;
            }
            // Rank 0's stop makes the next iteration the last; a fixed run knows its last.
            if (workload.duration) {
                stop = last && !arrivals;
            } else if (iteration + 2 == workload.iterations) {
                last = true;
            }
            progress("iteration", iteration + 1);
        }
        const double seconds = std::chrono::duration<double>(Clock::now() - started).count();

        PeerReport report;
        report.rank = rank;
        report.device = channels.device_name();
        report.seconds = seconds;
        report.cpu_seconds = process_cpu_seconds() - cpu_started;
        if (workload.duration && latencies_seen < kLatencySamples) latencies.resize(latencies_seen);
        report.latency_p50_us = percentile(latencies, 50);
        report.latency_p99_us = percentile(latencies, 99);
        for (std::uint32_t peer = 0; peer < world; ++peer) {
            // The table counts the timed iterations only: each peer's ready message, sent and
            // received (two operations of 8 bytes, both checked above), is left out. (Counters
            // read after the ready round could already hold notices of the first iteration.)
            const rdmachan::PeerCounters total = channels.counters(peer);
            const std::uint64_t operations = total.operations - 2;
            const std::uint64_t moved = total.bytes - 2 * sizeof kReady;
            report.counters.push_back({peer, operations, moved, total.errors});
            report.operations += operations;
            report.bytes += moved;
        }
        report.throughput_mb_s = seconds > 0 ? static_cast<double>(report.bytes) / seconds / 1e6 : 0;
        return report;
    } catch (const std::exception& error) {
        throw PeerFailure(error.what(), std::chrono::steady_clock::now());
    }
}

}  // namespace

PeerReport run_peer(const PeerIdentity& identity, const Workload& workload, const ProgressCallback& progress) {
    try {
        return run_workload(identity, workload, progress);
    } catch (const PeerFailure&) {
        throw;
    } catch (const std::exception& error) {  // before the multi-channel existed
        throw PeerFailure(error.what(), std::chrono::steady_clock::now());
    }
}

}  // namespace demo
