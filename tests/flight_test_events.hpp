// The test suites' own flight-recorder event, registered by tests/flight_test_events.cpp (linked
// into every suite that uses the library, with the flight-record listener).
#pragma once

#include <cstdint>

#include "common/flight_recorder.hpp"

namespace rdmachan::flight {

enum class TestEvent : std::uint16_t {
    marker = 0x7f00,  // a, b, what (text) (the tests' numbers: 0x7f00..0x7fff)
    end               // not an event: one past the last
};

}  // namespace rdmachan::flight
