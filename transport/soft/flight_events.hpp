// The software device's flight-recorder events (common/flight_recorder.hpp), recorded by its
// progress thread, and doorbells on the poster's thread. The dump's names and field formats are
// in flight_events.cpp, in this order.
#pragma once

#include <cstdint>

#include "common/flight_recorder.hpp"

namespace rdmachan::flight {

enum class SoftEvent : std::uint16_t {
    doorbell = 0x100,    // qpn (the software device's numbers: 0x100..0x1ff)
    wqe_executed,        // qpn, wqe, opcode, psn, length
    request_dropped,     // qpn, psn, expected psn, qp state, why (text)
    request_performed,   // qpn, psn, opcode, rkey, NAK syndrome (0: ACK)
    rnr_nak_sent,        // qpn, psn, source qpn, rnr timer
    response,            // qpn, psn, kind, syndrome, in flight
    response_ignored,    // qpn, psn, qp state, in flight, oldest psn in flight
    retransmit,          // qpn, from psn, requests, why (text), retries left
    completion,          // qpn, wqe, opcode (WQE's, or the CQE's on receive), syndrome, receive
    qp_state,            // qpn, from, to
    qp_error,            // qpn, why (text)
    connection_closed,   // lid, outgoing, why (text)
    connections_holder,  // attached (1: the progress thread watches them), why (text)
    end                  // not an event: one past the last
};

}  // namespace rdmachan::flight
