#pragma once

#include <cstdint>
#include <string>
#include <string_view>

// The flight recorder: each process keeps the last few thousand events of the
// software device (doorbells, WQEs executed, requests received, dropped and performed, RNR NAKs,
// retransmissions, completions with their status, QP state changes), the channel core (posts,
// completions, refusals, deadlines, QPs moved to ERR) and the handshake (frames, state changes)
// in a ring of fixed-size records in memory. It is always on (RDMACHAN_FLIGHT_RECORDER=off turns
// it off) and costs a few stores per event.
//
// The library writes the ring out by itself on an error completion and on a passed deadline, at
// most RDMACHAN_FLIGHT_RECORD_DUMPS times per process (default 4; 0 = never), into a new file of
// $RDMACHAN_FLIGHT_RECORD_DIR (else $TMPDIR, else /tmp) whose name it prints on stderr. One
// line per event: sequence number, CLOCK_MONOTONIC time in seconds (so the records of several
// processes merge by time), Linux thread id, event name, named fields.
namespace rdmachan::flight_recorder {

// Writes the ring into a new file of the flight-record directory and returns its path; throws
// rdmachan::Error naming the file or directory when it cannot be written.
std::string dump(std::string_view reason);

// Writes the ring to an open file descriptor.
void dump_to(int descriptor, std::string_view reason);

// Events recorded since the process started; the ring keeps the last capacity() of them.
std::uint64_t events_recorded() noexcept;
std::uint32_t capacity() noexcept;

}  // namespace rdmachan::flight_recorder
