// A decoded completion. Status and opcode values equal enum ibv_wc_status / ibv_wc_opcode so
// that the verbs path and the mlx5 path report the same numbers.
#pragma once

#include <cstdint>

#include "transport/mlx5/host_device.hpp"

namespace rdmachan::mlx5 {

enum class CompletionStatus : std::uint8_t {
    success = 0,
    local_length_error = 1,
    local_qp_operation_error = 2,
    local_eec_operation_error = 3,
    local_protection_error = 4,
    work_request_flushed = 5,
    memory_window_bind_error = 6,
    bad_response = 7,
    local_access_error = 8,
    remote_invalid_request = 9,
    remote_access_error = 10,
    remote_operation_error = 11,
    transport_retry_exceeded = 12,
    rnr_retry_exceeded = 13,
    local_rdd_violation = 14,
    remote_invalid_rd_request = 15,
    remote_aborted = 16,
    invalid_eecn = 17,
    invalid_eec_state = 18,
    fatal = 19,
    response_timeout = 20,
    general_error = 21,
};

enum class CompletionOpcode : std::uint8_t {
    send = 0,
    rdma_write = 1,
    rdma_read = 2,
    atomic_compare_and_swap = 3,
    atomic_fetch_and_add = 4,
    bind_memory_window = 5,
    local_invalidate = 6,
    memory_key_configured = 135,  // MLX5DV_WC_UMR (IBV_WC_DRIVER1)
    receive = 128,
    receive_rdma_with_immediate = 129,
};

enum CompletionFlag : std::uint8_t {
    kCompletionGrh = 1u << 0,
    kCompletionWithImmediate = 1u << 1,
    kCompletionWithInvalidate = 1u << 2,
};

// The fields a successful send completion sets come first, in three 8-byte words (wr_id;
// status to dlid_path_bits; byte_len and qp_num), so that the poller fills them with three
// stores.
struct Completion {
    std::uint64_t wr_id = 0;
    CompletionStatus status = CompletionStatus::success;
    CompletionOpcode opcode = CompletionOpcode::send;
    std::uint8_t flags = 0;         // CompletionFlag bits
    bool is_receive = false;        // responder-side completion (receive queue or SRQ)
    std::uint8_t vendor_error = 0;  // the CQE's vendor syndrome, kept for error reports
    std::uint8_t syndrome = 0;      // the CQE's mlx5 syndrome (error CQEs only)
    std::uint8_t sl = 0;
    std::uint8_t dlid_path_bits = 0;
    std::uint32_t byte_len = 0;
    std::uint32_t qp_num = 0;
    std::uint32_t immediate = 0;         // host order; with kCompletionWithImmediate
    std::uint32_t invalidated_rkey = 0;  // with kCompletionWithInvalidate
    std::uint32_t src_qp = 0;
    std::uint16_t slid = 0;
    std::uint16_t pkey_index = 0;
};

// Words a person can act on, for logs and exception messages.
RDMACHAN_HOST_DEVICE inline const char* to_string(CompletionStatus status) {
    switch (status) {
        case CompletionStatus::success: return "success";
        case CompletionStatus::local_length_error: return "local length error";
        case CompletionStatus::local_qp_operation_error: return "local QP operation error";
        case CompletionStatus::local_eec_operation_error: return "local EE context operation error";
        case CompletionStatus::local_protection_error: return "local protection error";
        case CompletionStatus::work_request_flushed: return "work request flushed";
        case CompletionStatus::memory_window_bind_error: return "memory window bind error";
        case CompletionStatus::bad_response: return "bad response";
        case CompletionStatus::local_access_error: return "local access error";
        case CompletionStatus::remote_invalid_request: return "remote invalid request";
        case CompletionStatus::remote_access_error: return "remote access error";
        case CompletionStatus::remote_operation_error: return "remote operation error";
        case CompletionStatus::transport_retry_exceeded: return "transport retry counter exceeded";
        case CompletionStatus::rnr_retry_exceeded: return "RNR retry counter exceeded";
        case CompletionStatus::local_rdd_violation: return "local RDD violation";
        case CompletionStatus::remote_invalid_rd_request: return "remote invalid RD request";
        case CompletionStatus::remote_aborted: return "remote aborted";
        case CompletionStatus::invalid_eecn: return "invalid EE context number";
        case CompletionStatus::invalid_eec_state: return "invalid EE context state";
        case CompletionStatus::fatal: return "fatal error";
        case CompletionStatus::response_timeout: return "response timeout";
        case CompletionStatus::general_error: return "general error";
    }
    return "unknown status";
}

}  // namespace rdmachan::mlx5
