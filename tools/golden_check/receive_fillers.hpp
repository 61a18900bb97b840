// The text form of a recv_wqe case's inputs.before_capture: "<N> filler WRs (1 SGE {<addr>,
// len <L>, lkey <K>}) posted with ibv_post_recv, <M> per call". The harness emulates
// completions by rq.tail = rq.head (golden README), so the fillers need not all be outstanding:
// rq_before's tail says where the last emulation left it.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "tools/golden_check/case_result.hpp"
#include "transport/mlx5/receive_queue.hpp"

namespace rdmachan::golden {

// Posts the fillers through `queue` so that it ends at head_before / tail_before, the ring
// holding the fillers' WQEs and the doorbell record their count, as libmlx5's did. Empty when
// replayed; unsupported when the text is not this form or no order of posts and emulated
// completions reaches rq_before; mismatch when our queue refuses a filler libmlx5 took.
std::optional<CaseResult> replay_receive_fillers(const std::string& text, mlx5::ReceiveQueue& queue,
                                                 std::uint32_t head_before,
                                                 std::uint32_t tail_before);

}  // namespace rdmachan::golden
