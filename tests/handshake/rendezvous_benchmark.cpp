// Wall time of an N-process rendezvous (exchange + barrier), default 64 processes: the parent
// hosts the server, the children fork at once and race to register.
// Usage: rendezvous_benchmark [processes]
#include <chrono>
#include <cstdio>
#include <cstdlib>

#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "tests/handshake/rendezvous_support.hpp"

int main(int argc, char** argv) {
    const int processes = argc > 1 ? std::atoi(argv[1]) : 64;
    if (processes < 1 || processes > 4096) {
        std::fprintf(stderr, "rendezvous_benchmark: process count %s is not in 1..4096\n", argv[1]);
        return 2;
    }
    const auto world_size = static_cast<std::uint32_t>(processes);
    rdmachan::RendezvousServer server(
        {"127.0.0.1", 0, world_size, "benchmark", "bench-token", std::chrono::milliseconds(20000)});
    const std::uint16_t port = server.port();
    const auto start = std::chrono::steady_clock::now();
    const int succeeded = rdmachan::test::run_children(
        processes,
        [&](int rank) {
            rdmachan::RendezvousSettings settings;
            settings.port = port;
            settings.rank = static_cast<std::uint32_t>(rank);
            settings.world_size = world_size;
            settings.job = "benchmark";
            settings.token = "bench-token";
            settings.timeout = std::chrono::milliseconds(20000);
            const auto table = rdmachan::rendezvous(
                settings, rdmachan::test::predictable_endpoint(settings.rank, world_size));
            return table.size() == world_size ? 0 : 3;
        },
        std::chrono::milliseconds(25000), [&server] { server.start(); });
    try {
        server.wait();
    } catch (const rdmachan::Error& error) {
        std::fprintf(stderr, "rendezvous_benchmark: %s\n", error.what());
        return 1;
    }
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "rendezvous of %d processes (fork, connect, authenticate, exchange, barrier): %.3f s\n",
        processes, seconds);
    return succeeded == processes ? 0 : 1;
}
