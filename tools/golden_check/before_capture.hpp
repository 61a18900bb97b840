// A capture's prior state given as steps: inputs.before_capture written as an array of the
// calls the harness really made before the capture, in order, replayed through the project's
// queues so that the capture starts from the same receive queue, SRQ and doorbell record as
// libmlx5's did. Each step is one object:
//
//   {"op": "ibv_post_recv", "wr_list": [...]}         receives on the QP's receive queue
//   {"op": "ibv_post_srq_recv", "wr_list": [...]}     receives on the SRQ
//   {"op": "ibv_post_send", "wr_list": [...]}         sends (wr_id, opcode, send_flags,
//                                                     sg_list, remote_addr, rkey, imm_data)
//   {"op": "ibv_poll_cq", "cqes_written": [{"entry_hex": ...}], "ne": N}
//                                                     CQEs written and polled (the 64-byte
//                                                     mlx5_cqe64; the owner bit is ours to set)
//   {"op": "emulate_rq_completions"}                  rq.tail = rq.head, as the harness did
//
// A post may record "return_code" and "bad_wr_index", a poll "return_code" and "wc" (each
// entry's fields.wr_id and status): each is checked against what our queue answered. A step
// of another op, or one acting on a queue the case does not model, makes the case unsupported,
// naming the step.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "tools/golden_check/case_result.hpp"
#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/send_queue.hpp"

namespace rdmachan::golden {

// The queues of the case the steps act on; those the case does not model are nullptr.
struct PriorStateQueues {
    mlx5::ReceiveQueue* receive = nullptr;
    mlx5::SharedReceiveQueue* shared_receive = nullptr;
    // The QP's doorbell record ([0] receive, [1] send): sends write [1] of it.
    std::uint32_t* doorbell_record = nullptr;
    std::uint32_t qpn = 0;
    std::uint32_t user_index = 0;
};

class BeforeCaptureReplay {
  public:
    explicit BeforeCaptureReplay(const PriorStateQueues& queues);
    // Its queues point into its own storage.
    BeforeCaptureReplay(const BeforeCaptureReplay&) = delete;
    BeforeCaptureReplay& operator=(const BeforeCaptureReplay&) = delete;

    // Empty when every step was replayed as libmlx5 answered it; else why not (unsupported:
    // a step it cannot replay; mismatch: our queue answered a step otherwise).
    std::optional<CaseResult> replay(const nlohmann::json& steps);

  private:
    std::optional<CaseResult> post_receives(const nlohmann::json& step, const std::string& where,
                                            bool shared);
    std::optional<CaseResult> post_sends(const nlohmann::json& step, const std::string& where);
    std::optional<CaseResult> poll(const nlohmann::json& step, const std::string& where);

    PriorStateQueues queues_;
    // The QP's send queue, made by the first send step: only its doorbell-record writes reach
    // the capture, so its ring is ours to size.
    static constexpr std::uint32_t kSendWqeCount = 256;
    std::vector<std::uint8_t> send_buffer_, registers_;
    std::vector<std::uint64_t> send_wr_ids_;
    std::vector<std::uint32_t> send_wqe_ends_;
    std::uint32_t own_doorbell_record_[2] = {0, 0};
    std::optional<mlx5::SendQueue> send_;
    // The CQ the steps' CQEs are written into: not the capture's, which the kinds with
    // before_capture steps do not model beyond each poll's own state_before.
    static constexpr std::uint32_t kCqeCount = 64;
    std::vector<std::uint8_t> completion_buffer_;
    std::uint32_t completion_doorbell_record_[2] = {0, 0};
    mlx5::CompletionQueue completion_queue_;
};

}  // namespace rdmachan::golden
