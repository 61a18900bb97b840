// Ring descriptors: everything the data path needs to know about a queue, and nothing else.
// On a ConnectX they come from mlx5dv_init_obj (mlx5dv_qp, mlx5dv_cq, mlx5dv_srq); the
// software device allocates the same layouts in plain memory. The data path never learns
// which one it is driving.
#pragma once

#include <cstdint>

#include "transport/mlx5/host_device.hpp"

namespace rdmachan::mlx5 {

struct SendQueueRing {
    std::uint8_t* buffer = nullptr;        // mlx5dv_qp.sq.buf
    std::uint32_t wqe_count = 0;           // WQEBBs (64 B each), a power of two
    std::uint32_t qpn = 0;
    std::uint32_t* doorbell_record = nullptr;  // mlx5dv_qp.dbrec: [0] receive, [1] send
    std::uint8_t* blueflame_register = nullptr;  // mlx5dv_qp.bf.reg
    std::uint32_t blueflame_size = 0;            // mlx5dv_qp.bf.size; 0 = 8-byte doorbells only
};

struct ReceiveQueueRing {
    std::uint8_t* buffer = nullptr;        // mlx5dv_qp.rq.buf
    std::uint32_t wqe_count = 0;           // a power of two
    std::uint32_t stride = 0;              // bytes per receive WQE, a power of two
    std::uint32_t* doorbell_record = nullptr;  // same record as the send queue; uses [0]
};

struct SharedReceiveQueueRing {
    std::uint8_t* buffer = nullptr;        // mlx5dv_srq.buf
    std::uint32_t wqe_count = 0;           // a power of two
    std::uint32_t stride = 0;              // bytes per WQE, including the 16-byte next segment
    std::uint32_t srqn = 0;
    std::uint32_t* doorbell_record = nullptr;  // mlx5dv_srq.dbrec
};

struct CompletionQueueRing {
    std::uint8_t* buffer = nullptr;        // mlx5dv_cq.buf
    std::uint32_t cqe_count = 0;           // a power of two
    std::uint32_t cqe_size = 64;           // 64 or 128; the mlx5_cqe64 is the last 64 bytes
    std::uint32_t cqn = 0;
    std::uint32_t* doorbell_record = nullptr;  // mlx5dv_cq.dbrec: [0] set_ci, [1] arm
    // mlx5dv_cq.cq_uar: the UAR page whose CQ doorbell register (at 0x20) an arm writes;
    // nullptr where the CQ is never armed.
    std::uint8_t* uar = nullptr;
    // Created with CQE compression (MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE): the poller unpacks
    // compressed sessions and rewrites the entries it consumed (compressed_session.hpp). Without
    // it a compressed CQE is reported as a local QP operation error.
    bool compressed_cqes = false;
};

// Send-queue bookkeeping shared by the poster (which fills it) and the completion poller
// (which retires from it). Arrays are owned by the caller (no allocation here) and have
// SendQueueRing::wqe_count entries, indexed by the WQEBB a WQE starts at.
struct SendQueueTracking {
    std::uint64_t* wr_id = nullptr;
    // Producer index just past the WQE that starts at this WQEBB. A requester CQE names the
    // first WQEBB of the completed WQE (mlx5-facts.md §3), and one signaled completion
    // retires every unsignaled WQE before it, so the consumer index jumps to this value.
    std::uint32_t* wqe_end = nullptr;
    std::uint32_t producer_index = 0;  // WQEBBs posted, free running; low 16 bits on the wire
    std::uint32_t consumer_index = 0;  // WQEBBs known to be retired
    // Optional, wqe_count entries: for a UMR WQE, the CompletionOpcode its CQE reports (a
    // LOCAL_INV and a key configuration share WQE opcode 0x25; libmlx5 keeps sq.wr_data[] for
    // the same reason). Written only at UMR WQEs' slots and read only for UMR CQEs. Without
    // it the encoder refuses configure_memory_key.
    std::uint8_t* umr_opcode = nullptr;
};

// Retire the WQE a requester CQE names (and every unsignaled WQE before it); returns its wr_id.
RDMACHAN_HOST_DEVICE inline std::uint64_t retire_send(SendQueueTracking& tracking,
                                                      std::uint32_t wqe_count,
                                                      std::uint16_t wqe_counter) {
    const std::uint32_t slot = wqe_counter & (wqe_count - 1);
    tracking.consumer_index = tracking.wqe_end[slot];
    return tracking.wr_id[slot];
}

}  // namespace rdmachan::mlx5
