// RC pairing: a queue pair per pair. Each side makes one for the other and publishes it in its
// endpoint's 'rc' entries (a fixed world: one per rank), or offers it (peers added by the
// application, membership); each connects its queue pair to the one the other made for it.
#include <string>

#include "rdmachan/error.hpp"
#include "src/endpoint_peer.hpp"
#include "src/engine.hpp"
#include "src/peer_pairing.hpp"

namespace rdmachan::detail {
namespace {

std::string rank_named(std::uint32_t rank) { return "rank " + std::to_string(rank); }

// The queue pair `theirs` made for `rank`: its RC entry that names that rank.
const RcEntry* entry_for(const Endpoint& theirs, std::uint32_t rank) {
    const RcEntry* found = nullptr;
    for (const RcEntry& entry : theirs.rc) {
        if (entry.peer == rank) found = &entry;
    }
    return found;
}

class RcPairing final : public PeerPairing {
public:
    MultiChannelMode mode() const override { return MultiChannelMode::reliable_connected; }

    std::optional<std::string> mismatch(const Endpoint& theirs) const override {
        if (theirs.dc.empty()) return std::nullopt;
        return std::string("is in DC mode (endpoint field 'dc' is set), this process in RC mode");
    }

    void describe(const Engine& engine, Endpoint& own) const override {
        for (std::uint32_t peer = 0; peer < engine.peer_count(); ++peer) {
            const ChannelEndpoint& local = engine.local_endpoint(peer);
            own.rc.push_back(RcEntry{peer, local.qpn, local.psn});
        }
    }

    std::vector<ChannelEndpoint> per_peer_endpoints(const Engine& engine, const char*) const override {
        std::vector<ChannelEndpoint> endpoints;
        for (std::uint32_t peer = 0; peer < engine.peer_count(); ++peer) endpoints.push_back(engine.local_endpoint(peer));
        return endpoints;
    }

    void connect_world(Engine& engine, std::uint32_t rank, const std::vector<Endpoint>& table,
                       const std::string& me) const override {
        // Every rank's entry is found before any queue pair moves: a bad table connects nothing.
        std::vector<ChannelEndpoint> remotes(table.size());
        for (std::uint32_t peer = 0; peer < table.size(); ++peer) {
            const Endpoint& theirs = table[peer];
            if (theirs.rc.empty()) {
                if (const std::optional<std::string> why = mismatch(theirs)) throw Error(me + ": " + rank_named(peer) + " " + *why);
            }
            const RcEntry* entry = entry_for(theirs, rank);
            if (entry == nullptr) throw Error(me + ": " + rank_named(peer) + " published no RC entry for " + rank_named(rank));
            remotes[peer] = rc_peer_of(theirs, entry->qpn, entry->psn);
        }
        // Queue pair `peer` of this rank talks to the queue pair that peer made for this rank.
        for (std::uint32_t peer = 0; peer < table.size(); ++peer) engine.connect(peer, remotes[peer]);
    }

    void connect_own_slot(Engine& engine, std::uint32_t rank, const Endpoint&, const char* why) const override {
        const ChannelEndpoint local = engine.prepare_rc_peer(rank, why);
        engine.connect_prepared_rc(rank, local);
    }

    std::optional<RcEntry> offer(Engine& engine, std::uint32_t peer, const char* why) const override {
        const ChannelEndpoint& local = engine.prepare_rc_peer(peer, why);
        return RcEntry{peer, local.qpn, local.psn};
    }

    void connect_offered(Engine& engine, std::uint32_t rank, std::uint32_t peer, const Endpoint& theirs, bool offered,
                         const char*) const override {
        const RcEntry* mine = entry_for(theirs, rank);
        if (mine == nullptr) {
            const std::optional<std::string> why = mismatch(theirs);
            throw Error("endpoint field 'rc' has no entry for " + rank_named(rank) +
                        (why ? " (the peer " + *why + ")" : " (the peer's offer_peer for this rank gives one)"));
        }
        if (!offered) {
            throw Error("this process offered it no queue pair since it was last connected: call offer_peer(" +
                        std::to_string(peer) + ") first and give the peer that offer");
        }
        engine.connect_prepared_rc(peer, rc_peer_of(theirs, mine->qpn, mine->psn));
    }

    // Membership offers a queue pair as offer_peer does, once the member's endpoint is known.
    PairStart begin(Engine& engine, std::uint32_t peer, const Endpoint&, const char* why) const override {
        const RcEntry offered = *offer(engine, peer, why);
        return PairStart{offered.qpn, offered.psn, false};
    }

    std::optional<std::string> record_mismatch(std::uint32_t, std::uint32_t) const override { return std::nullopt; }

    void answer(Engine& engine, std::uint32_t peer, const Endpoint& theirs, std::uint32_t qpn,
                std::uint32_t psn) const override {
        engine.connect_prepared_rc(peer, rc_peer_of(theirs, qpn, psn));
    }

    std::optional<RcEntry> replace(Engine& engine, std::uint32_t rank, std::uint32_t peer,
                                   const Endpoint& replacement) const override {
        const RcEntry* entry = entry_for(replacement, rank);
        if (entry == nullptr) {
            const std::optional<std::string> why = mismatch(replacement);
            throw Error("the replacement published no RC entry for this rank" + (why ? " (it " + *why + ")" : std::string()));
        }
        engine.replace_rc_peer(peer, rc_peer_of(replacement, entry->qpn, entry->psn));
        const ChannelEndpoint& local = engine.local_endpoint(peer);
        return RcEntry{peer, local.qpn, local.psn};
    }
};

}  // namespace

const PeerPairing& rc_pairing() {
    static const RcPairing pairing;
    return pairing;
}

}  // namespace rdmachan::detail
