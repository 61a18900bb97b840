// How a MultiChannel pairs with its peers in the endpoint schema (rdmachan/endpoint.hpp): the
// set-up half of the engine's mode, beside its routing (src/peer_routing.hpp), and chosen with it
// when the engine is built (PeerRouting::pairing). RC pairs through a queue pair per pair, each
// side offering one and connecting to the other's (src/rc_pairing.cpp); DC through the peer's one
// target and initiators, the same for every reader (src/dc_pairing.cpp). The fixed world's
// handshake, peers added by the application, replacement and membership through etcd all pair
// through this; none of it is on the data path.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/endpoint.hpp"
#include "rdmachan/multi_channel.hpp"

namespace rdmachan::detail {

class Engine;

// A pair's first step on this side: what it offers the peer (RC: the queue pair it made for the
// pair, qpn 0 in DC), and whether it is connected already (DC: the peer's endpoint is all it needs).
struct PairStart {
    std::uint32_t qpn = 0;
    std::uint32_t psn = 0;
    bool connected = false;
};

class PeerPairing {
public:
    virtual ~PeerPairing() = default;
    virtual MultiChannelMode mode() const = 0;
    // Why `theirs` cannot pair with this mode (a DC endpoint met by RC, or one without DC
    // initiators met by DC); nothing when it can.
    virtual std::optional<std::string> mismatch(const Endpoint& theirs) const = 0;
    // This process's part of its own endpoint: RC the queue pair it made for each rank, DC its
    // target and initiators (one record per process).
    virtual void describe(const Engine& engine, Endpoint& own) const = 0;
    // The engine's view as one endpoint per peer (PreparedMultiChannel::endpoints): RC only.
    // Throws rdmachan::Error naming `call` in DC.
    virtual std::vector<ChannelEndpoint> per_peer_endpoints(const Engine& engine, const char* call) const = 0;
    // A fixed world: connects to every rank's endpoint in `table` (checked by the caller against
    // the schema, in rank order). Throws rdmachan::Error starting with `me` and naming the rank.
    virtual void connect_world(Engine& engine, std::uint32_t rank, const std::vector<Endpoint>& table,
                               const std::string& me) const = 0;
    // This process's own slot, connected to itself, its operations failing with `why` until
    // Engine::mark_ready: code that addresses every slot needs no special case.
    virtual void connect_own_slot(Engine& engine, std::uint32_t rank, const Endpoint& own, const char* why) const = 0;
    // Peers added by the application: what this side offers `peer` before it knows its endpoint
    // (RC: a fresh queue pair's entry; DC: nothing, its endpoint already says everything).
    virtual std::optional<RcEntry> offer(Engine& engine, std::uint32_t peer, const char* why) const = 0;
    // Connects `peer` to `theirs`, the endpoint it offered this rank. `offered`: whether this
    // side offered `peer` anything since it was last connected (RC needs that queue pair).
    virtual void connect_offered(Engine& engine, std::uint32_t rank, std::uint32_t peer, const Endpoint& theirs,
                                 bool offered, const char* why) const = 0;
    // Membership: a pair's first step, once `theirs` is known.
    virtual PairStart begin(Engine& engine, std::uint32_t peer, const Endpoint& theirs, const char* why) const = 0;
    // Membership: why a pair record naming queue pair `qpn` and, connected, this member's queue
    // pair `connected_to` cannot be this mode's (DC names none); nothing when it can.
    virtual std::optional<std::string> record_mismatch(std::uint32_t qpn, std::uint32_t connected_to) const = 0;
    // Membership: the peer answered with its queue pair `qpn` for this member (RC only: a DC
    // pair answers none, record_mismatch refuses such a record first).
    virtual void answer(Engine& engine, std::uint32_t peer, const Endpoint& theirs, std::uint32_t qpn,
                        std::uint32_t psn) const = 0;
    // The peer's process was replaced by `replacement`: what this rank now offers the
    // replacement (RC: its new queue pair for it), or nothing (DC).
    virtual std::optional<RcEntry> replace(Engine& engine, std::uint32_t rank, std::uint32_t peer,
                                           const Endpoint& replacement) const = 0;
};

const PeerPairing& rc_pairing();
const PeerPairing& dc_pairing();

}  // namespace rdmachan::detail
