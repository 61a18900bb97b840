// The handshake's flight-recorder events as the dump prints them, in HandshakeEvent's order.
#include "handshake/flight_events.hpp"

#include <iterator>

#include "common/flight_events.hpp"

namespace rdmachan::flight {
namespace {

using F = FieldFormat;

constexpr EventDescription kHandshakeEvents[] = {
    {"frame_sent", {{"bytes", F::decimal}}},
    {"frame_received", {{"bytes", F::decimal}}},
    {"state", {{"what", F::text}, {"rank", F::decimal}, {"port", F::decimal}}},
};
static_assert(std::size(kHandshakeEvents) ==
                  static_cast<std::size_t>(HandshakeEvent::end) -
                      static_cast<std::size_t>(HandshakeEvent::frame_sent),
              "every handshake event has a description");

const EventRegistration handshake_events_registration{
    make_event_table("handshake", HandshakeEvent::frame_sent, kHandshakeEvents)};

}  // namespace
}  // namespace rdmachan::flight
