// rdmachan-demo (minimal, until the peer launcher lands): starts two local peer processes on
// the default device (the software mlx5 device where there is no RDMA NIC), connects them with
// a Channel, and has each one RDMA-write its buffer into the other, read it back and send a
// closing message with immediate data. Every byte is checked; any failure names the peer and
// exits non-zero.
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/version.hpp"

namespace {

constexpr std::size_t kBytes = 1 << 20;

void write_line(int descriptor, const std::string& line) {
    const std::string text = line + "\n";
    if (::write(descriptor, text.data(), text.size()) != static_cast<ssize_t>(text.size())) throw rdmachan::Error("pipe write failed");
}

std::string read_line(int descriptor) {
    std::string line;
    char c = 0;
    while (::read(descriptor, &c, 1) == 1 && c != '\n') line += c;
    if (line.empty()) throw rdmachan::Error("the other peer closed the endpoint exchange");
    return line;
}

std::uint8_t pattern(int rank, std::size_t i) { return static_cast<std::uint8_t>(rank * 101 + i * 7); }

// One peer. Returns an empty string on success, or what went wrong.
std::string run_peer(int rank, int to_peer, int from_peer) {
    rdmachan::PreparedChannel prepared = rdmachan::ChannelBuilder().deadline(std::chrono::seconds(10)).build();
    // memory: [0, kBytes) mine, [kBytes, 2 kBytes) the peer writes here, then a read-back area.
    std::vector<std::uint8_t> memory(3 * kBytes + 64);
    rdmachan::MemoryRegion region = prepared.register_memory(memory.data(), memory.size());
    for (std::size_t i = 0; i < kBytes; ++i) memory[i] = pattern(rank, i);
    nlohmann::json mine = {{"endpoint", prepared.endpoint()}, {"region", region.remote()}};
    write_line(to_peer, mine.dump());
    const nlohmann::json theirs = nlohmann::json::parse(read_line(from_peer));
    rdmachan::Channel channel = std::move(prepared).handshake(theirs.at("endpoint").get<rdmachan::ChannelEndpoint>());
    const auto remote = theirs.at("region").get<rdmachan::RemoteMemoryRegion>();

    rdmachan::PendingWork closing = channel.post_receive(region.slice(3 * kBytes, 64));
    write_line(to_peer, "ready");
    read_line(from_peer);

    const auto start = std::chrono::steady_clock::now();
    rdmachan::WorkResult result = channel.write(region.slice(0, kBytes), remote.slice(kBytes, kBytes));
    if (!result) return result.error().message();
    result = channel.read(region.slice(2 * kBytes, kBytes), remote.slice(kBytes, kBytes));
    if (!result) return result.error().message();
    for (std::size_t i = 0; i < kBytes; ++i) {
        if (memory[2 * kBytes + i] != pattern(rank, i)) return "read-back byte " + std::to_string(i) + " differs";
    }
    result = channel.send(region.slice(0, 16), static_cast<std::uint32_t>(rank));
    if (!result) return result.error().message();
    result = closing.wait();
    if (!result) return result.error().message();
    if (result.completion().immediate.value_or(~0u) != static_cast<std::uint32_t>(1 - rank)) return "wrong closing immediate";
    for (std::size_t i = 0; i < kBytes; ++i) {
        if (memory[kBytes + i] != pattern(1 - rank, i)) return "byte " + std::to_string(i) + " written by the peer differs";
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    write_line(to_peer, "done");
    read_line(from_peer);
    std::printf("peer %d  device %-24s  wrote %zu B, read back %zu B, sent 16 B + immediate, all verified  (%.1f ms)\n", rank,
                channel.local_endpoint().device.c_str(), kBytes, kBytes, seconds * 1e3);
    std::fflush(stdout);
    return {};
}

}  // namespace

int main() {
    std::printf("rdmachan %s demo: two local peers on the default device\n", rdmachan::version());
    std::fflush(stdout);
    int down[2];
    int up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) return 1;
    const pid_t child = ::fork();
    if (child < 0) return 1;
    const int rank = child == 0 ? 1 : 0;
    std::string failure;
    try {
        failure = rank == 0 ? run_peer(0, down[1], up[0]) : run_peer(1, up[1], down[0]);
    } catch (const std::exception& error) {
        failure = error.what();
    }
    if (!failure.empty()) std::fprintf(stderr, "rdmachan-demo: peer %d failed: %s\n", rank, failure.c_str());
    if (child == 0) std::_Exit(failure.empty() ? 0 : 1);
    int status = 0;
    ::waitpid(child, &status, 0);
    const bool ok = failure.empty() && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) std::fprintf(stderr, "rdmachan-demo: peer 1 failed\n");
    std::printf(ok ? "rdmachan-demo: all peers verified every byte\n" : "rdmachan-demo: FAILED\n");
    return ok ? 0 : 1;
}
