// Wall time and bytes received per rank of an N-rank rendezvous (exchange + barrier), with
// endpoints shaped as a MultiChannel publishes them: RC (one rc entry per rank, itself included,
// with random 24-bit QPNs and PSNs) or DC (one DC target, 4 DC initiators). The parent hosts the
// server; the ranks are forked processes (default), or T threads in each of N/T forked processes
// (--threads-per-process T: each rank's client holds 4 descriptors — its socket and its
// io_context's epoll, eventfd and timerfd — so 4,096 ranks in one process would need more than
// a 20,000-descriptor limit allows, with the server's 4,096 sockets besides).
// The ranks of a host share one copy of the table (protocol 3; all ranks here are on one host):
// table_copies counts the ranks that received the table over their own connection, and
// bytes_read_per_rank adds what a rank read from the host's copy to what it received;
// --no-share makes every rank receive its own (RendezvousSettings::share_table_per_host).
// --on-demand takes the table as a DC MultiChannel's connect() does (Rendezvous::exchange_view:
// kept as received or mapped, each row parsed only when asked for; the rank reads the DC
// directory and decodes the endpoint of one peer); without it every rank decodes every row
// (exchange()). The line says which: decode=on_demand or decode=whole.
// Several world sizes in one call print, for each after the first, how bytes per rank grew
// against how the world size grew (linear: the two ratios match).
// Usage: rendezvous_benchmark [--mode rc|dc] [--threads-per-process T] [--timeout SECONDS] [--no-share]
//                             [--on-demand] [N ...]
#include <sys/mman.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <system_error>
#include <thread>
#include <vector>

#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "tests/handshake/rendezvous_support.hpp"

namespace {

struct Options {
    bool dc = false;
    int threads_per_process = 1;
    int timeout_seconds = 60;
    bool share = true;
    bool on_demand = false;
    std::vector<int> world_sizes;
};

std::string read_first_line(const char* path) {
    std::string line;
    if (std::FILE* file = std::fopen(path, "r")) {
        char buffer[64] = {};
        if (std::fgets(buffer, sizeof buffer, file) != nullptr) line = buffer;
        std::fclose(file);
    }
    while (!line.empty() && line.back() == '\n') line.pop_back();
    return line.empty() ? "unknown" : line;
}

// What a MultiChannel of `world_size` ranks on one port publishes (see
// PreparedMultiChannel::endpoint()): values as wide as real ones, so the byte counts are honest.
rdmachan::Endpoint realistic_endpoint(std::uint32_t rank, std::uint32_t world_size, bool dc) {
    std::mt19937_64 random(rank * 2654435761u + 17);
    rdmachan::Endpoint endpoint;
    endpoint.rank = rank;
    endpoint.session = random();
    endpoint.device = rdmachan::DeviceKind::mlx5;
    endpoint.port.lid = static_cast<std::uint16_t>(1 + rank % 60000);
    endpoint.port.gid = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x02, 0x48, 0x4e, 0xff, 0xfe,
                         static_cast<std::uint8_t>(rank >> 8), static_cast<std::uint8_t>(rank), 0x56};
    endpoint.port.link_layer = rdmachan::LinkLayer::infiniband;
    endpoint.port.mtu = 4096;
    if (dc) {
        endpoint.dc.push_back({static_cast<std::uint32_t>(random() & 0xffffff), random()});
        for (int initiator = 0; initiator < 4; ++initiator)
            endpoint.dci.push_back(static_cast<std::uint32_t>(random() & 0xffffff));
    } else {
        endpoint.rc.reserve(world_size);
        for (std::uint32_t peer = 0; peer < world_size; ++peer)
            endpoint.rc.push_back({peer, static_cast<std::uint32_t>(random() & 0xffffff),
                                   static_cast<std::uint32_t>(random() & 0xffffff)});
    }
    endpoint.regions["buffer"] = {0x7f0000000000ull + (random() & 0xffffffff000ull), 1u << 20,
                                  static_cast<std::uint32_t>(random())};
    return endpoint;
}

// Returns 0 when the table is the one a MultiChannel can connect from: every rank present, and
// in RC mode exactly the entry each rank made for this one.
// What a rank reports to the parent, in memory shared with it.
struct RankReport {
    std::uint64_t received = 0;   // from the server, frame headers included
    std::uint64_t host_copy = 0;  // read from the host's copy of the table
    std::uint64_t own_copy = 0;   // 1 when the table came over its own connection
};

