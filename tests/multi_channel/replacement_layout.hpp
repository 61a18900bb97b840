// The buffer every process of a peer-replacement test holds, and the bytes it must hold after the
// replacement's exchange: shared by the TCP rendezvous test (peer_replacement_test.cpp) and the
// PMIx one (tests/pmix/pmix_replacement_program.cpp), which check the same thing.
//
// Round 1 is written by the job's first processes, round 2 by the survivors and the replacement
// (generation 1 for a survivor, 2 and up for the replacements), so a byte from the wrong process
// or the wrong round is caught.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmachan::replacement_test {

inline constexpr std::uint32_t kSlice = 4096;

inline std::uint8_t pattern(std::uint32_t from, std::uint32_t generation, std::uint32_t round, std::size_t index) {
    return static_cast<std::uint8_t>(from * 29 + generation * 101 + round * 53 + index * 7 + 1);
}

// [round 1 out][round 2 out][round 1 in: world slices][round 2 in: world slices]
// [messages in: world x 8][message out 8], then whatever a test adds from end().
struct Layout {
    std::uint32_t world;
    std::size_t out(std::uint32_t round) const { return static_cast<std::size_t>(round - 1) * kSlice; }
    std::size_t in(std::uint32_t round, std::uint32_t peer) const {
        return static_cast<std::size_t>(2 + (round - 1) * world + peer) * kSlice;
    }
    std::size_t message(std::uint32_t peer) const { return static_cast<std::size_t>(2 + 2 * world) * kSlice + peer * 8; }
    std::size_t message_out() const { return message(world); }
    std::size_t end() const { return message(world + 1); }

    // Byte `index` (below end()) of `rank`'s buffer once round 2 and its messages are done:
    // what the rank wrote itself, round 1 from the first processes (nothing on a replacement,
    // whose buffer is new), round 2 and the messages (rank + 1, generation) from the current
    // ones. `generation`: this process's; `victim_generation`: that of the victim's rank's.
    std::uint8_t expected(std::size_t index, std::uint32_t rank, std::uint32_t generation, std::uint32_t victim,
                          std::uint32_t victim_generation) const {
        const std::size_t offset = index % kSlice;
        if (index < out(2)) return generation == 1 ? pattern(rank, 1, 1, offset) : 0;
        if (index < in(1, 0)) return pattern(rank, generation, 2, offset);
        if (index < in(2, 0)) {
            const auto from = static_cast<std::uint32_t>((index - in(1, 0)) / kSlice);
            return generation == 1 && from != rank ? pattern(from, 1, 1, offset) : 0;
        }
        if (index < message(0)) {
            const auto from = static_cast<std::uint32_t>((index - in(2, 0)) / kSlice);
            return from != rank ? pattern(from, from == victim ? victim_generation : 1, 2, offset) : 0;
        }
        if (index < message_out()) {
            const auto from = static_cast<std::uint32_t>((index - message(0)) / 8);
            const std::size_t within = (index - message(0)) % 8;
            if (from == rank) return 0;
            if (within == 0) return static_cast<std::uint8_t>(from + 1);
            if (within == 1) return static_cast<std::uint8_t>(from == victim ? victim_generation : 1);
            return 0;
        }
        const std::size_t within = index - message_out();
        if (within == 0) return static_cast<std::uint8_t>(rank + 1);
        if (within == 1) return static_cast<std::uint8_t>(generation);
        return 0;
    }
};

}  // namespace rdmachan::replacement_test
