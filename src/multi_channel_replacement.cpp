// Peer replacement on the MultiChannel side: failures and replacements reported as polled
// events, and reconnect() of one peer while the others go on (handshake/README.md, "Peer
// replacement", has the protocol; src/engine*.cpp the queue pairs).
#include "rdmachan/multi_channel.hpp"
#include "handshake/hex.hpp"
#include "handshake/peer_watch.hpp"
#include "src/engine.hpp"
#include "src/membership.hpp"
#include "src/peer_pairing.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan {
namespace {

// How reconnect and spawn_replacement name themselves in their errors: "CALL (rank R, peer rank
// P)". Throws so named when this multi-channel was connected without peer replacement.
std::string replacement_call(const char* call, std::uint32_t rank, std::uint32_t peer, bool enabled) {
    std::string me = std::string(call) + " (rank " + std::to_string(rank) + ", peer rank " + std::to_string(peer) + ")";
    if (!enabled) {
        throw Error(me + ": peer replacement is not enabled for this multi-channel (connect it with "
                         "RendezvousSettings::replacement, or connect(PeerReplacement::enabled) under PMIx)");
    }
    return me;
}

}  // namespace

std::uint64_t detail::peer_watch_rounds(const MultiChannel& channel) {
    return channel.watch_ != nullptr ? channel.watch_->finished_rounds() : 0;
}

std::string_view to_string(PeerEvent::Kind kind) {
    switch (kind) {
        case PeerEvent::Kind::failed: return "failed";
        case PeerEvent::Kind::replacement_available: return "replacement_available";
        case PeerEvent::Kind::replacement_connected: return "replacement_connected";
        case PeerEvent::Kind::joined: return "joined";
        case PeerEvent::Kind::left: return "left";
        case PeerEvent::Kind::reconnected: return "reconnected";
        case PeerEvent::Kind::refused: return "refused";
    }
    return "unknown";
}

MultiChannel::PeerLife& MultiChannel::life(std::uint32_t peer) {
    std::unique_ptr<PeerLife>& made = lives_[peer];
    if (made == nullptr) {
        made = std::make_unique<PeerLife>();
        made->session = session_of_ ? session_of_(peer) : 0;
    }
    return *made;
}

std::uint64_t MultiChannel::peer_session(std::uint32_t peer) const {
    check_peer("MultiChannel::peer_session", peer);
    if (membership_ != nullptr) return membership_->member_session(peer);
    if (lives_[peer] != nullptr) return lives_[peer]->session;
    return session_of_ ? session_of_(peer) : 0;
}

std::vector<PeerEvent> MultiChannel::poll_peer_events() {
    std::vector<PeerEvent> events;
    auto report_failure = [&](std::uint32_t peer, std::string reason) {
        PeerLife& life = this->life(peer);
        if (life.failure_reported) return;
        life.failure_reported = true;
        events.push_back({PeerEvent::Kind::failed, peer, life.session, std::move(reason)});
    };
    if (membership_ != nullptr) {
        // Its own events first: a member that left or failed is reported so, not as a queue
        // pair that failed; a pair connected again may fail again and be reported again.
        for (PeerEvent& event : membership_->poll()) {
            if (event.peer < lives_.size()) {
                PeerLife& life = this->life(event.peer);
                switch (event.kind) {
                    case PeerEvent::Kind::joined:
                    case PeerEvent::Kind::reconnected: life.failure_reported = false; break;
                    case PeerEvent::Kind::left:
                    case PeerEvent::Kind::failed: life.failure_reported = true; break;
                    default: break;
                }
            }
            events.push_back(std::move(event));
        }
    }
    // The queue pairs' view: a peer whose operations failed. A peer being replaced is not
    // reported again: its old queue pair's failure is what made it be replaced.
    for (std::uint32_t peer = 0; peer < engine_->peer_count(); ++peer) {
        if (!engine_->healthy(peer) && (lives_[peer] == nullptr || !lives_[peer]->connecting)) report_failure(peer, "its operations failed");
    }
    if (watch_ == nullptr) return events;
    for (RendezvousEvent& event : watch_->poll_events()) {
        PeerLife& life = this->life(event.rank);
        switch (event.kind) {
            case RendezvousEvent::Kind::failed:
                // A session that is not the connected one (a replacement that died before it
                // was connected) changes nothing here.
                if (event.session == life.session) {
                    report_failure(event.rank, "its process left the rendezvous (session " + handshake::to_hex_u64(event.session) +
                                                   ")");
                } else if ((life.connecting && *life.connecting == event.session) ||
                           (life.pending && life.pending->session == event.session)) {
                    // The replacement announced (or reconnected) left before it was connected:
                    // the peer stays unusable until another one comes.
                    life.connecting.reset();
                    life.pending.reset();
                    events.push_back({PeerEvent::Kind::failed, event.rank, event.session,
                                      "its replacement (session " + handshake::to_hex_u64(event.session) +
                                          ") left before it was connected"});
                }
                break;
            case RendezvousEvent::Kind::replacement:
                // The server accepts a replacement only for a rank whose process has gone.
                report_failure(event.rank, "a new process replaced it");
                life.pending = std::make_unique<Endpoint>(std::move(event.endpoint));
                life.connecting.reset();
                events.push_back({PeerEvent::Kind::replacement_available, event.rank, event.session, {}});
                break;
            case RendezvousEvent::Kind::ready:
                if (life.connecting && *life.connecting == event.session) {
                    engine_->mark_replacement_connected(event.rank);
                    life.session = event.session;
                    life.connecting.reset();
                    life.failure_reported = false;
                    events.push_back({PeerEvent::Kind::replacement_connected, event.rank, event.session, {}});
                }
                break;
        }
    }
    return events;
}

void MultiChannel::reconnect(std::uint32_t peer) {
    check_peer("MultiChannel::reconnect", peer);
    if (membership_ != nullptr) {
        membership_->reconnect(peer);
        return;
    }
    const std::string me = replacement_call("MultiChannel::reconnect", rank_, peer, watch_ != nullptr);
    if (peer == rank_) throw Error(me + ": a rank does not replace itself");
    PeerLife& life = this->life(peer);
    if (!life.pending) {
        throw Error(me + ": no replacement of rank " + std::to_string(peer) +
                    " is available (wait for PeerEvent::Kind::replacement_available)");
    }
    const Endpoint replacement = std::move(*life.pending);
    life.pending.reset();
    if (replacement.session == life.session) {
        throw Error(me + ": the endpoint offered for rank " + std::to_string(peer) + " has session " +
                    handshake::to_hex_u64(replacement.session) + ", the session that failed: refused as stale");
    }
    if (replacement.rank != peer) {
        throw Error(me + ": the replacement's endpoint is for rank " + std::to_string(replacement.rank));
    }
    std::optional<RcEntry> mine;
    try {
        mine = engine_->pairing().replace(*engine_, rank_, peer, replacement);
    } catch (const Error& error) {
        throw Error(me + ": " + error.what());
    }
    if (remote_regions_ != nullptr) remote_regions_->set(peer, replacement.regions);
    life.connecting = replacement.session;
    watch_->acknowledge_replacement(peer, replacement.session, mine);
}

std::string MultiChannel::spawn_replacement(std::uint32_t peer, const std::vector<std::string>& command) {
    check_peer("MultiChannel::spawn_replacement", peer);
    const std::string me = replacement_call("MultiChannel::spawn_replacement", rank_, peer, watch_ != nullptr);
    try {
        return watch_->spawn_replacement(peer, command);
    } catch (const Error& error) {
        throw Error(me + ": " + error.what());
    }
}

}  // namespace rdmachan
