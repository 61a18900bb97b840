// Indirect memory keys of the software device (what mlx5dv_create_mkey makes on a ConnectX): a
// key with no memory of its own until a UMR WQE on a send queue gives it a layout, a list of
// pieces of registered regions or an interleaved pattern repeated, seen as one zero-based
// range. LOCAL_INV frees it again. The state lives in MemoryTranslation (memory_translation.hpp),
// which translates through it; a UMR WQE's effect on it is decoded in indirect_keys.cpp.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace rdmachan::soft {

// Host memory pieces an access resolves to, in order.
using MemorySegments = std::vector<std::pair<std::uint8_t*, std::uint32_t>>;

// One piece of a layout: byte_count bytes of the region named by `key` at `addr`; in an
// interleaved layout, repeated every `stride` bytes.
struct IndirectEntry {
    std::uint32_t key = 0;
    std::uint64_t addr = 0;
    std::uint32_t byte_count = 0;
    std::uint32_t stride = 0;
};

struct IndirectKeyState {
    std::uint32_t protection_domain = 0;
    std::uint32_t max_entries = 0;  // what the key was created for (translations it holds)
    bool configured = false;        // false: free (just created, or invalidated)
    std::uint8_t access = 0;        // mkey context access bits (mlx5::kMemoryKey*)
    std::uint64_t length = 0;
    bool interleaved = false;
    std::uint32_t repeat_count = 0;
    std::uint32_t pattern_bytes = 0;  // interleaved: the bytes of one repetition
    std::vector<IndirectEntry> entries;
};

}  // namespace rdmachan::soft
