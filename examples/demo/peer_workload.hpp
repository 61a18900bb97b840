// One peer of the demo: connect through the rendezvous (or PMIx under a PMIx launcher), then per iteration an all-to-all
// scatter_write of per-peer slices carrying immediates, the immediates received from every peer,
// every incoming byte verified, a gather_read of what it wrote, and a multicast_send of a
// control message that also keeps the peers in step. Throws std::exception naming the rank and
// what failed.
#pragma once

#include <functional>
#include <optional>
#include <string>

#include "examples/demo/demo_options.hpp"
#include "examples/demo/peer_report.hpp"

namespace demo {

struct PeerIdentity {
    // Under PMIx rank and world size come from the launcher: here only what the flags or the
    // environment said (checked against PMIx), and no rendezvous or token is needed.
    bool pmix = false;
    std::optional<std::uint32_t> rank;
    std::optional<std::uint32_t> world_size;
    std::string rendezvous_host;
    std::uint16_t rendezvous_port = 0;
    std::string job;
    std::string token;
};

// progress(event, iteration): "connected" once, then "iteration" after each round.
using ProgressCallback = std::function<void(const char* event, std::uint32_t iteration)>;

PeerReport run_peer(const PeerIdentity& identity, const Workload& workload, const ProgressCallback& progress);

}  // namespace demo
