// One peer of the demo: connect through the rendezvous (or PMIx under a PMIx launcher), then per iteration an all-to-all
// scatter_write of per-peer slices carrying immediates, the immediates received from every peer,
// every incoming byte verified, a gather_read of what it wrote, and a multicast_send of a
// control message that also keeps the peers in step. Throws std::exception naming the rank and
// what failed.
#pragma once

#include <chrono>
#include <functional>
#include <stdexcept>
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

// What run_peer throws when the workload fails: the reason, and when it failed on the host's
// monotonic clock, taken where the failure was caught inside run_peer, before its multi-channel
// is torn down. The teardown closes the connections to the other peers, which then fail too;
// the local launcher orders failures by these times to name the first one.
class PeerFailure : public std::runtime_error {
public:
    PeerFailure(const std::string& what, std::chrono::steady_clock::time_point at) : std::runtime_error(what), at_(at) {}
    std::chrono::steady_clock::time_point at() const { return at_; }

private:
    std::chrono::steady_clock::time_point at_;
};

PeerReport run_peer(const PeerIdentity& identity, const Workload& workload, const ProgressCallback& progress);

}  // namespace demo
