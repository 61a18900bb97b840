// Page-aligned, zeroed memory for the software device's rings and doorbell records, from the
// device's shared arena when it has room (same-host peers then map it), else from the heap.
#pragma once

#include <cstddef>
#include <cstdint>

namespace rdmachan::soft {

class SharedArena;

struct AlignedBuffer {
    explicit AlignedBuffer(std::size_t size);  // from the heap
    // From the device's arena when it has room (same-host peers then map it: zero-hop receives
    // write into an RC QP's receive queue and its CQ, zero_hop_receive.cpp), else from the heap.
    AlignedBuffer(std::size_t size, SharedArena& arena);
    ~AlignedBuffer();
    AlignedBuffer(const AlignedBuffer&) = delete;
    AlignedBuffer& operator=(const AlignedBuffer&) = delete;
    std::uint8_t* data = nullptr;
    std::size_t size = 0;
    SharedArena* arena = nullptr;    // the arena it came from, or null
    std::uint64_t arena_offset = 0;  // its offset in that arena plus 1; 0: not in one
};

}  // namespace rdmachan::soft
