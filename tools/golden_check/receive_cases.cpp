// Replays recv-vectors.json: receive-queue posts (recv_wqe), SRQ posts and polls (srq_wqe) and
// CQE decoding (cqe), through the project's ReceiveQueue, SharedReceiveQueue, SendQueue and
// CompletionQueue, comparing only what libmlx5 v44 wrote.
#include <algorithm>
#include <cerrno>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/golden_check/completion_check.hpp"
#include "tools/golden_check/hex.hpp"
#include "tools/golden_check/verbs_names.hpp"
#include "transport/mlx5/send_queue.hpp"

namespace rdmachan::golden {
namespace {

namespace mlx5 = rdmachan::mlx5;
using nlohmann::json;

constexpr std::uint8_t kPoison = 0xa5;
constexpr std::uint32_t kDoorbellRecordPoison = 0xdeadbeef;

struct ReceiveRequests {
    std::vector<mlx5::ReceiveWorkRequest> requests;
    std::vector<std::vector<mlx5::ScatterGatherElement>> elements;
};

ReceiveRequests receive_requests(const json& wr_list) {
    ReceiveRequests result;
    result.elements.reserve(wr_list.size());
    for (const json& wr : wr_list) {
        std::vector<mlx5::ScatterGatherElement> elements;
        for (const json& element : wr.at("sg_list")) {
            elements.push_back({number(element.at("addr")), static_cast<std::uint32_t>(number(element.at("length"))),
                                static_cast<std::uint32_t>(number(element.at("lkey")))});
        }
        result.elements.push_back(std::move(elements));
        mlx5::ReceiveWorkRequest request;
        request.wr_id = number(wr.at("wr_id"));
        request.num_sge = static_cast<std::uint32_t>(number(wr.at("num_sge")));
        request.sg_list = result.elements.back().data();
        result.requests.push_back(request);
    }
    return result;
}

int errno_of(mlx5::PostResult result) {
    switch (result) {
        case mlx5::PostResult::ok: return 0;
        case mlx5::PostResult::queue_full: return ENOMEM;
        default: return EINVAL;
    }
}

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
    if (static_cast<std::uint64_t>(errno_of(result)) != number(outputs.at("return_code"))) {
        return CaseResult::mismatch("in the return code: libmlx5 " + outputs.at("return_code").dump() + ", ours " +
                                    std::to_string(errno_of(result)));
    }
    if (outputs.contains("bad_wr_index") && !outputs.at("bad_wr_index").is_null() &&
        number(outputs.at("bad_wr_index")) != posted) {
        return CaseResult::mismatch("in bad_wr_index: libmlx5 " + outputs.at("bad_wr_index").dump() + ", ours " +
                                    std::to_string(posted));
    }
    return CaseResult::matched();
}

CaseResult check_receive_wqe(const json& one_case) {
    const json& before = one_case.at("inputs").at("rq_before");
    const json& outputs = one_case.at("outputs");
    if (static_cast<long long>(number_or(before, "qp_state_max_gs", 0)) < 0 ||
        before.at("qp_state_max_gs").get<long long>() < 0) {
        return CaseResult::unsupported("the QP's state is checked by the control plane, which never posts receives to a "
                                       "QP in RESET; the ring has no state to refuse with");
    }
    const std::uint32_t wqe_count = static_cast<std::uint32_t>(number(before.at("wqe_cnt")));
    const std::uint32_t stride = static_cast<std::uint32_t>(number(before.at("stride_bytes")));
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
    queue.set_counters(static_cast<std::uint32_t>(number(before.at("head"))),
                       static_cast<std::uint32_t>(number(before.at("tail"))));

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
        if (!touched[i] && buffer[i] != kPoison) return CaseResult::mismatch("at ring byte " + std::to_string(i) + ": written outside the posted WQEs");
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
    } else if (receive_record != kDoorbellRecordPoison) {
        return CaseResult::mismatch("the receive doorbell record was written where libmlx5 wrote none");
    }
    if (doorbell_record[mlx5::kSendDoorbell] != kDoorbellRecordPoison) return CaseResult::mismatch("the send doorbell record was written");
    return CaseResult::matched();
}

// An SRQ laid out as the case's creation left it: poisoned WQEs with their next-segment links.
struct SharedReceiveQueueFixture {
    std::vector<std::uint8_t> buffer;
    std::uint32_t doorbell_record = kDoorbellRecordPoison;
    std::vector<std::uint64_t> wr_ids;
    mlx5::SharedReceiveQueue queue;