int run_rank(std::uint16_t port, std::uint32_t rank, std::uint32_t world_size, const Options& options,
             RankReport& report) {
    const bool dc = options.dc;
    rdmachan::RendezvousSettings settings = rdmachan::test::rendezvous_settings(
        port, rank, world_size, "benchmark", "bench-token", std::chrono::seconds(options.timeout_seconds));
    settings.share_table_per_host = options.share;
    rdmachan::Rendezvous session(settings);
    if (options.on_demand) {
        const auto view = session.exchange_view(realistic_endpoint(rank, world_size, dc));
        report.received = session.bytes_received();
        report.host_copy = session.table_source().host_copy_bytes;
        report.own_copy = session.table_source().kind != rdmachan::RendezvousTableSource::Kind::host_copy;
        session.barrier();
        if (view->size() != world_size) return 3;
        if (dc && view->dc_directory().empty()) return 5;
        const std::uint32_t peer = (rank + 1) % world_size;
        if (view->endpoint(peer).rank != peer) return 6;
        return 0;
    }
    const auto table = session.exchange(realistic_endpoint(rank, world_size, dc));
    report.received = session.bytes_received();
    report.host_copy = session.table_source().host_copy_bytes;
    report.own_copy = session.table_source().kind != rdmachan::RendezvousTableSource::Kind::host_copy;
    session.barrier();
    if (table.size() != world_size) return 3;
    if (!dc)
        for (const auto& endpoint : table)
            if (endpoint.rc.size() != 1 || endpoint.rc.front().peer != rank) return 4;
    return 0;
}

struct Outcome {
    bool succeeded = false;
    double seconds = 0;        // server start to every rank released
    double start_seconds = 0;  // forking the processes
    std::uint64_t min_bytes = 0, max_bytes = 0;
    double mean_bytes = 0;
    double mean_read = 0;  // received plus read from the host's copy
    std::uint64_t table_copies = 0;
};

Outcome run(const Options& options, int ranks) {
    const auto world_size = static_cast<std::uint32_t>(ranks);
    const auto timeout = std::chrono::seconds(options.timeout_seconds);
    rdmachan::RendezvousServer server({"127.0.0.1", 0, world_size, "benchmark", "bench-token",
                                       std::chrono::milliseconds(timeout)});
    const std::uint16_t port = server.port();
    // Shared with the children: each writes the bytes it received at its rank's slot.
    const std::size_t slots_size = sizeof(RankReport) * world_size;
    void* mapping = mmap(nullptr, slots_size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (mapping == MAP_FAILED) throw rdmachan::Error("rendezvous_benchmark: mmap failed");
    auto* reports = static_cast<RankReport*>(mapping);
    std::memset(mapping, 0, slots_size);

    Outcome outcome;
    const auto begin = std::chrono::steady_clock::now();
    auto server_start = begin;
    int succeeded = 0;
    const int per_process = options.threads_per_process;
    const int processes = (ranks + per_process - 1) / per_process;
    succeeded = rdmachan::test::run_children(
        processes,
        [&](int process) {
            const int first = process * per_process;
            const int last = std::min(ranks, first + per_process);
            if (per_process == 1) {
                try {
                    return run_rank(port, static_cast<std::uint32_t>(first), world_size, options, reports[first]);
                } catch (const rdmachan::Error& error) {
                    std::fprintf(stderr, "rank %d: %s\n", first, error.what());
                    return 2;
                }
            }
            std::atomic<int> good{0};
            std::vector<std::thread> threads;
            for (int rank = first; rank < last; ++rank) {
                try {
                    threads.emplace_back([&, rank] {
                        try {
                            if (run_rank(port, static_cast<std::uint32_t>(rank), world_size, options, reports[rank]) == 0)
                                good.fetch_add(1);
                        } catch (const rdmachan::Error& error) {
                            std::fprintf(stderr, "rank %d: %s\n", rank, error.what());
                        }
                    });
                } catch (const std::system_error& error) {
                    // Every thread is a task of the kernel's: kernel.pid_max and threads-max bound them.
                    std::fprintf(stderr, "rank %d: its thread could not be started: %s (kernel.pid_max is %s)\n", rank,
                                 error.what(), read_first_line("/proc/sys/kernel/pid_max").c_str());
                    break;
                }
            }
            for (auto& thread : threads) thread.join();
            return good.load() == last - first ? 0 : 3;
        },
        timeout + std::chrono::seconds(5), [&] {
            server_start = std::chrono::steady_clock::now();
            server.start();
        });
    try {
        server.wait();
        outcome.succeeded = succeeded == processes;
    } catch (const rdmachan::Error& error) {
        std::fprintf(stderr, "rendezvous_benchmark: %s\n", error.what());
    }
    // Rank 0 of the processes may still be exiting; the server saw every release already.
    outcome.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - server_start).count();
    outcome.start_seconds = std::chrono::duration<double>(server_start - begin).count();
    outcome.min_bytes = reports[0].received;
    double total = 0;
    double read = 0;
    for (std::uint32_t rank = 0; rank < world_size; ++rank) {
        outcome.min_bytes = std::min(outcome.min_bytes, reports[rank].received);
        outcome.max_bytes = std::max(outcome.max_bytes, reports[rank].received);
        total += static_cast<double>(reports[rank].received);
        read += static_cast<double>(reports[rank].received + reports[rank].host_copy);
        outcome.table_copies += reports[rank].own_copy;
    }
    outcome.mean_bytes = total / world_size;
    outcome.mean_read = read / world_size;
    munmap(mapping, slots_size);
    return outcome;
}

