// What the engine needs of a peer's endpoint (endpoint.hpp's versioned schema): its DC target
// and initiators, or the address of one of its queue pairs. One conversion for the handshake,
// peer replacement and membership.
#pragma once

#include <cstdint>

#include "rdmachan/endpoint.hpp"
#include "src/engine.hpp"

namespace rdmachan::detail {

// The endpoint must have a DC target (callers check: the error names their context).
inline Engine::DcPeerAddress dc_peer_of(const Endpoint& endpoint) {
    Engine::DcPeerAddress peer;
    peer.gid = endpoint.port.gid;
    peer.lid = endpoint.port.lid;
    peer.dctn = endpoint.dc.front().dctn;
    peer.key = endpoint.dc.front().dc_key;
    peer.initiators = endpoint.dci;
    peer.device = to_string(endpoint.device);
    return peer;
}

// The endpoint's queue pair `qpn` (starting at `psn`), on its port.
inline ChannelEndpoint rc_peer_of(const Endpoint& endpoint, std::uint32_t qpn, std::uint32_t psn) {
    ChannelEndpoint peer;
    peer.gid = endpoint.port.gid;
    peer.lid = endpoint.port.lid;
    peer.qpn = qpn;
    peer.psn = psn;
    peer.mtu = endpoint.port.mtu;
    peer.device = to_string(endpoint.device);
    return peer;
}

}  // namespace rdmachan::detail