    SharedReceiveQueueFixture(const json& created, const json& links) {
        const std::uint32_t wqe_count = static_cast<std::uint32_t>(number(created.at("max")));
        const std::uint32_t stride = static_cast<std::uint32_t>(number(created.at("stride_bytes")));
        buffer.assign(static_cast<std::size_t>(wqe_count) * stride, kPoison);
        wr_ids.assign(wqe_count, 0);
        for (std::uint32_t i = 0; i < wqe_count; ++i) {
            mlx5::store_big16(buffer.data() + static_cast<std::size_t>(i) * stride + mlx5::kSrqNextWqeIndex,
                              static_cast<std::uint16_t>(number(links[i])));
        }
        mlx5::SharedReceiveQueueRing ring{buffer.data(), wqe_count, stride,
                                          static_cast<std::uint32_t>(number(created.at("srqn"))), &doorbell_record};
        queue = mlx5::SharedReceiveQueue(ring, wr_ids.data(), static_cast<std::uint32_t>(number(created.at("head"))),
                                         static_cast<std::uint32_t>(number(created.at("tail"))));
        queue.set_counter(static_cast<std::uint16_t>(number(created.at("counter"))));
    }
};

CaseResult check_shared_receive_post(SharedReceiveQueueFixture& fixture, const json& step) {
    std::vector<std::uint8_t> before = fixture.buffer;
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
    if (mask[0] != 0xff && fixture.doorbell_record != kDoorbellRecordPoison) {
        return CaseResult::mismatch("the SRQ doorbell record was written where libmlx5 wrote none");
    }
    return CaseResult::matched();
}

