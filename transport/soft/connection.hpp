// One TCP connection between two software devices, as the device's links (peer_links.hpp) and
// the layers above them (the hello, the requester, the responder, zero-hop) see it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "transport/soft/connection_input.hpp"
#include "transport/soft/peer_table.hpp"
#include "transport/soft/same_host.hpp"
#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

struct Connection {
    int socket = -1;
    std::array<std::uint8_t, 16> gid{};
    std::uint16_t lid = 0;
    bool identified = false;  // hello received (incoming) or sent (outgoing)
    bool outgoing = false;
    // Outgoing, opened in the background (open_path_soon): connect() has not completed yet. What
    // is queued meanwhile (the hello, perhaps requests) waits in `output` until it has.
    bool connecting = false;
    // Outgoing: the hello is sent and its reply not yet in. Requests are not held for it (that
    // would add a round trip to every first request): until it comes they carry their payloads.
    bool awaiting_reply = false;
    // Same-host path agreed for this connection (outgoing: the peer moves our payloads with
    // cross-memory attach; incoming: we may, into and out of process `peer_process`).
    bool by_reference = false;
    // Same host: the peer process, held by a pidfd (same_host.hpp); moves by pid go through it.
    PeerProcess peer_process;
    bool move_failure_logged = false;  // a dying peer fails every queued move: said once
    // Outgoing, same host: the peer's published table, mapped (zero-hop writes); else null.
    std::unique_ptr<PeerTable> peer_table;
    bool zero_hop_failure_logged = false;
    ConnectionInput input;
    // Incoming: the caller's hello said it completes the writes an ACK covers (wire.hpp); only
    // then are the ACKs of its writes coalesced, so a device of an earlier version still gets one
    // per request.
    bool accepts_coalesced_acknowledgements = false;
    // An acknowledgement held for coalescing (respond_coalescing), not yet sent.
    bool holds_acknowledgement = false;
    wire::Response held_acknowledgement{};
    std::vector<std::uint8_t> output;
    std::size_t output_offset = 0;
    bool write_interest = false;  // EPOLLOUT asked for: output is waiting for the socket
};

}  // namespace rdmachan::soft
