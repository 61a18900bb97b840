// ibv_wr_opcode names as the golden vectors spell them, mapped to the project's opcodes.
#pragma once

#include <optional>
#include <string>

#include "transport/mlx5/work_request.hpp"

namespace rdmachan::golden {

// Nothing for opcodes the encoder does not post (memory windows, ...).
inline std::optional<mlx5::SendOpcode> send_opcode_from_name(const std::string& name) {
    if (name == "IBV_WR_RDMA_WRITE") return mlx5::SendOpcode::rdma_write;
    if (name == "IBV_WR_RDMA_WRITE_WITH_IMM") return mlx5::SendOpcode::rdma_write_with_immediate;
    if (name == "IBV_WR_SEND") return mlx5::SendOpcode::send;
    if (name == "IBV_WR_SEND_WITH_IMM") return mlx5::SendOpcode::send_with_immediate;
    if (name == "IBV_WR_SEND_WITH_INV") return mlx5::SendOpcode::send_with_invalidate;
    if (name == "IBV_WR_RDMA_READ") return mlx5::SendOpcode::rdma_read;
    if (name == "IBV_WR_ATOMIC_CMP_AND_SWP") return mlx5::SendOpcode::atomic_compare_and_swap;
    if (name == "IBV_WR_ATOMIC_FETCH_AND_ADD") return mlx5::SendOpcode::atomic_fetch_and_add;
    if (name == "IBV_WR_LOCAL_INV") return mlx5::SendOpcode::local_invalidate;
    return std::nullopt;
}

}  // namespace rdmachan::golden
