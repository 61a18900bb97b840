// The channel core's flight-recorder events (common/flight_recorder.hpp), recorded by the engine
// on the application's thread. The dump's names and field formats are in flight_events.cpp, in
// this order.
#pragma once

#include <cstdint>

#include "common/flight_recorder.hpp"

namespace rdmachan::flight {

enum class ChannelEvent : std::uint16_t {
    post_send =
        0x200,     // peer, qpn, ticket, requests, first request's opcode (numbers 0x200..0x2ff)
    post_receive,  // peer, qpn, ticket, length
    post_refused,  // peer, ticket, status, why (text)
    completion,    // qpn, ticket, status, syndrome, bytes
    deadline,      // peer, ticket, operation, deadline ms
    qp_error,      // peer, qpn, why (text)
    end            // not an event: one past the last
};

}  // namespace rdmachan::flight
