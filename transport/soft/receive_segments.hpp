#pragma once
// The scatter list of a receive WQE, read as a ConnectX reads it: shared by the responder
// (responder.cpp, which checks each entry against this device's keys) and a zero-hop sender
// (zero_hop_receive.cpp, which checks it against the target's published table).

#include <cstdint>

#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::soft {

// Calls visit(lkey, addr, length) for each data segment (mlx5_wqe_data_seg) of the `entries` in
// `wqe`, in order: the list ends early at an entry whose key is MLX5_INVALID_LKEY, and entries of
// length 0 are skipped. A visit that returns false stops the walk, which then returns false.
template <class Visit>
bool for_each_receive_segment(const std::uint8_t* wqe, std::uint32_t entries, Visit&& visit) {
    for (std::uint32_t i = 0; i < entries; ++i) {
        const std::uint8_t* entry = wqe + i * mlx5::kDataSegmentSize;
        const std::uint32_t lkey = mlx5::load_big32(entry + 4);
        if (lkey == mlx5::kInvalidLkey) break;
        const std::uint32_t length = mlx5::load_big32(entry);
        if (length == 0) continue;
        if (!visit(lkey, mlx5::load_big64(entry + 8), length)) return false;
    }
    return true;
}

}  // namespace rdmachan::soft
