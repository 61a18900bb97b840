// ConnectionInput (transport/soft/connection_input.hpp): a stream of frames of random sizes,
// delivered in reads of random sizes the way recv delivers a socket's bytes, comes out whole and
// in order, whatever is moved to the front or into a larger buffer in between.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "transport/soft/connection_input.hpp"

using rdmachan::soft::ConnectionInput;

namespace {

// A frame here: a 4-byte length, then that many bytes, each (frame number + offset) mod 251.
// Every frame's bytes are a window of one repeating pattern, so the stream is built and checked
// with block copies and compares: byte-at-a-time loops over the ~100 MB made this the slowest
// test of the sanitizer builds.
std::vector<std::uint8_t> make_pattern(std::uint32_t largest) {
    std::vector<std::uint8_t> pattern(largest + 251);
    for (std::size_t index = 0; index < pattern.size(); ++index) pattern[index] = static_cast<std::uint8_t>(index % 251);
    return pattern;
}

const std::uint8_t* frame_bytes(const std::vector<std::uint8_t>& pattern, std::uint32_t frame) { return pattern.data() + frame % 251; }

std::vector<std::uint8_t> make_stream(std::mt19937& random, const std::vector<std::uint8_t>& pattern, std::uint32_t frames,
                                      std::uint32_t largest) {
    std::vector<std::uint8_t> stream;
    std::uniform_int_distribution<std::uint32_t> size(0, largest);
    for (std::uint32_t frame = 0; frame < frames; ++frame) {
        const std::uint32_t length = frame % 7 == 0 ? largest : size(random);
        const auto* length_bytes = reinterpret_cast<const std::uint8_t*>(&length);
        stream.insert(stream.end(), length_bytes, length_bytes + 4);
        stream.insert(stream.end(), frame_bytes(pattern, frame), frame_bytes(pattern, frame) + length);
    }
    return stream;
}

}  // namespace

TEST_CASE("connection input: frames of any size come out whole and in order from reads of any size") {
    std::mt19937 random(20261127);
    for (const std::uint32_t largest : {100u, 70'000u, 600'000u}) {
        CAPTURE(largest);
        const std::vector<std::uint8_t> pattern = make_pattern(largest);
        const std::vector<std::uint8_t> stream = make_stream(random, pattern, 300, largest);
        ConnectionInput input;
        std::size_t delivered = 0;
        std::uint32_t frame = 0;
        std::uniform_int_distribution<std::size_t> read_size(1, 200'000);
        bool intact = true;
        while (delivered < stream.size()) {
            // As read_connection asks: room for the rest of a frame begun, and 4 KiB at least.
            std::size_t wanted = 4 << 10;
            if (input.unread_size() >= 4) {
                std::uint32_t length;
                std::memcpy(&length, input.unread(), 4);
                if (4 + length > input.unread_size()) wanted = std::max(wanted, 4 + length - input.unread_size());
            }
            std::uint8_t* into = input.room(wanted);
            REQUIRE(input.room_size() >= wanted);
            const std::size_t count = std::min({read_size(random), input.room_size(), stream.size() - delivered});
            std::memcpy(into, stream.data() + delivered, count);
            input.commit(count);
            delivered += count;
            while (input.unread_size() >= 4) {
                std::uint32_t length;
                std::memcpy(&length, input.unread(), 4);
                if (input.unread_size() < 4 + length) break;
                intact = intact && std::memcmp(input.unread() + 4, frame_bytes(pattern, frame), length) == 0;
                input.consume(4 + length);
                ++frame;
            }
        }
        CHECK(intact);
        CHECK(frame == 300);
        CHECK(input.unread_size() == 0);
    }
}

TEST_CASE("connection input: a partial frame is kept when the buffer moves it or grows") {
    ConnectionInput input;
    std::uint8_t* first = input.room(16);
    std::memset(first, 1, ConnectionInput::kInitialCapacity);
    input.commit(ConnectionInput::kInitialCapacity);
    input.consume(ConnectionInput::kInitialCapacity - 10);  // ten bytes of a frame begun remain
    std::uint8_t* moved = input.room(1000);  // no room at the end: the ten bytes go to the front
    CHECK(moved == input.unread() + 10);
    CHECK(input.unread_size() == 10);
    CHECK(input.unread()[0] == 1);
    CHECK(input.unread()[9] == 1);
    input.room(4 * ConnectionInput::kInitialCapacity);  // more than the buffer holds: it grows
    CHECK(input.room_size() >= 4 * ConnectionInput::kInitialCapacity);
    CHECK(input.unread_size() == 10);
    CHECK(input.unread()[0] == 1);
    CHECK(input.unread()[9] == 1);
    input.consume(10);
    CHECK(input.unread_size() == 0);
}