[[noreturn]] void usage(const char* complaint) {
    std::fprintf(stderr,
                 "rendezvous_benchmark: %s\n"
                 "usage: rendezvous_benchmark [--mode rc|dc] [--threads-per-process T] [--timeout SECONDS] "
                 "[--no-share] [--on-demand] [N ...]\n",
                 complaint);
    std::exit(2);
}

}  // namespace

int main(int argc, char** argv) {
    Options options;
    for (int index = 1; index < argc; ++index) {
        const std::string argument = argv[index];
        if (argument == "--mode" && index + 1 < argc) {
            const std::string mode = argv[++index];
            if (mode != "rc" && mode != "dc") usage("--mode must be rc or dc");
            options.dc = mode == "dc";
        } else if (argument == "--threads-per-process" && index + 1 < argc) {
            options.threads_per_process = std::atoi(argv[++index]);
            if (options.threads_per_process < 1 || options.threads_per_process > 4096)
                usage("--threads-per-process must be in 1..4096");
        } else if (argument == "--no-share") {
            options.share = false;
        } else if (argument == "--on-demand") {
            options.on_demand = true;
        } else if (argument == "--timeout" && index + 1 < argc) {
            options.timeout_seconds = std::atoi(argv[++index]);
            if (options.timeout_seconds < 1) usage("--timeout must be a positive number of seconds");
        } else {
            const int ranks = std::atoi(argument.c_str());
            if (ranks < 1 || ranks > 16384) usage(("rank count '" + argument + "' is not in 1..16384").c_str());
            options.world_sizes.push_back(ranks);
        }
    }
    if (options.world_sizes.empty()) options.world_sizes.push_back(64);
    const char* mode = options.dc ? "dc" : "rc";
    const std::string runner = options.threads_per_process == 1
                                   ? std::string("processes")
                                   : "processes_of_" + std::to_string(options.threads_per_process) + "_threads";
    int status = 0;
    const Outcome* previous = nullptr;
    int previous_ranks = 0;
    Outcome last;
    for (int ranks : options.world_sizes) {
        const Outcome outcome = run(options, ranks);
        std::printf("rendezvous: mode=%s ranks=%d runner=%s seconds=%.3f start_seconds=%.3f "
                    "bytes_per_rank=%.0f (min %llu, max %llu)",
                    mode, ranks, runner.c_str(), outcome.seconds, outcome.start_seconds, outcome.mean_bytes,
                    static_cast<unsigned long long>(outcome.min_bytes),
                    static_cast<unsigned long long>(outcome.max_bytes));
        std::printf(" table_copies=%llu bytes_read_per_rank=%.0f share=%s decode=%s",
                    static_cast<unsigned long long>(outcome.table_copies), outcome.mean_read,
                    options.share ? "per_host" : "none", options.on_demand ? "on_demand" : "whole");
        if (previous != nullptr && previous->mean_bytes > 0)
            std::printf(" bytes_ratio=%.2f for ranks_ratio=%.2f", outcome.mean_bytes / previous->mean_bytes,
                        static_cast<double>(ranks) / previous_ranks);
        std::printf("%s\n", outcome.succeeded ? "" : " FAILED");
        std::fflush(stdout);
        if (!outcome.succeeded) status = 1;
        last = outcome;
        previous = &last;
        previous_ranks = ranks;
    }
    return status;
}
