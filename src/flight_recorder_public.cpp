// The public side of the flight recorder (rdmachan/flight_recorder.hpp); the ring and its dump
// are common/flight_recorder.hpp.
#include <string>

#include "common/flight_recorder.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/flight_recorder.hpp"

namespace rdmachan::flight_recorder {

std::string dump(std::string_view reason) {
    const std::string copied(reason);
    char path[640];
    if (!flight::dump_to_new_file(copied.c_str(), path, sizeof path))
        throw Error(std::string("flight_recorder::dump: ") + path);
    return path;
}

void dump_to(int descriptor, std::string_view reason) {
    const std::string copied(reason);
    flight::dump_to_descriptor(descriptor, copied.c_str());
}

std::uint64_t events_recorded() noexcept {
    return flight::recorded();
}

std::uint32_t capacity() noexcept {
    return flight::kCapacity;
}

}  // namespace rdmachan::flight_recorder
