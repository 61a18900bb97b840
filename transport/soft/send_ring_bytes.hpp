// Reading a WQE's bytes out of a send queue ring, as the NIC's fetch does: a WQE may run past the
// ring's end and continue at its start.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::soft {

// The ring's size is a power of two (SendQueueRing::wqe_count is), so the offset is masked, not
// divided, and the bytes go in at most one copy per pass of the ring: a division per byte made
// decoding an 8-byte inline write cost about 600 cycles on the doorbell thread. A length beyond
// the ring (a malformed segment count) reads the ring again, as the byte-wise loop did.
inline void copy_from_send_ring(const mlx5::SendQueueRing& ring, std::size_t offset, void* destination, std::size_t length) {
    const std::size_t ring_bytes = static_cast<std::size_t>(ring.wqe_count) * mlx5::kSendWqeBasicBlockSize;
    auto* out = static_cast<std::uint8_t*>(destination);
    offset &= ring_bytes - 1;
    while (length != 0) {
        const std::size_t chunk = std::min(length, ring_bytes - offset);
        std::memcpy(out, ring.buffer + offset, chunk);
        out += chunk;
        length -= chunk;
        offset = 0;
    }
}

}  // namespace rdmachan::soft
