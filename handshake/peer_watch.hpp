// What a MultiChannel with peer replacement listens to for failed ranks and their replacements:
// the TCP rendezvous server's watch connection, or the PMIx launcher's data store
// (pmix_replacement.hpp). Internal; MultiChannel::poll_peer_events and reconnect use it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/rendezvous.hpp"

namespace rdmachan::detail {

class PeerWatch {
  public:
    virtual ~PeerWatch() = default;
    // What happened since the last call; never blocks for long (no network round trip under TCP,
    // none under PMIx either: a thread of the watch does the lookups).
    virtual std::vector<RendezvousEvent> poll_events() = 0;
    // This rank connected the replacement `session` of `peer`; RC: the queue pair it made for it.
    virtual void acknowledge_replacement(std::uint32_t peer, std::uint64_t session, const std::optional<RcEntry>& entry) = 0;
    // Starts a process that takes `peer`'s rank, running `command`; returns what names it (the
    // PMIx namespace). Throws rdmachan::Error where the exchange cannot start processes (TCP).
    virtual std::string spawn_replacement(std::uint32_t peer, const std::vector<std::string>& command) = 0;
    // How many looks at the launcher's data store the watch has finished (PMIx; the TCP watch
    // hears of changes as they happen and has no rounds: 0). A check that nothing was announced
    // waits for a round that began after the moment that matters, instead of a guessed time.
    virtual std::uint64_t finished_rounds() const { return 0; }
};

// The TCP rendezvous's watch (after its barrier, with replacement enabled).
std::shared_ptr<PeerWatch> watch_through_rendezvous(std::shared_ptr<Rendezvous> rendezvous);

}  // namespace rdmachan::detail
