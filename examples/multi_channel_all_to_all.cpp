// N processes, one MultiChannel each, connected through the rendezvous: every rank writes a
// slice to every rank (itself included) with one scatter_write carrying its rank as immediate
// data, learns of the incoming slices from the immediates, and checks every byte.
//
//   multi_channel_all_to_all [ranks] [slice bytes]
//
// The parent process plays the launcher: it forks the ranks, runs the rendezvous server, and
// tells the ranks its port through a pipe (a real job would use rdmachan-demo or its launcher's
// environment).
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rdmachan/launcher_environment.hpp"
#include "rdmachan/multi_channel.hpp"

namespace {

std::uint8_t pattern(std::uint32_t from, std::uint32_t to, std::uint32_t index) {
    return static_cast<std::uint8_t>(from * 29 + to * 11 + index);
}

int run_rank(std::uint32_t rank, std::uint32_t ranks, std::uint32_t slice, int port_pipe, const std::string& token) {
    std::uint16_t port = 0;
    if (read(port_pipe, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) {
        std::fprintf(stderr, "rank %u: the launcher never sent the rendezvous port\n", rank);
        return 1;
    }
    // [outgoing slice for each rank][incoming slice from each rank]
    std::vector<std::uint8_t> memory(2 * static_cast<std::size_t>(ranks) * slice);
    for (std::uint32_t peer = 0; peer < ranks; ++peer) {
        for (std::uint32_t i = 0; i < slice; ++i) memory[peer * slice + i] = pattern(rank, peer, i);
    }
    rdmachan::PreparedMultiChannel prepared =
        rdmachan::MultiChannelBuilder(rdmachan::ChannelBuilder().deadline(std::chrono::seconds(20))).rank(rank).world_size(ranks).build();
    rdmachan::MemoryRegion region = prepared.register_memory(memory.data(), memory.size());
    prepared.publish_region("buffer", region);
    rdmachan::RendezvousSettings settings;
    settings.port = port;
    settings.rank = rank;
    settings.world_size = ranks;
    settings.job = "multi_channel_all_to_all";
    settings.token = token;
    settings.timeout = std::chrono::seconds(30);
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
    const std::string token = rdmachan::generate_job_token();

    std::vector<int> port_pipes;
    std::vector<pid_t> children;
    for (std::uint32_t rank = 0; rank < ranks; ++rank) {
        int ends[2];
        if (pipe(ends) != 0) return 1;
        const pid_t child = fork();
        if (child == 0) {
            close(ends[1]);
            int code = 1;
            try {
                code = run_rank(rank, ranks, slice, ends[0], token);
            } catch (const std::exception& error) {
                std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
            }
            std::fflush(stdout);
            _exit(code);
        }
        close(ends[0]);
        port_pipes.push_back(ends[1]);
        children.push_back(child);
    }
    // The server starts after the fork: no thread exists when the children are made.
    int failures = 0;
    try {
        rdmachan::RendezvousServerSettings server_settings;
        server_settings.world_size = ranks;
        server_settings.job = "multi_channel_all_to_all";
        server_settings.token = token;
        server_settings.timeout = std::chrono::seconds(30);
        rdmachan::RendezvousServer server(server_settings);
        server.start();
        const std::uint16_t port = server.port();
        for (int descriptor : port_pipes) {
            if (write(descriptor, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) ++failures;
            close(descriptor);
        }
        server.wait();
    } catch (const std::exception& error) {
        std::fprintf(stderr, "launcher: %s\n", error.what());
        ++failures;
    }
    for (pid_t child : children) {
        int status = 0;
        if (waitpid(child, &status, 0) != child || !WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
    }
    if (failures != 0) {
        std::fprintf(stderr, "multi_channel_all_to_all: %d failure(s)\n", failures);
        return 1;
    }
    std::printf("multi_channel_all_to_all: %u ranks exchanged %u-byte slices all-to-all, every byte verified\n", ranks, slice);
    return 0;
}
