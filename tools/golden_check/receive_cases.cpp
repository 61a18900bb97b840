// Replays recv-vectors.json: receive-queue posts (recv_wqe) and SRQ posts and polls (srq_wqe)
// here, CQE decoding (cqe) in completion_case.cpp, through the project's ReceiveQueue,
// SharedReceiveQueue, SendQueue and CompletionQueue, comparing only what libmlx5 v44 wrote.
#include <algorithm>
#include <cerrno>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "tools/golden_check/before_capture.hpp"
#include "tools/golden_check/completion_check.hpp"
#include "tools/golden_check/hex.hpp"
#include "tools/golden_check/input_fields.hpp"
#include "tools/golden_check/post_errno.hpp"
#include "tools/golden_check/receive_fillers.hpp"
#include "tools/golden_check/request_lists.hpp"
#include "tools/golden_check/shared_receive_fixture.hpp"

namespace rdmachan::golden {
namespace {

namespace mlx5 = rdmachan::mlx5;
using nlohmann::json;

std::string compare_bytes(const std::uint8_t* actual, const json& bytes_hex, const json& mask_hex, const std::string& what) {
    const std::vector<std::uint8_t> expected = bytes_from_hex(bytes_hex.get<std::string>());
    const std::vector<std::uint8_t> mask = bytes_from_hex(mask_hex.get<std::string>());
    for (std::size_t i = 0; i < expected.size(); ++i) {
        if (mask[i] == 0xff && actual[i] != expected[i]) {
            return "at byte " + std::to_string(i) + " of " + what + ": libmlx5 " + std::to_string(expected[i]) +
                   ", ours " + std::to_string(actual[i]);
        }
    }
    return {};
}

CaseResult check_post_outcome(mlx5::PostResult result, std::uint32_t posted, const json& outputs) {
    if (static_cast<std::uint64_t>(receive_errno_of(result)) != number(outputs.at("return_code"))) {
        return CaseResult::mismatch("in the return code: libmlx5 " + outputs.at("return_code").dump() + ", ours " +
                                    std::to_string(receive_errno_of(result)));
    }
    if (outputs.contains("bad_wr_index") && !outputs.at("bad_wr_index").is_null() &&
        number(outputs.at("bad_wr_index")) != posted) {
        return CaseResult::mismatch("in bad_wr_index: libmlx5 " + outputs.at("bad_wr_index").dump() + ", ours " +
                                    std::to_string(posted));
    }
    return CaseResult::matched();
}


// The inputs of each kind this file reproduces. Besides the fields it replays, some are read
// only to check they agree with what it builds (marked "checked"), and some describe the
// harness's memory layout, which the comparison is independent of (marked "layout").
const ReproducedFields kReceiveWqeFields = {
    "inputs.rq_before.qp_num", "inputs.rq_before.wqe_cnt", "inputs.rq_before.stride_bytes",
    "inputs.rq_before.wqe_shift",            // checked: log2 of the stride
    "inputs.rq_before.max_gs",               // checked: derived from the stride
    "inputs.rq_before.max_post",             // checked: equals wqe_cnt, our ring's capacity
    "inputs.rq_before.qp_state_max_gs",      // -1 (RESET) is unsupported, else checked = max_gs
    "inputs.rq_before.wq_sig", "inputs.rq_before.head", "inputs.rq_before.tail",
    "inputs.rq_before.user_index",           // names the QP to a CQ; no poll in this kind
    "inputs.rq_before.rq_offset_in_qp_buf",  // layout: WQEs are compared at byte_offset_in_rq
    "inputs.rq_before.sq_offset_in_qp_buf",  // layout
    "inputs.qp_create_attr.max_recv_wr",     // checked: its result is rq_before.wqe_cnt
    "inputs.qp_create_attr.max_recv_sge",    // checked: its result is rq_before.max_gs
    "inputs.qp_create_attr.qp_state",        // checked: its result is rq_before.qp_state_max_gs
    "inputs.qp_create_attr.MLX5_QP_SIGNATURE",  // checked: equals rq_before.wq_sig
    "inputs.before_capture",                 // replayed: the filler posts or the steps
    "inputs.wr_list[].wr_id", "inputs.wr_list[].num_sge", "inputs.wr_list[].sg_list[].addr",
    "inputs.wr_list[].sg_list[].length", "inputs.wr_list[].sg_list[].lkey",
};

const ReproducedFields kSharedReceiveWqeFields = {
    "inputs.srq_after_create.srqn", "inputs.srq_after_create.max", "inputs.srq_after_create.stride_bytes",
    "inputs.srq_after_create.wqe_shift",     // checked: log2 of the stride
    "inputs.srq_after_create.max_gs",        // checked: derived from the stride
    "inputs.srq_after_create.head", "inputs.srq_after_create.tail", "inputs.srq_after_create.counter",
    // The wait queue (ODP page faults only) is in the links below; its head/tail are not used by
    // post or poll, and an ODP fault case is unsupported.
    "inputs.srq_after_create.waitq_head", "inputs.srq_after_create.waitq_tail",
    "inputs.srq_links_after_create[]",
    "inputs.srq_dbrec_after_create",         // the dbrec is compared where a step wrote it
    "inputs.ibv_create_srq_attr_in.*",       // checked: its result is srq_after_create
    "inputs.ibv_create_srq_attr_out.max_wr", // checked: equals srq_after_create.tail
    "inputs.ibv_create_srq_attr_out.max_sge",  // checked: equals srq_after_create.max_gs
    "inputs.kernel_cmd_seen.*",              // what creation told the kernel: no effect on the rings
    // libmlx5 v44 writes no SRQ WQE signature even when asked; neither do we.
    "inputs.MLX5_SRQ_SIGNATURE", "inputs.srq_wq_sig",
    "inputs.attached_qp.user_index",         // names the QP to the CQ in poll steps
    "inputs.attached_qp.qp_num",             // checked against the CQEs' QPN by the poll
    "inputs.attached_qp.rq_wqe_cnt",         // the QP's own RQ is unused (receives go to the SRQ)
    "inputs.before_capture",                 // replayed: the post/poll cycles or the steps
};

unsigned log2_of(std::uint64_t value) {
    unsigned shift = 0;
    while ((std::uint64_t{1} << shift) < value) ++shift;
    return shift;
}

// inputs.before_capture of an srq_wqe case: "<N> cycles of (post 1 WR, poll its RESP_SEND CQE)".
std::optional<std::uint32_t> parse_shared_receive_cycles(const std::string& text) {
    static const std::regex pattern(R"(^(\d+) cycles of \(post 1 WR, poll its RESP_SEND CQE\)$)");
    std::smatch match;
    if (!std::regex_match(text, match, pattern)) return std::nullopt;
    return static_cast<std::uint32_t>(std::stoul(match[1].str()));
}

CaseResult check_receive_wqe(const json& one_case) {
    if (std::optional<CaseResult> missing = unreproduced(one_case, kReceiveWqeFields)) return *missing;
    const json& before = one_case.at("inputs").at("rq_before");
    const json& outputs = one_case.at("outputs");
    if (static_cast<long long>(number_or(before, "qp_state_max_gs", 0)) < 0 ||
        before.at("qp_state_max_gs").get<long long>() < 0) {
        return CaseResult::unsupported("the QP's state is checked by the control plane, which never posts receives to a "
                                       "QP in RESET; the ring has no state to refuse with");
    }
    const std::uint32_t wqe_count = static_cast<std::uint32_t>(number(before.at("wqe_cnt")));
    const std::uint32_t stride = static_cast<std::uint32_t>(number(before.at("stride_bytes")));
    const json& create = one_case.at("inputs").at("qp_create_attr");
    if (number(before.at("wqe_shift")) != log2_of(stride) || (stride & (stride - 1)) != 0) {
        return *unreproduced_value("inputs.rq_before.wqe_shift", "it is not log2 of stride_bytes");
    }
    if (number(before.at("max_post")) != wqe_count) {
        return *unreproduced_value("inputs.rq_before.max_post", "our ring accepts exactly wqe_cnt WQEs");
    }
    if (number(before.at("qp_state_max_gs")) != number(before.at("max_gs"))) {
        return *unreproduced_value("inputs.rq_before.qp_state_max_gs", "it differs from max_gs");
    }
    if (create.value("qp_state", std::string()) != "RTS") {
        return *unreproduced_value("inputs.qp_create_attr.qp_state", "receives are posted to a QP in RTS only");
    }
    if ((create.value("MLX5_QP_SIGNATURE", std::string()) == "set") != (number(before.at("wq_sig")) != 0)) {
        return *unreproduced_value("inputs.qp_create_attr.MLX5_QP_SIGNATURE", "it disagrees with rq_before.wq_sig");
    }
    if (number(create.at("max_recv_wr")) > wqe_count || number(create.at("max_recv_sge")) > number(before.at("max_gs"))) {
        return *unreproduced_value("inputs.qp_create_attr", "the ring in rq_before is smaller than it asks for");
    }
    const std::uint32_t head_before = static_cast<std::uint32_t>(number(before.at("head")));
    const std::uint32_t tail_before = static_cast<std::uint32_t>(number(before.at("tail")));
    std::vector<std::uint8_t> buffer(static_cast<std::size_t>(wqe_count) * stride, kPoison);
    std::uint32_t doorbell_record[2] = {kDoorbellRecordPoison, kDoorbellRecordPoison};
    std::vector<std::uint64_t> wr_ids(wqe_count, 0);

    mlx5::ReceiveQueueRing ring{buffer.data(), wqe_count, stride, doorbell_record};
    mlx5::ReceiveQueueConfig config;
    config.qpn = static_cast<std::uint32_t>(number(before.at("qp_num")));
    config.wqe_signature = number(before.at("wq_sig")) != 0;
    mlx5::ReceiveQueue queue(ring, wr_ids.data(), config);
    if (queue.max_sge() != number(before.at("max_gs"))) {
        return CaseResult::mismatch("in max_gs derived from the stride: libmlx5 " + before.at("max_gs").dump());
    }
    // The receives really posted before the capture (and the sends, whose doorbell record is the
    // same), so the ring holds their WQEs and wr_ids and the record their counts, as libmlx5's
    // did when the capture began.
    const json& prior = one_case.at("inputs").at("before_capture");
    std::optional<CaseResult> replayed;
    if (prior.is_array()) {
        PriorStateQueues prior_queues;
        prior_queues.receive = &queue;
        prior_queues.doorbell_record = doorbell_record;
        prior_queues.qpn = config.qpn;
        prior_queues.user_index = static_cast<std::uint32_t>(number_or(before, "user_index", 0));
        BeforeCaptureReplay replay(prior_queues);
        replayed = replay.replay(prior);
    } else if (prior.is_string()) {
        replayed = replay_receive_fillers(prior.get<std::string>(), queue, head_before, tail_before);
    } else {
        replayed = unreproduced_value("inputs.before_capture", "neither the text form nor a list of steps");
    }
    if (replayed.has_value()) return *replayed;
    if (queue.head() != head_before || queue.tail() != tail_before) {
        return CaseResult::mismatch("in the receive queue head/tail after the before-capture steps: libmlx5 " +
                                    std::to_string(head_before) + "/" + std::to_string(tail_before) + ", ours " +
                                    std::to_string(queue.head()) + "/" + std::to_string(queue.tail()));
    }
    const std::vector<std::uint8_t> buffer_before = buffer;
    const std::uint32_t receive_record_before = doorbell_record[mlx5::kReceiveDoorbell];
    const std::uint32_t send_record_before = doorbell_record[mlx5::kSendDoorbell];

    ReceiveRequests requests = receive_requests(one_case.at("inputs").at("wr_list"));
    std::uint32_t posted = 0;
    const mlx5::PostResult result =
        queue.post(requests.requests.data(), static_cast<std::uint32_t>(requests.requests.size()), &posted);
    CaseResult outcome = check_post_outcome(result, posted, outputs);
    if (outcome.kind != CaseResult::Kind::match) return outcome;

    std::vector<bool> touched(buffer.size(), false);
    for (const json& wqe : outputs.at("wqes")) {
        const std::size_t offset = static_cast<std::size_t>(number(wqe.at("byte_offset_in_rq")));
        std::string difference = compare_bytes(buffer.data() + offset, wqe.at("bytes_hex"), wqe.at("written_mask_hex"),
                                               "receive WQE " + wqe.at("wr_index").dump());
        if (!difference.empty()) return CaseResult::mismatch(difference);
        for (std::size_t i = 0; i < stride; ++i) touched[offset + i] = true;
    }
    for (std::size_t i = 0; i < buffer.size(); ++i) {
        if (!touched[i] && buffer[i] != buffer_before[i]) return CaseResult::mismatch("at ring byte " + std::to_string(i) + ": written outside the posted WQEs");
    }
    if (queue.head() != number(outputs.at("rq_head_after"))) return CaseResult::mismatch("in the head after posting");
    // The wr_id kept for each slot this call posted (earlier slots hold the fillers' wr_ids,
    // which the harness posted before the capture and we did not).
    const json& wr_id_array = outputs.at("wrid_array_after");
    for (const json& wqe : outputs.at("wqes")) {
        const std::size_t slot = static_cast<std::size_t>(number(wqe.at("ring_index")));
        if (number(wr_id_array.at(slot)) != wr_ids[slot]) {
            return CaseResult::mismatch("in the wr_id kept for slot " + std::to_string(slot));
        }
    }
    const json& doorbell = outputs.at("dbrec");
    const std::uint32_t receive_record = doorbell_record[mlx5::kReceiveDoorbell];
    const std::vector<std::uint8_t> mask = bytes_from_hex(doorbell.at("written_mask_hex").get<std::string>());
    if (mask[0] == 0xff) {
        if (mlx5::big_to_host32(receive_record) != number(doorbell.at("rcv_dbr_value"))) {
            return CaseResult::mismatch("in the receive doorbell record: libmlx5 " + doorbell.at("rcv_dbr_value").dump() +
                                        ", ours " + std::to_string(mlx5::big_to_host32(receive_record)));
        }
    } else if (receive_record != receive_record_before) {
        return CaseResult::mismatch("the receive doorbell record was written where libmlx5 wrote none");
    }
    if (doorbell_record[mlx5::kSendDoorbell] != send_record_before) {
        return CaseResult::mismatch("the send doorbell record was written by a receive post");
    }
    return CaseResult::matched();
}

CaseResult check_shared_receive_post(SharedReceiveQueueFixture& fixture, const json& step) {
    std::vector<std::uint8_t> before = fixture.buffer;
    const std::uint32_t doorbell_record_before = fixture.doorbell_record;
    ReceiveRequests requests = receive_requests(step.at("wr_list"));
    std::uint32_t posted = 0;
    const mlx5::PostResult result = fixture.queue.post(requests.requests.data(),
                                                       static_cast<std::uint32_t>(requests.requests.size()), &posted);
    CaseResult outcome = check_post_outcome(result, posted, step);
    if (outcome.kind != CaseResult::Kind::match) return outcome;
    const std::uint32_t stride = fixture.queue.ring().stride;
    std::vector<bool> touched(fixture.buffer.size(), false);
    for (const json& wqe : step.at("wqes")) {
        const std::size_t offset = static_cast<std::size_t>(number(wqe.at("srq_index"))) * stride;
        std::string difference = compare_bytes(fixture.buffer.data() + offset, wqe.at("bytes_hex"),
                                               wqe.at("written_mask_hex"), "SRQ WQE " + wqe.at("srq_index").dump());
        if (!difference.empty()) return CaseResult::mismatch(difference);
        const std::vector<std::uint8_t> mask = bytes_from_hex(wqe.at("written_mask_hex").get<std::string>());
        for (std::size_t i = 0; i < mask.size(); ++i) touched[offset + i] = mask[i] == 0xff;
    }
    for (std::size_t i = 0; i < fixture.buffer.size(); ++i) {
        if (!touched[i] && fixture.buffer[i] != before[i]) {
            return CaseResult::mismatch("at SRQ byte " + std::to_string(i) + ": written where libmlx5 wrote nothing");
        }
    }
    const json& after = step.at("srq_after");
    if (fixture.queue.head() != number(after.at("head")) || fixture.queue.tail() != number(after.at("tail")) ||
        fixture.queue.counter() != number(after.at("counter"))) {
        return CaseResult::mismatch("in the SRQ head/tail/counter after posting");
    }
    std::string difference = compare_srq_links(fixture.queue, step.at("srq_links_after"));
    if (!difference.empty()) return CaseResult::mismatch(difference);
    const json& doorbell = step.at("srq_dbrec");
    const std::vector<std::uint8_t> mask = bytes_from_hex(doorbell.at("written_mask_hex").get<std::string>());
    if (mask[0] == 0xff && mlx5::big_to_host32(fixture.doorbell_record) != number(doorbell.at("value"))) {
        return CaseResult::mismatch("in the SRQ doorbell record: libmlx5 " + doorbell.at("value").dump());
    }
    if (mask[0] != 0xff && fixture.doorbell_record != doorbell_record_before) {
        return CaseResult::mismatch("the SRQ doorbell record was written where libmlx5 wrote none");
    }
    return CaseResult::matched();
}

// One before-capture cycle: post one receive to the SRQ, then poll the RESP_SEND CQE a
// responder writes for it, through our CompletionQueue (which frees the WQE).
CaseResult run_shared_receive_cycle(SharedReceiveQueueFixture& fixture, mlx5::CompletionQueue& completion_queue,
                                    std::vector<std::uint8_t>& cq_buffer, std::uint32_t cqe_count,
                                    std::uint32_t user_index, std::uint32_t qpn, std::uint32_t cycle) {
    mlx5::ScatterGatherElement element{0x00007f1122334450, 0x1000, 0x0a0b0c0d};
    mlx5::ReceiveWorkRequest request;
    request.wr_id = 0xc0000000u + cycle;
    request.num_sge = 1;
    request.sg_list = &element;
    const std::uint32_t index = fixture.queue.head();
    if (fixture.queue.post(&request, 1, nullptr) != mlx5::PostResult::ok) {
        return CaseResult::mismatch("a before-capture SRQ receive (inputs.before_capture) was refused");
    }
    const std::uint32_t consumer_index = completion_queue.consumer_index();
    std::uint8_t* cqe = cq_buffer.data() + static_cast<std::size_t>(consumer_index % cqe_count) * mlx5::kCqeSize64;
    std::fill(cqe, cqe + mlx5::kCqeSize64, std::uint8_t{0});
    mlx5::store_big32(cqe + mlx5::kCqeSrqnUserIndex, user_index);
    mlx5::store_big32(cqe + mlx5::kCqeByteCount, 0x40);
    mlx5::store_big32(cqe + mlx5::kCqeSopDropQpn, qpn & 0xffffff);
    mlx5::store_big16(cqe + mlx5::kCqeWqeCounter, static_cast<std::uint16_t>(index));
    cqe[mlx5::kCqeOpOwn] = static_cast<std::uint8_t>((mlx5::kCqeResponderSend << 4) | ((consumer_index / cqe_count) & 1));
    mlx5::CompletionTarget target;
    target.shared_receive = &fixture.queue;
    mlx5::Completion completion;
    const std::uint32_t count = completion_queue.poll(&completion, 1, [&](std::uint32_t, std::uint32_t) { return &target; });
    if (count != 1 || completion.wr_id != request.wr_id || completion.status != mlx5::CompletionStatus::success) {
        return CaseResult::mismatch("a before-capture SRQ cycle's completion was not delivered");
    }
    return CaseResult::matched();
}

CaseResult check_shared_receive_wqe(const json& one_case) {
    if (std::optional<CaseResult> missing = unreproduced(one_case, kSharedReceiveWqeFields)) return *missing;
    const json& inputs = one_case.at("inputs");
    const json& created = inputs.at("srq_after_create");
    if (number(created.at("wqe_shift")) != log2_of(number(created.at("stride_bytes")))) {
        return *unreproduced_value("inputs.srq_after_create.wqe_shift", "it is not log2 of stride_bytes");
    }
    if (number(inputs.at("ibv_create_srq_attr_out").at("max_wr")) != number(created.at("tail")) ||
        number(inputs.at("ibv_create_srq_attr_out").at("max_sge")) != number(created.at("max_gs"))) {
        return *unreproduced_value("inputs.ibv_create_srq_attr_out", "it disagrees with srq_after_create");
    }
    if (inputs.at("srq_links_after_create").size() != number(created.at("max"))) {
        return *unreproduced_value("inputs.srq_links_after_create", "not one link per WQE");
    }
    SharedReceiveQueueFixture fixture(created, inputs.at("srq_links_after_create"));
    if (fixture.queue.max_sge() != number(created.at("max_gs"))) {
        return CaseResult::mismatch("in max_gs derived from the SRQ stride");
    }
    const json& prior = inputs.at("before_capture");
    const json& qp = inputs.at("attached_qp");
    std::string replayed_what;
    if (prior.is_array()) {
        PriorStateQueues prior_queues;
        prior_queues.shared_receive = &fixture.queue;
        prior_queues.qpn = static_cast<std::uint32_t>(number(qp.at("qp_num")));
        prior_queues.user_index = static_cast<std::uint32_t>(number(qp.at("user_index")));
        BeforeCaptureReplay replay(prior_queues);
        if (std::optional<CaseResult> result = replay.replay(prior)) return *result;
        replayed_what = "steps";
    } else {
        const std::optional<std::uint32_t> cycles =
            prior.is_string() ? parse_shared_receive_cycles(prior.get<std::string>()) : std::nullopt;
        if (!cycles.has_value()) return *unreproduced_value("inputs.before_capture", "not a form this tool replays");
        if (*cycles != 0) {
            constexpr std::uint32_t kCycleCqeCount = 64;
            std::vector<std::uint8_t> cq_buffer(static_cast<std::size_t>(kCycleCqeCount) * mlx5::kCqeSize64, 0);
            for (std::uint32_t i = 0; i < kCycleCqeCount; ++i) cq_buffer[(i + 1) * mlx5::kCqeSize64 - 1] = 0xf0;
            std::uint32_t cq_doorbell_record[2] = {0, 0};
            mlx5::CompletionQueueRing cq_ring;
            cq_ring.buffer = cq_buffer.data();
            cq_ring.cqe_count = kCycleCqeCount;
            cq_ring.cqe_size = mlx5::kCqeSize64;
            cq_ring.doorbell_record = cq_doorbell_record;
            mlx5::CompletionQueue completion_queue(cq_ring, 0);
            for (std::uint32_t cycle = 0; cycle < *cycles; ++cycle) {
                CaseResult result = run_shared_receive_cycle(fixture, completion_queue, cq_buffer, kCycleCqeCount,
                                                             static_cast<std::uint32_t>(number(qp.at("user_index"))),
                                                             static_cast<std::uint32_t>(number(qp.at("qp_num"))), cycle);
                if (result.kind != CaseResult::Kind::match) return result;
            }
            replayed_what = "cycles";
        }
    }
    if (!replayed_what.empty()) {
        // The replay must have left the SRQ where libmlx5's was when the capture began.
        const json& first = one_case.at("steps").at(0);
        const json* state = first.contains("srq_before") ? &first.at("srq_before")
                            : first.contains("state_before") ? &first.at("state_before").at("srq")
                                                             : nullptr;
        if (state == nullptr) return *unreproduced_value("inputs.before_capture", "the first step records no SRQ state to start from");
        // A poll's state records no counter; a post's does.
        if (fixture.queue.head() != number(state->at("head")) || fixture.queue.tail() != number(state->at("tail")) ||
            (state->contains("counter") && fixture.queue.counter() != number(state->at("counter")))) {
            return CaseResult::mismatch("in the SRQ head/tail/counter after the before-capture " + replayed_what);
        }
        const json& links = first.contains("srq_links_before") ? first.at("srq_links_before")
                                                                : first.at("state_before").at("srq_links");
        std::string difference = compare_srq_links(fixture.queue, links);
        if (!difference.empty()) return CaseResult::mismatch(difference + " after the before-capture " + replayed_what);
    }
    // The vectors' polls name no CQ; a 64-entry CQ of the entries' size stands in (only the
    // owner-bit parity depends on it, and every index here is far below 64).
    for (const json& step : one_case.at("steps")) {
        CaseResult result;
        if (step.at("op") == "ibv_post_srq_recv") {
            result = check_shared_receive_post(fixture, step);
        } else {
            json cq = {{"ncqe", 64}, {"cqe_size", step.at("cqes_written").at(0).at("cqe_size")}, {"cqn", 0}};
            PollQueues queues;
            queues.shared_receive = &fixture.queue;
            queues.qp_a_user_index = static_cast<std::uint32_t>(number(inputs.at("attached_qp").at("user_index")));
            queues.qp_b_user_index = 0xffffffff;
            result = check_poll(cq, step, queues);
        }
        if (result.kind != CaseResult::Kind::match) return result;
    }
    return CaseResult::matched();
}

}  // namespace

CaseResult check_receive_case(const json& one_case) {
    const std::string kind = one_case.at("kind").get<std::string>();
    if (kind == "recv_wqe") return check_receive_wqe(one_case);
    if (kind == "srq_wqe") return check_shared_receive_wqe(one_case);
    if (kind == "cqe") return check_completion_case(one_case);
    return CaseResult::unsupported("unknown case kind " + kind);
}

}  // namespace rdmachan::golden
