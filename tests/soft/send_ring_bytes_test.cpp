// How the software device reads a WQE out of its send queue ring: the ring is read as the NIC
// fetches it, so a WQE that runs past the ring's end continues at its start.
#include <doctest/doctest.h>

#include <cstdint>
#include <vector>

#include "transport/soft/send_ring_bytes.hpp"

namespace {

using rdmachan::mlx5::kSendWqeBasicBlockSize;

// Byte i of the ring, read at ring offset `offset + i`, taken modulo the ring's size.
std::vector<std::uint8_t> expected_bytes(const std::vector<std::uint8_t>& ring, std::size_t offset, std::size_t length) {
    std::vector<std::uint8_t> bytes(length);
    for (std::size_t i = 0; i < length; ++i) bytes[i] = ring[(offset + i) % ring.size()];
    return bytes;
}

}  // namespace

TEST_CASE("a send ring's bytes are read in order, past the ring's end from its start, for every offset and length") {
    for (std::uint32_t wqe_count : {1u, 2u, 4u}) {
        std::vector<std::uint8_t> ring(std::size_t{wqe_count} * kSendWqeBasicBlockSize);
        for (std::size_t i = 0; i < ring.size(); ++i) ring[i] = static_cast<std::uint8_t>(i * 7 + 3);
        rdmachan::mlx5::SendQueueRing send_ring;
        send_ring.buffer = ring.data();
        send_ring.wqe_count = wqe_count;
        // Offsets beyond the ring (a WQE index past the first pass) and lengths beyond it (a
        // malformed segment count that reads the ring again) included.
        for (std::size_t offset = 0; offset < 3 * ring.size(); offset += 5) {
            for (std::size_t length = 0; length <= 3 * ring.size(); length += 3) {
                std::vector<std::uint8_t> read(length + 1, 0xee);
                rdmachan::soft::copy_from_send_ring(send_ring, offset, read.data(), length);
                CAPTURE(wqe_count);
                CAPTURE(offset);
                CAPTURE(length);
                REQUIRE(std::vector<std::uint8_t>(read.begin(), read.begin() + static_cast<std::ptrdiff_t>(length)) ==
                        expected_bytes(ring, offset, length));
                REQUIRE(read[length] == 0xee);  // nothing written past the destination's length
            }
        }
    }
}
