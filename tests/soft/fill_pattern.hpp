// Test helper: bytes that differ with a seed and along the buffer, so a misplaced, missing or
// stale piece shows in a comparison.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmachan::test {

inline void fill_pattern(std::uint8_t* bytes, std::size_t length, std::uint8_t seed) {
    for (std::size_t i = 0; i < length; ++i) bytes[i] = static_cast<std::uint8_t>(seed + i * 7);
}

}  // namespace rdmachan::test