CaseResult check_shared_receive_wqe(const json& one_case) {
    const json& inputs = one_case.at("inputs");
    SharedReceiveQueueFixture fixture(inputs.at("srq_after_create"), inputs.at("srq_links_after_create"));
    if (fixture.queue.max_sge() != number(inputs.at("srq_after_create").at("max_gs"))) {
        return CaseResult::mismatch("in max_gs derived from the SRQ stride");
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

mlx5::SendOpcode send_opcode(const std::string& name) {
    const std::optional<mlx5::SendOpcode> opcode = send_opcode_from_name(name);
    if (!opcode.has_value()) throw std::runtime_error("unsupported send opcode " + name);
    return *opcode;
}

CaseResult check_completion_case(const json& one_case) {
    const json& inputs = one_case.at("inputs");
    const json& setup = inputs.at("setup");
    const json& qp_a = inputs.at("qp_a");
    const json& outputs = one_case.at("outputs");

    // QP A's send queue, filled by really posting the setup's work requests.
    const std::uint32_t send_wqe_count = static_cast<std::uint32_t>(number(qp_a.at("sq_wqe_cnt")));
    std::vector<std::uint8_t> send_buffer(static_cast<std::size_t>(send_wqe_count) * mlx5::kSendWqeBasicBlockSize);
    std::vector<std::uint8_t> registers(1024);
    std::uint32_t send_doorbell_record[2] = {0, 0};
    std::vector<std::uint64_t> send_wr_ids(send_wqe_count);
    std::vector<std::uint32_t> send_wqe_ends(send_wqe_count);
    mlx5::SendQueueRing send_ring{send_buffer.data(), send_wqe_count, static_cast<std::uint32_t>(number(qp_a.at("qp_num"))),
                                  send_doorbell_record, registers.data(), 256};
    mlx5::SendQueueTracking tracking{send_wr_ids.data(), send_wqe_ends.data(), 0, 0};
    mlx5::SendQueueConfig send_config;
    send_config.max_sge = 4;
    send_config.max_inline_data = 256;
    mlx5::SendQueue send_queue(send_ring, tracking, send_config);
    mlx5::ScatterGatherElement filler_element{0x00007f1122334450, 64, 0x0a0b0c0d};
    for (std::uint64_t i = 0; i < number(setup.at("unsignaled_rdma_write_fillers")); ++i) {
        mlx5::SendWorkRequest filler;
        filler.opcode = mlx5::SendOpcode::rdma_write;
        filler.sg_list = &filler_element;
        filler.num_sge = 1;
        if (send_queue.post(&filler, 1, nullptr) != mlx5::PostResult::ok) return CaseResult::mismatch("a filler write was refused");
    }
    for (const json& wr : setup.at("send_wrs")) {
        if (wr.at("opcode") == "IBV_WR_LOCAL_INV") {
            return CaseResult::unsupported("LOCAL_INV (a UMR WQE) is not posted by the encoder");
        }
        mlx5::ScatterGatherElement element{number(wr.at("sge").at("addr")),
                                           static_cast<std::uint32_t>(number(wr.at("sge").at("length"))),
                                           static_cast<std::uint32_t>(number(wr.at("sge").at("lkey")))};
        mlx5::SendWorkRequest request;
        request.wr_id = number(wr.at("wr_id"));
        request.opcode = send_opcode(wr.at("opcode").get<std::string>());
        request.flags = (number(wr.at("send_flags")) & 0x2) != 0 ? std::uint32_t{mlx5::kSendSignaled} : 0u;
        request.sg_list = &element;
        request.num_sge = 1;
        if (send_queue.tracking().producer_index != number(wr.at("wqe_index"))) {
            return CaseResult::mismatch("the setup's send WR " + wr.at("wr_id").get<std::string>() +
                                        " landed at another WQE index than libmlx5's");
        }
        if (send_queue.post(&request, 1, nullptr) != mlx5::PostResult::ok) return CaseResult::mismatch("a setup send was refused");
    }

    PollQueues queues;
    queues.send = &send_queue.tracking();
    queues.send_wqe_count = send_wqe_count;
    queues.qp_a_user_index = static_cast<std::uint32_t>(number(qp_a.at("user_index")));
    queues.qp_b_user_index = static_cast<std::uint32_t>(number(inputs.at("qp_b").at("user_index")));

    // QP A's receive queue or the SRQ, with the setup's receives really posted.
    const json& rq = qp_a.at("rq");
    const std::uint32_t receive_wqe_count = std::max<std::uint32_t>(1, static_cast<std::uint32_t>(number(rq.at("wqe_cnt"))));
    const std::uint32_t receive_stride = std::max<std::uint32_t>(16, static_cast<std::uint32_t>(number(rq.at("stride_bytes"))));
    std::vector<std::uint8_t> receive_buffer(static_cast<std::size_t>(receive_wqe_count) * receive_stride);
    std::uint32_t receive_doorbell_record[2] = {0, 0};
    std::vector<std::uint64_t> receive_wr_ids(receive_wqe_count);
    mlx5::ReceiveQueue receive_queue({receive_buffer.data(), receive_wqe_count, receive_stride, receive_doorbell_record},
                                     receive_wr_ids.data(), {});
    std::unique_ptr<SharedReceiveQueueFixture> shared_receive;
    ReceiveRequests receives = receive_requests(setup.at("recv_wrs"));
    if (qp_a.at("srq").get<bool>()) {
        // mlx5_create_srq links the free list 0→1→…→tail and the wait queue after it, each
        // ending in 0; the cqe cases record only the resulting head/tail.
        const json& created = inputs.at("srq_after_create");
        const std::uint64_t count = number(created.at("max"));
        json links = json::array();
        for (std::uint64_t i = 0; i < count; ++i) {
            links.push_back(i == number(created.at("tail")) || i + 1 == count ? 0 : i + 1);
        }
        shared_receive = std::make_unique<SharedReceiveQueueFixture>(created, links);
        if (!receives.requests.empty() &&
            shared_receive->queue.post(receives.requests.data(), static_cast<std::uint32_t>(receives.requests.size()),
                                       nullptr) != mlx5::PostResult::ok) {
            return CaseResult::mismatch("a setup SRQ receive was refused");
        }
        queues.shared_receive = &shared_receive->queue;
        return check_poll(inputs.at("cq"), outputs, queues);
    }
    if (!receives.requests.empty() &&
        receive_queue.post(receives.requests.data(), static_cast<std::uint32_t>(receives.requests.size()), nullptr) !=
            mlx5::PostResult::ok) {
        return CaseResult::mismatch("a setup receive was refused");
    }
    const std::uint32_t emulated = static_cast<std::uint32_t>(number(setup.at("rq_completions_emulated_before")));
    receive_queue.set_counters(receive_queue.head(), receive_queue.tail() + emulated);
    queues.receive = &receive_queue;
    return check_poll(inputs.at("cq"), outputs, queues);
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
