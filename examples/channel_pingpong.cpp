// Two processes, one Channel between them: they exchange endpoints as JSON (here through a
// pair of pipes; any out-of-band channel works), then ping-pong a message N times and check
// every byte. Runs on the software mlx5 device where there is no RDMA NIC.
//
//   channel_pingpong [iterations] [message bytes]
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/channel.hpp"

namespace {

void write_line(int descriptor, const std::string& line) {
    const std::string text = line + "\n";
    if (::write(descriptor, text.data(), text.size()) != static_cast<ssize_t>(text.size())) throw rdmachan::Error("pipe write failed");
}

std::string read_line(int descriptor) {
    std::string line;
    char c = 0;
    while (::read(descriptor, &c, 1) == 1 && c != '\n') line += c;
    if (line.empty()) throw rdmachan::Error("the peer closed the endpoint exchange");
    return line;
}

std::uint8_t pattern(int round, std::size_t i) { return static_cast<std::uint8_t>(round * 31 + i); }

int run(bool pinger, int to_peer, int from_peer, int iterations, std::size_t bytes) {
    rdmachan::PreparedChannel prepared = rdmachan::ChannelBuilder().deadline(std::chrono::seconds(10)).min_rnr_timer(1).build();
    write_line(to_peer, nlohmann::json(prepared.endpoint()).dump());
    const auto remote = nlohmann::json::parse(read_line(from_peer)).get<rdmachan::ChannelEndpoint>();
    rdmachan::Channel channel = std::move(prepared).handshake(remote);

    std::vector<std::uint8_t> memory(2 * bytes);
    rdmachan::MemoryRegion region = channel.register_memory(memory.data(), memory.size());
    const rdmachan::LocalSlice outgoing = region.slice(0, bytes);
    const rdmachan::LocalSlice incoming = region.slice(bytes, bytes);

    // Both sides post their first receive before either sends (the pipe is the barrier); a
    // receive is posted only for a message that will come, so none is left at the end.
    const int first_incoming = pinger ? 1 : 0;
    std::optional<rdmachan::PendingWork> receive;
    if (first_incoming < iterations) receive = channel.post_receive(incoming);
    write_line(to_peer, "ready");
    read_line(from_peer);

    const auto start = std::chrono::steady_clock::now();
    for (int round = 0; round < iterations; ++round) {
        const bool my_turn = (round % 2 == 0) == pinger;
        if (my_turn) {
            for (std::size_t i = 0; i < bytes; ++i) memory[i] = pattern(round, i);
            const rdmachan::WorkResult sent = channel.send(outgoing, static_cast<std::uint32_t>(round));
            if (!sent) {
                std::fprintf(stderr, "%s: %s\n", pinger ? "ping" : "pong", sent.error().message().c_str());
                return 1;
            }
        } else {
            const rdmachan::WorkResult got = receive->wait();
            if (!got) {
                std::fprintf(stderr, "%s: %s\n", pinger ? "ping" : "pong", got.error().message().c_str());
                return 1;
            }
            if (got.completion().immediate.value_or(~0u) != static_cast<std::uint32_t>(round) || got.completion().bytes != bytes) {
                std::fprintf(stderr, "round %d: wrong message (immediate or length)\n", round);
                return 1;
            }
            for (std::size_t i = 0; i < bytes; ++i) {
                if (memory[bytes + i] != pattern(round, i)) {
                    std::fprintf(stderr, "round %d: byte %zu differs\n", round, i);
                    return 1;
                }
            }
            receive.reset();
            if (round + 2 < iterations) receive = channel.post_receive(incoming);
        }
    }
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    if (pinger) {
        std::printf("channel_pingpong: %d messages of %zu bytes, every byte checked; %.2f us per one-way message\n",
                    iterations, bytes, seconds * 1e6 / iterations);
    }
    write_line(to_peer, "done");
    read_line(from_peer);
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    const int iterations = argc > 1 ? std::atoi(argv[1]) : 1000;
    const std::size_t bytes = argc > 2 ? static_cast<std::size_t>(std::atol(argv[2])) : 64;
    if (iterations <= 0 || bytes == 0 || bytes > (1u << 20)) {
        std::fprintf(stderr, "usage: %s [iterations > 0] [message bytes 1..1048576]\n", argv[0]);
        return 2;
    }
    int down[2];
    int up[2];
    if (::pipe(down) != 0 || ::pipe(up) != 0) return 1;
    const pid_t child = ::fork();
    if (child < 0) return 1;
    try {
        if (child == 0) std::_Exit(run(false, up[1], down[0], iterations, bytes));
        const int result = run(true, down[1], up[0], iterations, bytes);
        int status = 0;
        ::waitpid(child, &status, 0);
        const bool child_ok = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!child_ok) std::fprintf(stderr, "channel_pingpong: the pong process failed\n");
        return result == 0 && child_ok ? 0 : 1;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "channel_pingpong (%s): %s\n", child == 0 ? "pong" : "ping", error.what());
        if (child == 0) std::_Exit(1);
        return 1;
    }
}
