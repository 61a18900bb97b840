// How the flight recorder's dump names events it does not know: each layer owns a range of event
// numbers (its enum, beside its code) and registers a table of their names and fields when the
// library is loaded. The dump prints "layer.event field=value ...".
//
//   constexpr EventDescription kSoftEvents[] = {{"doorbell", {{"qpn", F::hex}}}, ...};
//   const EventRegistration registration{make_event_table("soft", SoftEvent::doorbell,
//   kSoftEvents)};
//
// Registration happens at static initialisation, never on the data path; the registry is
// constant-initialised, so a table registered by any object of the library is there before the
// first event can be dumped. Ranges that overlap are a programming error, found at load time.
#pragma once

#include <cstddef>
#include <cstdint>

#include "common/flight_recorder.hpp"

namespace rdmachan::flight {

// Names a field's value (a QP state, a completion status): the layer that records it knows them.
using ValueNamer = const char* (*)(std::uint64_t value) noexcept;

enum class FieldFormat : std::uint8_t { none, decimal, hex, text, named };

struct FieldDescription {
    const char* name = "";
    FieldFormat format = FieldFormat::none;  // a field left `none` is not printed
    ValueNamer namer = nullptr;              // for FieldFormat::named
};

struct EventDescription {
    const char* name = "unknown";
    FieldDescription fields[5];
};

// One layer's events: numbers first .. first + count - 1, described in order.
struct EventTable {
    const char* layer = "";
    std::uint16_t first = 0;
    std::uint16_t count = 0;
    const EventDescription* events = nullptr;
};

template <EventEnum LayerEvent, std::size_t count>
constexpr EventTable make_event_table(const char* layer, LayerEvent first,
                                      const EventDescription (&events)[count]) {
    static_assert(count > 0 && count <= 0xffff, "a layer's event table");
    return {layer, static_cast<std::uint16_t>(first), static_cast<std::uint16_t>(count), events};
}

// Registers `table` with the dump; an object of static storage, so the table lives as long as
// the library. Writes a line naming both layers to stderr and aborts when its numbers overlap a
// table registered before, or when more layers register than the registry holds.
class EventRegistration {
  public:
    explicit EventRegistration(const EventTable& table) noexcept;
    EventRegistration(const EventRegistration&) = delete;
    EventRegistration& operator=(const EventRegistration&) = delete;

  private:
    EventTable table_;
};

// For the dump: the layer and description of `event`, or null for an event no layer registered
// (a record from a newer build). No allocation, lock or exception.
struct DescribedEvent {
    const char* layer = nullptr;
    const EventDescription* event = nullptr;
};
DescribedEvent describe(std::uint16_t event) noexcept;

}  // namespace rdmachan::flight
