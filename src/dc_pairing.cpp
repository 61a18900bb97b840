// DC pairing: a peer is its process's one DC target and initiators, the same record for every
// reader, so a pair has nothing of its own to offer or answer: a side is connected to a peer as
// soon as it has the peer's endpoint.
#include <string>

#include "rdmachan/error.hpp"
#include "src/dc_peer_directory.hpp"
#include "src/endpoint_peer.hpp"
#include "src/engine.hpp"
#include "src/peer_pairing.hpp"

namespace rdmachan::detail {
namespace {

class DcPairing final : public PeerPairing {
public:
    MultiChannelMode mode() const override { return MultiChannelMode::dynamically_connected; }

    std::optional<std::string> mismatch(const Endpoint& theirs) const override {
        if (theirs.dc.empty()) return std::string("has no DC target (endpoint field 'dc' is empty): it is not in DC mode, this process is");
        // A receive names the initiator that sent it: without them, no receive could be told
        // to come from this peer.
        if (theirs.dci.empty()) return std::string("published no DC initiators (endpoint field 'dci' is empty)");
        return std::nullopt;
    }

    void describe(const Engine& engine, Endpoint& own) const override {
        own.dc.push_back(DcEntry{engine.dc_target_number(), engine.dc_key()});
        own.dci = engine.dc_initiator_numbers();
    }

    std::vector<ChannelEndpoint> per_peer_endpoints(const Engine&, const char* call) const override {
        throw Error(std::string(call) + ": a DC multi-channel has one endpoint per process, not one queue pair per peer: "
                                        "use endpoint()");
    }

    // Every rank is checked now; each is addressed when this process first posts to it or
    // receives from it (src/dc_peer_directory.hpp).
    void connect_world(Engine& engine, std::uint32_t, const std::vector<Endpoint>& table,
                       const std::string& me) const override {
        for (std::uint32_t peer = 0; peer < table.size(); ++peer) {
            if (const std::optional<std::string> why = mismatch(table[peer])) {
                throw Error(me + ": rank " + std::to_string(peer) + " " + *why);
            }
        }
        engine.use_dc_directory(DcPeerDirectory::from_endpoints(table, me));
    }

    void connect_own_slot(Engine& engine, std::uint32_t rank, const Endpoint& own, const char* why) const override {
        engine.connect_dc_member(rank, dc_peer_of(own), why);
    }

    std::optional<RcEntry> offer(Engine&, std::uint32_t, const char*) const override { return std::nullopt; }

    void connect_offered(Engine& engine, std::uint32_t, std::uint32_t peer, const Endpoint& theirs, bool,
                         const char* why) const override {
        connect_checked(theirs, "the peer",
                        [&](const DcPeerAddress& address) { engine.connect_dc_member(peer, address, why); });
    }

    PairStart begin(Engine& engine, std::uint32_t peer, const Endpoint& theirs, const char* why) const override {
        connect_checked(theirs, "the member",
                        [&](const DcPeerAddress& address) { engine.connect_dc_member(peer, address, why); });
        return PairStart{0, 0, true};
    }

    std::optional<std::string> record_mismatch(std::uint32_t qpn, std::uint32_t connected_to) const override {
        if (qpn == 0 && connected_to == 0) return std::nullopt;
        return "it names queue pair " + std::to_string(qpn != 0 ? qpn : connected_to) +
               ": a DC pair has no queue pair of its own, this process is in DC mode";
    }

    void answer(Engine&, std::uint32_t peer, const Endpoint&, std::uint32_t qpn, std::uint32_t) const override {
        throw Error("peer " + std::to_string(peer) + " answered with queue pair " + std::to_string(qpn) +
                    ": a DC pair has no queue pair of its own to answer with");
    }

    std::optional<RcEntry> replace(Engine& engine, std::uint32_t, std::uint32_t peer,
                                   const Endpoint& replacement) const override {
        connect_checked(replacement, "the replacement",
                        [&](const DcPeerAddress& address) { engine.replace_dc_peer(peer, address); });
        return std::nullopt;
    }

private:
    using DcPeerAddress = Engine::DcPeerAddress;

    // Checks `theirs` (named `who` in the error), then connects through `connect`.
    template <typename Connect>
    void connect_checked(const Endpoint& theirs, const std::string& who, Connect&& connect) const {
        if (const std::optional<std::string> why = mismatch(theirs)) throw Error(who + " " + *why);
        connect(dc_peer_of(theirs));
    }
};

}  // namespace

const PeerPairing& dc_pairing() {
    static const DcPairing pairing;
    return pairing;
}

}  // namespace rdmachan::detail
