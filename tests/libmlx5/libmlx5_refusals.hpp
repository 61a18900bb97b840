// Which request libmlx5 v44 refuses, and why, derived from the requests and the queue's state
// the way its code decides (rdma-core providers/mlx5/qp.c and srq.c, cited per function below),
// so that the differential tests compare the reason of a refusal, not only its errno: a full
// queue, too many SGEs, an inline payload too large and too many layout entries are all ENOMEM
// to libmlx5's caller. The reasons are our encoder's PostResult values. Each test also checks
// the derivation against what libmlx5 really did (which request, which errno), so a wrong model
// fails as loudly as a wrong encoder.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>
#include <vector>

#include "transport/mlx5/work_request.hpp"

namespace rdmachan::libmlx5_instructions {

// What libmlx5 decides by, as it returned it from queue creation: max_post (cap.max_send_wr or
// cap.max_recv_wr), max_gs (cap.max_send_sge or max_recv_sge) and max_inline_data. `outstanding`
// is the requests posted whose completion was not yet polled (libmlx5's head - tail counts
// requests, not WQEBBs).
struct QueueLimits {
    std::uint32_t max_post = 0;
    std::uint32_t max_sge = 0;
    std::uint32_t max_inline_data = 0;
};

struct Refusal {
    std::uint32_t index = 0;                         // the request refused: how many were taken
    mlx5::PostResult reason = mlx5::PostResult::ok;  // ok: all were taken
};

// ibv_post_send on an RC queue pair (_mlx5_post_send): for each request in turn, a full queue
// (outstanding plus the requests before it in the list, against max_post), then num_sge against
// max_gs, then for an inline request with SGEs the running total against max_inline_data
// (set_data_inl_seg).
Refusal libmlx5_send_refusal(const std::vector<ibv_send_wr>& chain, std::uint32_t outstanding,
                             const QueueLimits& limits);
// ibv_post_recv (mlx5_post_recv): a full queue, then num_sge against max_gs.
Refusal libmlx5_receive_refusal(const std::vector<ibv_recv_wr>& chain, std::uint32_t outstanding,
                                const QueueLimits& limits);
// ibv_post_srq_recv (mlx5_post_srq_recv): num_sge against max_gs first, then an empty free
// list. The list keeps one WQE back (head == tail is empty), so `wqe_count` - 1 WQEs can be
// outstanding.
Refusal libmlx5_shared_receive_refusal(const std::vector<ibv_recv_wr>& chain,
                                       std::uint32_t outstanding, std::uint32_t wqe_count,
                                       std::uint32_t max_sge);

// One send request through the ibv_wr_* API, the `position`-th of its batch: a full queue in the
// opcode's builder (_common_wqe_init_op), then ibv_wr_set_sge_list's num_sge against max_gs, or
// ibv_wr_set_inline_data_list's total against max_inline_data (which counts bytes, not buffers).
mlx5::PostResult libmlx5_builder_refusal(std::uint32_t num_sge, bool inline_data,
                                         std::uint64_t inline_total, std::uint32_t outstanding,
                                         std::uint32_t position, const QueueLimits& limits);
// mlx5dv_wr_mr_list and mlx5dv_wr_mr_interleaved (mlx5_send_wr_set_mkey_layout): more entries
// than the inline room holds (16-byte entries in max_inline_data plus the 4-byte inline header,
// one fewer for an interleaved layout's repeat block) or than the key was created for.
mlx5::PostResult libmlx5_layout_refusal(bool interleaved, std::uint32_t num_entries,
                                        std::uint32_t key_entries, std::uint32_t max_inline_data);

// The reason's name, for counts and failure messages.
const char* reason_name(mlx5::PostResult reason);
// Empty when libmlx5 did what the derivation says (refused `expected.index` with its errno, or
// took all), else what differs.
std::string check_derivation(const Refusal& expected, int their_result, std::uint32_t their_posted,
                             std::uint32_t requests, int (*errno_of)(mlx5::PostResult));
// Empty when our post refused the same request for the same reason (or took all), else what
// differs.
std::string refusal_difference(const Refusal& expected, mlx5::PostResult our_result,
                               std::uint32_t our_posted);

}  // namespace rdmachan::libmlx5_instructions
