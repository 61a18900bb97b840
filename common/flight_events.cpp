// The registry of the layers' event tables (see flight_events.hpp). Registrations run at static
// initialisation; a dump may run on any thread at any time after, so tables are published through
// atomic pointers and the dump neither locks nor allocates.
#include "common/flight_events.hpp"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>

namespace rdmachan::flight {
namespace {

// The library's layers and a test suite's own events fit with room to spare.
constexpr std::size_t kMaxTables = 16;

constinit std::atomic<const EventTable*> tables[kMaxTables] = {};
constinit std::atomic<std::size_t> tables_claimed{0};

[[noreturn]] void refuse(const char* what, const EventTable& table,
                         const EventTable* other) noexcept {
    char line[256];
    const int length = std::snprintf(
        line, sizeof line, "rdmachan: flight-recorder events of \"%s\" (%u..%u) %s%s%s\n",
        table.layer, static_cast<unsigned>(table.first),
        static_cast<unsigned>(table.first + table.count - 1), what,
        other != nullptr ? other->layer : "", other != nullptr ? "\"" : "");
    if (length > 0) {
        const ssize_t written = ::write(
            STDERR_FILENO, line, std::min(static_cast<std::size_t>(length), sizeof line - 1));
        static_cast<void>(written);  // about to abort: nothing to do if stderr is gone
    }
    std::abort();
}

bool overlap(const EventTable& one, const EventTable& other) noexcept {
    return one.first < other.first + other.count && other.first < one.first + one.count;
}

}  // namespace

EventRegistration::EventRegistration(const EventTable& table) noexcept : table_(table) {
    if (table_.first == 0 || table_.first + table_.count > 0x10000)
        refuse("use numbers outside 1..65535", table_, nullptr);
    const std::size_t slot = tables_claimed.fetch_add(1, std::memory_order_relaxed);
    if (slot >= kMaxTables) refuse("do not fit: the registry is full", table_, nullptr);
    for (std::size_t index = 0; index < slot; ++index) {
        const EventTable* other = tables[index].load(std::memory_order_acquire);
        if (other != nullptr && overlap(table_, *other))
            refuse("overlap those of \"", table_, other);
    }
    tables[slot].store(&table_, std::memory_order_release);
}

DescribedEvent describe(std::uint16_t event) noexcept {
    const std::size_t claimed =
        std::min(tables_claimed.load(std::memory_order_acquire), kMaxTables);
    for (std::size_t index = 0; index < claimed; ++index) {
        const EventTable* table = tables[index].load(std::memory_order_acquire);
        if (table != nullptr && event >= table->first && event - table->first < table->count) {
            return {table->layer, &table->events[event - table->first]};
        }
    }
    return {};
}

}  // namespace rdmachan::flight
