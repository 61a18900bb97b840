// Comparing GIDs on the data path.
#pragma once

#include <array>
#include <cstdint>
#include <cstring>

namespace rdmachan::soft {

using Gid = std::array<std::uint8_t, 16>;

// As two 64-bit words: GCC 12 compiles std::array<std::uint8_t, 16>'s == into a call to memcmp,
// and a zero-hop write compared GIDs five times on its way to the peer's memory.
inline bool same_gid(const Gid& left, const Gid& right) {
    std::uint64_t left_words[2];
    std::uint64_t right_words[2];
    std::memcpy(left_words, left.data(), sizeof left_words);
    std::memcpy(right_words, right.data(), sizeof right_words);
    return ((left_words[0] ^ right_words[0]) | (left_words[1] ^ right_words[1])) == 0;
}

}  // namespace rdmachan::soft
