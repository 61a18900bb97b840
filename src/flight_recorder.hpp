// The flight recorder's inside (issue 20): one ring per process of the last kCapacity events of
// the software device, the channel core and the handshake, fixed-size records, always on. A rare
// failure that leaves no trace cannot be found, and logging changes the timing enough to hide
// it; recording an event costs a few stores. The public side (dump) is
// include/rdmachan/flight_recorder.hpp.
//
// record() is called on the data path: it never allocates, locks or throws. dump_automatically()
// runs on an error path of the data path (an error completion, a passed deadline): it neither
// allocates, locks nor throws either (a stack buffer and write(2)).
#pragma once

#include <cstdint>

namespace rdmachan::flight {

// What happened; each event's fields are named in flight_recorder_events.cpp, which the dump
// prints. Text fields hold a pointer to a string literal (static storage), never a copy.
enum class Event : std::uint16_t {
    none = 0,
    // The software device (its progress thread; doorbells on the poster's thread).
    soft_doorbell,           // qpn
    soft_wqe_executed,       // qpn, wqe, opcode, psn, length
    soft_request_dropped,    // qpn, psn, expected psn, qp state, why (text)
    soft_request_performed,  // qpn, psn, opcode, length, NAK syndrome (0: ACK)
    soft_rnr_nak_sent,       // qpn, psn, source qpn, rnr timer
    soft_response,           // qpn, psn, kind, syndrome, in flight
    soft_response_ignored,   // qpn, psn, qp state, in flight, oldest psn in flight
    soft_retransmit,         // qpn, from psn, requests, why (text), retries left
    soft_completion,         // qpn, wqe, opcode (WQE's, or the CQE's on receive), syndrome, receive
    soft_qp_state,           // qpn, from, to
    soft_qp_error,           // qpn, why (text)
    soft_connection_closed,  // lid, outgoing, why (text)
    // The channel core (the engine, on the application's thread).
    channel_post_send,       // peer, qpn, ticket, requests, first opcode
    channel_post_receive,    // peer, qpn, ticket, length
    channel_post_refused,    // peer, ticket, status, why (text)
    channel_completion,      // qpn, ticket, status, syndrome, bytes
    channel_deadline,        // peer, ticket, operation, deadline ms
    channel_qp_error,        // peer, qpn, why (text)
    // The handshake (pairwise exchange, rendezvous client and server).
    handshake_frame_sent,      // bytes
    handshake_frame_received,  // bytes
    handshake_state,           // what (text), rank, port
    // Tests and tools.
    test_marker,  // a, b, what (text)
    count
};

inline constexpr std::uint32_t kCapacity = 4096;  // a power of two

// Records one event. Lock-free (one atomic increment claims a slot), never allocates, never
// throws; a no-op when RDMACHAN_FLIGHT_RECORDER=off.
void record(Event event, std::uint64_t a = 0, std::uint64_t b = 0, std::uint64_t c = 0, std::uint64_t d = 0,
            std::uint64_t e = 0) noexcept;

// A text field: the pointer of a string literal (or other static storage).
inline std::uint64_t text(const char* literal) noexcept { return reinterpret_cast<std::uint64_t>(literal); }

// Writes the ring into a new file of the flight-record directory and says so on stderr, for an
// error completion or a passed deadline; at most RDMACHAN_FLIGHT_RECORD_DUMPS times per process
// (default 4, 0 = never), so a test that fails on purpose a thousand times writes four files.
// `reason` is copied before anything else happens. No allocation, lock or exception.
void dump_automatically(const char* reason) noexcept;

// Writes the ring to `descriptor` under a header naming `reason`. No allocation, lock or
// exception; events recorded meanwhile may appear or not.
void dump_to_descriptor(int descriptor, const char* reason) noexcept;

// Writes the ring into a new file of the flight-record directory; `path` (size `path_size`)
// receives its name. Returns false (and `path` says why) when it could not be written.
bool dump_to_new_file(const char* reason, char* path, std::uint32_t path_size) noexcept;

// How many events were recorded since the process started (the ring keeps the last kCapacity).
std::uint64_t recorded() noexcept;

}  // namespace rdmachan::flight
