// The handshake's flight-recorder events (common/flight_recorder.hpp): the pairwise exchange, the
// rendezvous client and server. The dump's names and field formats are in flight_events.cpp, in
// this order.
#pragma once

#include <cstdint>

#include "common/flight_recorder.hpp"

namespace rdmachan::flight {

enum class HandshakeEvent : std::uint16_t {
    frame_sent = 0x300,  // bytes (the handshake's numbers: 0x300..0x3ff)
    frame_received,      // bytes
    state,               // what (text), rank, port
    end                  // not an event: one past the last
};

}  // namespace rdmachan::flight
