// The test suites' flight-recorder events as the dump prints them ("test.marker a=... b=...").
#include "tests/flight_test_events.hpp"

#include <iterator>

#include "common/flight_events.hpp"

namespace rdmachan::flight {
namespace {

using F = FieldFormat;

constexpr EventDescription kTestEvents[] = {
    {"marker", {{"a", F::decimal}, {"b", F::decimal}, {"what", F::text}}},
};
static_assert(std::size(kTestEvents) == static_cast<std::size_t>(TestEvent::end) -
                                            static_cast<std::size_t>(TestEvent::marker),
              "every test event has a description");

const EventRegistration test_events_registration{
    make_event_table("test", TestEvent::marker, kTestEvents)};

}  // namespace
}  // namespace rdmachan::flight
