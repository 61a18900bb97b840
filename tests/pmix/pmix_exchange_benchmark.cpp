// One rank of the PMIx exchange benchmark (scripts/pmix_exchange_benchmark.sh runs it under
// mpirun). Each rank builds an RC multi-channel on the software device, then times the PMIx
// exchange alone: from the first PMIx_Put to the last PMIx_Get (publish, fence with data
// collection, reading every peer's endpoint). It then connects and meets in the barrier, so a
// table that cannot connect fails the run. Prints "rank R seconds S bytes B publish P fence F
// read G" on stdout (B: the value bytes it read from PMIx; P, F, G: the exchange's three phases,
// PmixSession::ExchangePhases, in seconds).
//   pmix_exchange_benchmark [--synthetic] [--arrived]
// --synthetic: no device; each rank publishes a made-up RC endpoint (one entry per peer, QPN
// derived from both ranks) and checks that what it read is the entry each peer made for it —
// for more ranks than software devices fit on the machine.
// --arrived: a fence without data first, so the clock starts once every rank has arrived: the
// exchange without the launch's skew (ranks started one after another on few cores).
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "handshake/pmix_bootstrap.hpp"
#include "rdmachan/multi_channel.hpp"

namespace {

using Clock = std::chrono::steady_clock;

std::uint32_t synthetic_qpn(std::uint32_t from, std::uint32_t to) { return (from * 4099u + to * 31u + 1u) & 0xffffffu; }

rdmachan::Endpoint synthetic_endpoint(std::uint32_t rank, std::uint32_t world) {
    rdmachan::Endpoint endpoint;
    endpoint.rank = rank;
    endpoint.session = 0x5e55000000000000ull | rank;
    endpoint.device = rdmachan::DeviceKind::soft;
    endpoint.port.lid = static_cast<std::uint16_t>(1 + rank % 60000);
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        endpoint.rc.push_back({peer, synthetic_qpn(rank, peer), (rank * 7u + peer) & 0xffffffu});
    }
    return endpoint;
}

}  // namespace

int main(int argc, char** argv) {
    bool synthetic = false;
    bool arrived = false;
    for (int index = 1; index < argc; ++index) {
        if (std::strcmp(argv[index], "--synthetic") == 0) {
            synthetic = true;
        } else if (std::strcmp(argv[index], "--arrived") == 0) {
            arrived = true;
        } else {
            std::fprintf(stderr, "pmix_exchange_benchmark: unknown option %s\n", argv[index]);
            return 2;
        }
    }
    std::uint32_t rank = 0;
    try {
        const std::shared_ptr<rdmachan::detail::PmixSession> session = rdmachan::detail::PmixSession::open(rdmachan::detail::PmixSession::Clock::now() + std::chrono::seconds(60));
        rank = session->rank();
        const std::uint32_t world = session->world_size();
        const Clock::time_point deadline = Clock::now() + std::chrono::seconds(120);
        double seconds = 0;
        if (synthetic) {
            const rdmachan::Endpoint mine = synthetic_endpoint(rank, world);
            if (arrived) session->barrier(deadline);
            const Clock::time_point started = Clock::now();
            const std::vector<rdmachan::Endpoint> table = session->exchange(mine, deadline);
            seconds = std::chrono::duration<double>(Clock::now() - started).count();
            for (std::uint32_t peer = 0; peer < world; ++peer) {
                const rdmachan::Endpoint& theirs = table[peer];
                if (theirs.rank != peer || theirs.rc.size() != 1 || theirs.rc[0].peer != rank ||
                    theirs.rc[0].qpn != synthetic_qpn(peer, rank)) {
                    throw std::runtime_error("the endpoint read for rank " + std::to_string(peer) +
                                             " is not the one it published for this rank");
                }
            }
            session->barrier(deadline);
        } else {
            rdmachan::ChannelBuilder channel = rdmachan::ChannelBuilder().device("soft").deadline(std::chrono::seconds(120));
            rdmachan::PreparedMultiChannel prepared = rdmachan::MultiChannelBuilder(channel)
                                                          .bootstrap(rdmachan::Bootstrap::tcp)  // the session above is used
                                                          .rank(rank)
                                                          .world_size(world)
                                                          .build();
            const rdmachan::Endpoint mine = prepared.endpoint();
            if (arrived) session->barrier(deadline);
            const Clock::time_point started = Clock::now();
            const std::vector<rdmachan::Endpoint> table = session->exchange(mine, deadline);
            seconds = std::chrono::duration<double>(Clock::now() - started).count();
            rdmachan::MultiChannel channels = std::move(prepared).handshake(table);
            session->barrier(deadline);
        }
        const rdmachan::detail::PmixSession::ExchangePhases& phases = session->last_exchange_phases();
        std::printf("rank %u seconds %.6f bytes %llu publish %.6f fence %.6f read %.6f\n", rank, seconds,
                    static_cast<unsigned long long>(session->last_exchange_bytes()), phases.publish, phases.fence,
                    phases.read);
        return 0;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "pmix_exchange_benchmark (rank %u): %s\n", rank, error.what());
        return 1;
    }
}
