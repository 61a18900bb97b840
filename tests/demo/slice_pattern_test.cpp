// The demo's slice pattern: what it writes is byte i = base + 13 i (mod 256) for every length,
// nothing past the slice, and its check finds the first wrong byte wherever it is.
#include "examples/demo/slice_pattern.hpp"

#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

namespace {

// The formula, computed byte by byte, independently of the block the pattern copies.
std::uint8_t expected_byte(std::uint32_t from, std::uint32_t to, std::uint32_t iteration, std::uint64_t index) {
    return static_cast<std::uint8_t>(from * 131 + to * 31 + iteration * 7 + 1 + index * 13);
}

constexpr std::uint64_t kSizes[] = {1, 255, 256, 4095, 4096, 4097, 65536, 65536 + 17, 1 << 20};

}  // namespace

TEST_CASE("fill writes the formula's bytes for every length, and nothing past the slice") {
    const demo::SlicePattern pattern(2, 5, 9);
    for (const std::uint64_t size : kSizes) {
        CAPTURE(size);
        std::vector<std::uint8_t> buffer(size + 64, 0xa5);
        pattern.fill(buffer.data(), size);
        std::uint64_t wrong = 0;
        for (std::uint64_t index = 0; index < size; ++index) wrong += buffer[index] != expected_byte(2, 5, 9, index);
        CHECK(wrong == 0);
        std::uint64_t touched = 0;
        for (std::uint64_t index = size; index < buffer.size(); ++index) touched += buffer[index] != 0xa5;
        CHECK(touched == 0);
        CHECK(pattern.first_difference(buffer.data(), size) == size);
    }
}

TEST_CASE("first_difference names the first wrong byte, in any block and at the edges") {
    const demo::SlicePattern pattern(0, 3, 1);
    const std::uint64_t size = 65536 + 17;
    std::vector<std::uint8_t> buffer(size);
    for (const std::uint64_t corrupted : {std::uint64_t{0}, std::uint64_t{4095}, std::uint64_t{4096}, std::uint64_t{40000},
                                          size - 17, size - 1}) {
        CAPTURE(corrupted);
        pattern.fill(buffer.data(), size);
        buffer[corrupted] ^= 0x01;
        CHECK(pattern.first_difference(buffer.data(), size) == corrupted);
        // A second wrong byte further on does not hide the first.
        if (corrupted + 5000 < size) {
            buffer[corrupted + 5000] ^= 0x80;
            CHECK(pattern.first_difference(buffer.data(), size) == corrupted);
        }
    }
}

TEST_CASE("a slice from another rank, for another rank or of another iteration fails the check") {
    const std::uint64_t size = 65536;
    std::vector<std::uint8_t> buffer(size);
    demo::SlicePattern(1, 2, 3).fill(buffer.data(), size);
    CHECK(demo::SlicePattern(1, 2, 3).first_difference(buffer.data(), size) == size);
    CHECK(demo::SlicePattern(0, 2, 3).first_difference(buffer.data(), size) == 0);
    CHECK(demo::SlicePattern(1, 0, 3).first_difference(buffer.data(), size) == 0);
    CHECK(demo::SlicePattern(1, 2, 4).first_difference(buffer.data(), size) == 0);
}
