// Compiles the header-only mlx5 data path as CUDA device code: a kernel that builds big-endian
// fields and orders them as a GPU-side poster would.
#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/completion.hpp"
#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/mlx5/work_request.hpp"

namespace mlx5 = rdmachan::mlx5;

__global__ void retire_from_device(mlx5::SendQueueTracking* tracking, std::uint32_t wqe_count,
                                   std::uint16_t wqe_counter, std::uint64_t* wr_id_out) {
    *wr_id_out = mlx5::retire_send(*tracking, wqe_count, wqe_counter);
}

__global__ void store_fields_from_device(std::uint8_t* wqe, std::uint32_t* doorbell_record) {
    mlx5::store_big32(wqe + mlx5::kCtrlOpmodIndexOpcode, mlx5::kOpcodeRdmaWrite);
    mlx5::to_device_barrier();
    mlx5::store_release32(doorbell_record + mlx5::kSendDoorbell, mlx5::host_to_big32(1));
}
