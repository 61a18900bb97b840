#include "tools/golden_check/before_capture.hpp"

#include <algorithm>
#include <string>

#include "tools/golden_check/hex.hpp"
#include "tools/golden_check/post_errno.hpp"
#include "tools/golden_check/request_lists.hpp"
#include "tools/golden_check/verbs_names.hpp"

namespace rdmachan::golden {
namespace {

namespace mlx5 = rdmachan::mlx5;
using nlohmann::json;

constexpr std::uint32_t kIbvSendSignaled = 2;  // IBV_SEND_SIGNALED

CaseResult unsupported_step(const std::string& where, const std::string& why) {
    return CaseResult::unsupported(where + " not reproduced: " + why);
}

// A post's recorded answer (return_code, bad_wr_index; none recorded means it succeeded) against
// ours.
std::optional<CaseResult> check_answer(const json& step, const std::string& where, int our_errno,
                                       std::uint32_t accepted, std::uint32_t requested) {
    const std::uint64_t their_errno = number_or(step, "return_code", 0);
    if (their_errno != static_cast<std::uint64_t>(our_errno)) {
        return CaseResult::mismatch("in the return code of " + where + ": libmlx5 " +
                                    std::to_string(their_errno) + ", ours " +
                                    std::to_string(our_errno));
    }
    const std::uint64_t their_accepted =
        number_or(step, "bad_wr_index", their_errno == 0 ? requested : accepted);
    if (their_accepted != accepted) {
        return CaseResult::mismatch("in bad_wr_index of " + where + ": libmlx5 " +
                                    std::to_string(their_accepted) + ", ours " +
                                    std::to_string(accepted));
    }
    return std::nullopt;
}

}  // namespace

BeforeCaptureReplay::BeforeCaptureReplay(const PriorStateQueues& queues)
    : queues_(queues),
      completion_buffer_(static_cast<std::size_t>(kCqeCount) * mlx5::kCqeSize64, 0) {
    // A fresh CQ: every entry invalid and owned by hardware, as libmlx5 initialises it.
    for (std::uint32_t i = 0; i < kCqeCount; ++i)
        completion_buffer_[(i + 1) * mlx5::kCqeSize64 - 1] = 0xf0;
    mlx5::CompletionQueueRing ring;
    ring.buffer = completion_buffer_.data();
    ring.cqe_count = kCqeCount;
    ring.cqe_size = mlx5::kCqeSize64;
    ring.doorbell_record = completion_doorbell_record_;
    completion_queue_ = mlx5::CompletionQueue(ring, 0);
}

std::optional<CaseResult> BeforeCaptureReplay::replay(const json& steps) {
    for (std::size_t index = 0; index < steps.size(); ++index) {
        const json& step = steps[index];
        const std::string where = "inputs.before_capture[" + std::to_string(index) + "]";
        if (!step.is_object() || !step.contains("op") || !step.at("op").is_string()) {
            return unsupported_step(where, "a step is an object naming its op");
        }
        const std::string op = step.at("op").get<std::string>();
        std::optional<CaseResult> result;
        if (op == "ibv_post_recv") {
            result = post_receives(step, where, false);
        } else if (op == "ibv_post_srq_recv") {
            result = post_receives(step, where, true);
        } else if (op == "ibv_post_send") {
            result = post_sends(step, where);
        } else if (op == "ibv_poll_cq") {
            result = poll(step, where);
        } else if (op == "emulate_rq_completions") {
            if (queues_.receive == nullptr)
                return unsupported_step(where, "this case has no receive queue to complete");
            queues_.receive->set_counters(queues_.receive->head(), queues_.receive->head());
        } else {
            return unsupported_step(where, "op " + op + " is not one this tool replays");
        }
        if (result.has_value()) return result;
    }
    return std::nullopt;
}

std::optional<CaseResult> BeforeCaptureReplay::post_receives(const json& step,
                                                             const std::string& where,
                                                             bool shared) {
    if (shared ? queues_.shared_receive == nullptr : queues_.receive == nullptr) {
        return unsupported_step(
            where, shared ? "this case has no SRQ" : "this case's QP receives from an SRQ");
    }
    ReceiveRequests requests = receive_requests(step.at("wr_list"));
    const std::uint32_t count = static_cast<std::uint32_t>(requests.requests.size());
    std::uint32_t accepted = 0;
    const mlx5::PostResult result =
        shared ? queues_.shared_receive->post(requests.requests.data(), count, &accepted)
               : queues_.receive->post(requests.requests.data(), count, &accepted);
    return check_answer(step, where, receive_errno_of(result), accepted, count);
}

std::optional<CaseResult> BeforeCaptureReplay::post_sends(const json& step,
                                                          const std::string& where) {
    if (!send_.has_value()) {
        send_buffer_.assign(static_cast<std::size_t>(kSendWqeCount) * mlx5::kSendWqeBasicBlockSize,
                            0);
        registers_.assign(1024, 0);
        send_wr_ids_.assign(kSendWqeCount, 0);
        send_wqe_ends_.assign(kSendWqeCount, 0);
        std::uint32_t* record =
            queues_.doorbell_record != nullptr ? queues_.doorbell_record : own_doorbell_record_;
        mlx5::SendQueueRing ring{
            send_buffer_.data(), kSendWqeCount, queues_.qpn, record, registers_.data(), 256};
        mlx5::SendQueueTracking tracking{send_wr_ids_.data(), send_wqe_ends_.data(), 0, 0, nullptr};
        mlx5::SendQueueConfig config;
        config.max_sge = 4;
        config.max_inline_data = 256;
        send_.emplace(ring, tracking, config);
    }
    const json& wr_list = step.at("wr_list");
    std::vector<mlx5::SendWorkRequest> requests;
    std::vector<std::vector<mlx5::ScatterGatherElement>> elements;
    elements.reserve(wr_list.size());
    for (const json& wr : wr_list) {
        const std::optional<mlx5::SendOpcode> opcode =
            send_opcode_from_name(wr.at("opcode").get<std::string>());
        if (!opcode.has_value())
            return unsupported_step(where, "send opcode " + wr.at("opcode").get<std::string>());
        std::vector<mlx5::ScatterGatherElement> list;
        if (wr.contains("sg_list")) {
            for (const json& element : wr.at("sg_list"))
                list.push_back(scatter_gather_element(element));
        } else if (wr.contains("sge")) {
            list.push_back(scatter_gather_element(wr.at("sge")));
        }
        elements.push_back(std::move(list));
        mlx5::SendWorkRequest request;
        request.wr_id = number(wr.at("wr_id"));
        request.opcode = *opcode;
        request.flags = (number_or(wr, "send_flags", 0) & kIbvSendSignaled) != 0
                            ? std::uint32_t{mlx5::kSendSignaled}
                            : 0u;
        if ((number_or(wr, "send_flags", 0) & ~std::uint64_t{kIbvSendSignaled}) != 0) {
            return unsupported_step(where, "send flags other than IBV_SEND_SIGNALED");
        }
        request.sg_list = elements.back().data();
        request.num_sge = static_cast<std::uint32_t>(elements.back().size());
        request.remote_addr = number_or(wr, "remote_addr", 0);
        request.rkey = static_cast<std::uint32_t>(number_or(wr, "rkey", 0));
        request.immediate = static_cast<std::uint32_t>(number_or(wr, "imm_data", 0));
        requests.push_back(request);
    }
    std::uint32_t accepted = 0;
    const mlx5::PostResult result =
        send_->post(requests.data(), static_cast<std::uint32_t>(requests.size()), &accepted);
    return check_answer(step, where, send_errno_of(result), accepted,
                        static_cast<std::uint32_t>(requests.size()));
}

std::optional<CaseResult> BeforeCaptureReplay::poll(const json& step, const std::string& where) {
    const json& written = step.at("cqes_written");
    if (written.size() > kCqeCount)
        return unsupported_step(where, "more CQEs in one poll than a 64-entry CQ holds");
    mlx5::CompletionTarget target;
    target.receive = queues_.receive;
    target.shared_receive = queues_.shared_receive;
    if (send_.has_value()) {
        target.send = &send_->tracking();
        target.send_wqe_count = kSendWqeCount;
    }
    for (std::size_t i = 0; i < written.size(); ++i) {
        const std::vector<std::uint8_t> entry =
            bytes_from_hex(written[i].at("entry_hex").get<std::string>());
        if (entry.size() != mlx5::kCqeSize64)
            return unsupported_step(where, "a CQE of other than 64 bytes");
        const std::uint32_t user_index =
            mlx5::load_big32(entry.data() + mlx5::kCqeSrqnUserIndex) & 0xffffff;
        if (user_index != queues_.user_index) {
            return unsupported_step(where, "a CQE for a QP other than the case's (user index " +
                                               std::to_string(user_index) + ")");
        }
        const std::uint8_t opcode = entry[mlx5::kCqeOpOwn] >> 4;
        if ((opcode == mlx5::kCqeRequester || opcode == mlx5::kCqeRequesterError) &&
            !send_.has_value()) {
            return unsupported_step(where, "a requester CQE before any send step");
        }
        // Written where our consumer index will find it, owned by software on this pass.
        const std::uint32_t index =
            completion_queue_.consumer_index() + static_cast<std::uint32_t>(i);
        std::uint8_t* cqe = completion_buffer_.data() +
                            static_cast<std::size_t>(index % kCqeCount) * mlx5::kCqeSize64;
        std::copy(entry.begin(), entry.end(), cqe);
        cqe[mlx5::kCqeOpOwn] =
            static_cast<std::uint8_t>((entry[mlx5::kCqeOpOwn] & 0xfe) | ((index / kCqeCount) & 1));
    }
    const std::uint32_t capacity =
        static_cast<std::uint32_t>(number_or(step, "ne", written.size()));
    std::vector<mlx5::Completion> completions(capacity + 1);
    const std::uint32_t count = completion_queue_.poll(
        completions.data(), capacity, [&](std::uint32_t, std::uint32_t) { return &target; });
    const std::uint64_t their_count = number_or(step, "return_code", written.size());
    if (count != their_count) {
        return CaseResult::mismatch("in the number of completions of " + where + ": libmlx5 " +
                                    std::to_string(their_count) + ", ours " +
                                    std::to_string(count));
    }
    if (step.contains("wc")) {
        for (const json& wc : step.at("wc")) {
            const std::size_t at = static_cast<std::size_t>(number(wc.at("index")));
            if (at >= count) continue;
            const json& fields = wc.at("fields");
            if (fields.contains("wr_id") && !fields.at("wr_id").is_null() &&
                number(fields.at("wr_id")) != completions[at].wr_id) {
                return CaseResult::mismatch("in the wr_id of completion " + std::to_string(at) +
                                            " of " + where);
            }
            if (fields.contains("status") && !fields.at("status").is_null() &&
                number(fields.at("status")) != static_cast<std::uint64_t>(completions[at].status)) {
                return CaseResult::mismatch("in the status of completion " + std::to_string(at) +
                                            " of " + where);
            }
        }
    }
    return std::nullopt;
}

}  // namespace rdmachan::golden
