#pragma once
// What the demo writes into each slice, and the check of what arrived.

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>

namespace demo {

// The bytes rank `from` writes to rank `to` in an iteration: byte i is base + 13 i (mod 256).
// 13 is odd, so the sequence repeats every 256 bytes, and a slice is one block of kBlock bytes
// copied over and over: filling and checking run at memcpy and memcmp speed. (Computing each
// byte, even in a vectorised loop, took a third of the CPU time of a 400-iteration run: perf.)
class SlicePattern {
public:
    static constexpr std::uint64_t kPeriod = 256;
    static constexpr std::uint64_t kBlock = 4096;  // a multiple of the period

    SlicePattern(std::uint32_t from, std::uint32_t to, std::uint32_t iteration) {
        const auto base = static_cast<std::uint8_t>(from * 131 + to * 31 + iteration * 7 + 1);
        for (std::uint64_t index = 0; index < kPeriod; ++index) block_[index] = static_cast<std::uint8_t>(base + index * 13);
        for (std::uint64_t offset = kPeriod; offset < kBlock; offset += kPeriod)
            std::memcpy(block_.data() + offset, block_.data(), kPeriod);
    }

    void fill(std::uint8_t* out, std::uint64_t size) const {
        for (std::uint64_t offset = 0; offset < size; offset += kBlock)
            std::memcpy(out + offset, block_.data(), std::min(kBlock, size - offset));
    }

    // The first byte of `actual` that differs from the pattern, or size if none does.
    std::uint64_t first_difference(const std::uint8_t* actual, std::uint64_t size) const {
        for (std::uint64_t offset = 0; offset < size; offset += kBlock) {
            const std::uint64_t length = std::min(kBlock, size - offset);
            if (std::memcmp(actual + offset, block_.data(), length) == 0) continue;
            std::uint64_t index = 0;
            while (actual[offset + index] == block_[index]) ++index;
            return offset + index;
        }
        return size;
    }

private:
    std::array<std::uint8_t, kBlock> block_{};
};

}  // namespace demo
