// Shared by the receive-side checks: one ibv_poll_cq step replayed through CompletionQueue.
#pragma once

#include <nlohmann/json.hpp>

#include <map>
#include <string>
#include <vector>

#include "tools/golden_check/case_result.hpp"
#include "transport/mlx5/completion_queue.hpp"

namespace rdmachan::golden {

// The harness's QP A (whose queues we model) and QP B (a second QP, whose receive queue we model
// when the setup lists its receives), by user index.
struct PollQueues {
    mlx5::SendQueueTracking* send = nullptr;
    std::uint32_t send_wqe_count = 0;
    mlx5::ReceiveQueue* receive = nullptr;
    mlx5::SharedReceiveQueue* shared_receive = nullptr;
    mlx5::ReceiveQueue* receive_b = nullptr;  // QP B's, when the setup posted receives to it
    std::uint32_t qp_a_user_index = 1;
    std::uint32_t qp_b_user_index = 0;
    std::uint32_t qp_a_qpn = 0;
    // inputs.setup.pre_polled_cqes: completions of QP A's first receives (RQ order, or the SRQ
    // indices in shared_receive_posted), written as RESP_SEND CQEs and polled before the capture.
    // Past the receives outstanding, a receive queue's still take the next slot: libmlx5 v44
    // takes wrid[tail] and advances the tail without asking whether a receive is there.
    std::uint32_t pre_polled = 0;
    std::vector<std::uint32_t> shared_receive_posted;
    // CheckOptions::scatter_to_cqe: QP A's send ring (an answer in a requester CQE goes to the
    // buffers its WQE there names), the scratch memory standing in for every buffer the setup's
    // work requests name, and those buffers by wr_id.
    bool scatter_to_cqe = false;
    const std::uint8_t* send_ring = nullptr;
    const std::vector<std::uint8_t>* scratch = nullptr;
    std::map<std::uint64_t, std::vector<mlx5::ScatterGatherElement>> receive_buffers;
    std::map<std::uint64_t, std::vector<mlx5::ScatterGatherElement>> send_buffers;
};

// A case of kind "cqe" (completion_case.cpp).
CaseResult check_completion_case(const nlohmann::json& one_case);

// `cq`: the case's inputs.cq; `outputs`: a cqe case's outputs or an ibv_poll_cq step.
CaseResult check_poll(const nlohmann::json& cq, const nlohmann::json& outputs, PollQueues& queues);

std::string compare_srq_links(const mlx5::SharedReceiveQueue& queue, const nlohmann::json& links);

}  // namespace rdmachan::golden
