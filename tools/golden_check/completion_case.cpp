// Replays the cqe kind of recv-vectors.json: QP A's send queue, receive queue or SRQ and QP B's
// receive queue rebuilt from the setup (really posting its work requests, receives completed by
// emulation before it, pre-polled completions), then the capture's poll (completion_cases.cpp).
#include <algorithm>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "tools/golden_check/completion_check.hpp"
#include "tools/golden_check/hex.hpp"
#include "tools/golden_check/input_fields.hpp"
#include "tools/golden_check/request_lists.hpp"
#include "tools/golden_check/shared_receive_fixture.hpp"
#include "tools/golden_check/verbs_names.hpp"
#include "transport/mlx5/send_queue.hpp"

namespace rdmachan::golden {
namespace {

namespace mlx5 = rdmachan::mlx5;
using nlohmann::json;

// CheckOptions::scatter_to_cqe: memory of our own in place of the capture's buffer addresses,
// which the poller writes into when it unpacks a CQE's data.
struct ScratchMemory {
    std::vector<std::uint8_t> bytes = std::vector<std::uint8_t>(std::size_t{1} << 16);
    std::size_t used = 0;
    // Points `element` at unused scratch bytes of its length; false when they are used up.
    bool place(mlx5::ScatterGatherElement& element) {
        const std::size_t length = (static_cast<std::size_t>(element.length) + 63) & ~std::size_t{63};
        if (used + length > bytes.size()) return false;
        element.addr = reinterpret_cast<std::uintptr_t>(bytes.data() + used);
        used += length;
        return true;
    }
};

const char* const kScratchTooSmall = "a work request's buffers are larger than the checker's scratch memory (--scatter-to-cqe)";

// The inputs this kind reproduces (marked as in receive_cases.cpp: "checked", "layout").
const ReproducedFields kCompletionFields = {
    "inputs.cq.cqn", "inputs.cq.ncqe", "inputs.cq.cqe_size",
    "inputs.cq.ibv_cq.cqe",                  // checked: ncqe - 1
    "inputs.cq.cqe_version",                 // checked: 1
    "inputs.qp_a.qp_num", "inputs.qp_a.user_index", "inputs.qp_a.sq_wqe_cnt", "inputs.qp_a.srq",
    "inputs.qp_a.qp_type",                   // checked: IBV_QPT_RC
    "inputs.qp_a.rq.wqe_cnt", "inputs.qp_a.rq.stride_bytes",
    "inputs.qp_a.rq.qp_num", "inputs.qp_a.rq.user_index",      // the same QP as qp_a
    "inputs.qp_a.rq.wqe_shift", "inputs.qp_a.rq.max_gs", "inputs.qp_a.rq.max_post",
    "inputs.qp_a.rq.qp_state_max_gs", "inputs.qp_a.rq.wq_sig",  // checked: 0
    "inputs.qp_a.rq.head", "inputs.qp_a.rq.tail",  // receives completed before the setup, if any
    "inputs.qp_a.rq.rq_offset_in_qp_buf", "inputs.qp_a.rq.sq_offset_in_qp_buf",  // layout
    "inputs.qp_b.qp_num", "inputs.qp_b.user_index",
    "inputs.qp_b.rq.wqe_cnt", "inputs.qp_b.rq.stride_bytes",  // QP B's ring, when recorded
    "inputs.srq_after_create.*",
    "inputs.setup.pre_polled_cqes",          // replayed: receive completions polled first
    "inputs.setup.unsignaled_rdma_write_fillers", "inputs.setup.send_wrs[].*", "inputs.setup.recv_wrs[].*",
    "inputs.setup.posted_to",                // checked: agrees with qp_a.srq
    "inputs.setup.rq_completions_emulated_before",
    // QP B's receives, when listed with their wr_ids and SGEs. A bare count (the other form of
    // inputs.setup.qp_b_recv_wrs) names no wr_ids, so it cannot be rebuilt and stays unlisted.
    "inputs.setup.qp_b_recv_wrs[].*",
};

// Receives posted and completed by emulation (rq.tail = rq.head), as many per round as the
// ring holds; their WQEs stay in the ring as libmlx5's did.
std::optional<CaseResult> post_completed_fillers(mlx5::ReceiveQueue& queue, std::uint32_t count) {
    mlx5::ScatterGatherElement element{0x00007f1122334450, 64, 0x0a0b0c0d};
    std::vector<mlx5::ReceiveWorkRequest> requests(queue.ring().wqe_count);
    for (std::uint32_t posted = 0; posted < count;) {
        const std::uint32_t batch = std::min<std::uint32_t>(queue.ring().wqe_count, count - posted);
        for (std::uint32_t i = 0; i < batch; ++i) {
            requests[i].wr_id = 0xe0000000u + posted + i;
            requests[i].num_sge = 1;
            requests[i].sg_list = &element;
        }
        if (queue.post(requests.data(), batch, nullptr) != mlx5::PostResult::ok) {
            return CaseResult::mismatch("a receive completed before the setup (inputs.setup."
                                        "rq_completions_emulated_before) was refused");
        }
        queue.set_counters(queue.head(), queue.head());
        posted += batch;
    }
    return std::nullopt;
}

// QP B's receive queue: the geometry in inputs.qp_b.rq when recorded, else the smallest ring in
// which no slot is used twice. A completion finds its receive by the counter modulo the ring, so
// with every receive QP B ever had in its own slot, any larger ring (QP B's real one) answers
// the same.
struct SecondReceiveQueue {
    ReceiveRequests requests;
    std::vector<std::uint8_t> buffer;
    std::uint32_t doorbell_record[2] = {0, 0};
    std::vector<std::uint64_t> wr_ids;
    mlx5::ReceiveQueue queue;
    bool posted = false;

    SecondReceiveQueue(const json& qp_b, const json& wr_list) : requests(receive_requests(wr_list)) {
        std::uint32_t max_sge = 1;
        for (const mlx5::ReceiveWorkRequest& request : requests.requests) max_sge = std::max(max_sge, request.num_sge);
        std::uint32_t wqe_count = 1;
        while (wqe_count < requests.requests.size()) wqe_count *= 2;
        std::uint32_t stride = 16;
        while (stride < 16 * max_sge) stride *= 2;
        if (qp_b.contains("rq")) {
            wqe_count = static_cast<std::uint32_t>(number(qp_b.at("rq").at("wqe_cnt")));
            stride = static_cast<std::uint32_t>(number(qp_b.at("rq").at("stride_bytes")));
        }
        buffer.assign(static_cast<std::size_t>(wqe_count) * stride, 0);
        wr_ids.assign(wqe_count, 0);
        queue = mlx5::ReceiveQueue({buffer.data(), wqe_count, stride, doorbell_record}, wr_ids.data(), {});
        posted = queue.post(requests.requests.data(), static_cast<std::uint32_t>(requests.requests.size()), nullptr) ==
                 mlx5::PostResult::ok;
    }
    SecondReceiveQueue(const SecondReceiveQueue&) = delete;
    SecondReceiveQueue& operator=(const SecondReceiveQueue&) = delete;
};

mlx5::SendOpcode send_opcode(const std::string& name) {
    const std::optional<mlx5::SendOpcode> opcode = send_opcode_from_name(name);
    if (!opcode.has_value()) throw std::runtime_error("unsupported send opcode " + name);
    return *opcode;
}

}  // namespace

CaseResult check_completion_case(const json& one_case) {
    if (std::optional<CaseResult> missing = unreproduced(one_case, kCompletionFields)) return *missing;
    const json& inputs = one_case.at("inputs");
    const json& setup = inputs.at("setup");
    const json& qp_a = inputs.at("qp_a");
    const json& outputs = one_case.at("outputs");
    const json& cq = inputs.at("cq");
    if (number(cq.at("cqe_version")) != 1) return *unreproduced_value("inputs.cq.cqe_version", "only version 1 is decoded");
    if (number(cq.at("ncqe")) != number(cq.at("ibv_cq.cqe")) + 1) {
        return *unreproduced_value("inputs.cq.ibv_cq.cqe", "it is not ncqe - 1");
    }
    if (qp_a.at("qp_type") != "IBV_QPT_RC") return *unreproduced_value("inputs.qp_a.qp_type", "only RC QPs are modelled");
    const json& rq_geometry = qp_a.at("rq");
    // QP A's receive queue before the setup: fresh, or all its earlier receives completed (the
    // harness's rq.tail = rq.head), recorded here, as rq_completions_emulated_before, or both.
    const std::uint32_t recorded_head = static_cast<std::uint32_t>(number_or(rq_geometry, "head", 0));
    const std::uint32_t recorded_tail = static_cast<std::uint32_t>(number_or(rq_geometry, "tail", 0));
    const std::uint32_t emulated = static_cast<std::uint32_t>(number(setup.at("rq_completions_emulated_before")));
    if (recorded_head != recorded_tail) {
        return *unreproduced_value("inputs.qp_a.rq.head", "receives outstanding before the setup are not listed");
    }
    if (recorded_head != 0 && emulated != 0 && recorded_head != emulated) {
        return *unreproduced_value("inputs.qp_a.rq.head", "it disagrees with inputs.setup.rq_completions_emulated_before");
    }
    const std::uint32_t completed_before = std::max(recorded_head, emulated);
    if (number_or(rq_geometry, "wq_sig", 0) != 0) return *unreproduced_value("inputs.qp_a.rq.wq_sig", "not modelled for polls");
    const bool to_shared_receive = qp_a.at("srq").get<bool>();
    if (setup.contains("posted_to") && setup.at("posted_to").is_string() &&
        (setup.at("posted_to") == "SRQ") != to_shared_receive) {
        return *unreproduced_value("inputs.setup.posted_to", "it disagrees with qp_a.srq");
    }

    // QP A's send queue, filled by really posting the setup's work requests.
    const std::uint32_t send_wqe_count = static_cast<std::uint32_t>(number(qp_a.at("sq_wqe_cnt")));
    std::vector<std::uint8_t> send_buffer(static_cast<std::size_t>(send_wqe_count) * mlx5::kSendWqeBasicBlockSize);
    std::vector<std::uint8_t> registers(1024);
    std::uint32_t send_doorbell_record[2] = {0, 0};
    std::vector<std::uint64_t> send_wr_ids(send_wqe_count);
    std::vector<std::uint32_t> send_wqe_ends(send_wqe_count);
    mlx5::SendQueueRing send_ring{send_buffer.data(), send_wqe_count, static_cast<std::uint32_t>(number(qp_a.at("qp_num"))),
                                  send_doorbell_record, registers.data(), 256};
    // The UMR record the encoder fills for LOCAL_INV and key configurations (libmlx5 sq.wr_data).
    std::vector<std::uint8_t> send_umr_opcodes(send_wr_ids.size());
    mlx5::SendQueueTracking tracking{send_wr_ids.data(), send_wqe_ends.data(), 0, 0,
                                     send_umr_opcodes.data()};
    mlx5::SendQueueConfig send_config;
    send_config.max_sge = 4;
    send_config.max_inline_data = 256;
    mlx5::SendQueue send_queue(send_ring, tracking, send_config);
    const bool scatter_to_cqe = check_options().scatter_to_cqe;
    ScratchMemory scratch;
    PollQueues queues;
    mlx5::ScatterGatherElement filler_element{0x00007f1122334450, 64, 0x0a0b0c0d};
    for (std::uint64_t i = 0; i < number(setup.at("unsignaled_rdma_write_fillers")); ++i) {
        mlx5::SendWorkRequest filler;
        filler.opcode = mlx5::SendOpcode::rdma_write;
        filler.sg_list = &filler_element;
        filler.num_sge = 1;
        if (send_queue.post(&filler, 1, nullptr) != mlx5::PostResult::ok) return CaseResult::mismatch("a filler write was refused");
    }
    for (const json& wr : setup.at("send_wrs")) {
        mlx5::ScatterGatherElement element{number(wr.at("sge").at("addr")),
                                           static_cast<std::uint32_t>(number(wr.at("sge").at("length"))),
                                           static_cast<std::uint32_t>(number(wr.at("sge").at("lkey")))};
        if (scatter_to_cqe) {
            if (!scratch.place(element)) return CaseResult::unsupported(kScratchTooSmall);
            queues.send_buffers[number(wr.at("wr_id"))] = {element};
        }
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

    queues.send = &send_queue.tracking();
    queues.scatter_to_cqe = scatter_to_cqe;
    queues.send_ring = send_buffer.data();
    queues.scratch = &scratch.bytes;
    queues.send_wqe_count = send_wqe_count;
    queues.qp_a_user_index = static_cast<std::uint32_t>(number(qp_a.at("user_index")));
    queues.qp_b_user_index = static_cast<std::uint32_t>(number(inputs.at("qp_b").at("user_index")));
    queues.qp_a_qpn = static_cast<std::uint32_t>(number(qp_a.at("qp_num")));
    queues.pre_polled = static_cast<std::uint32_t>(number(setup.at("pre_polled_cqes")));

    // QP B's receives, when the setup lists them: really posted to a receive queue of its own.
    std::optional<SecondReceiveQueue> qp_b_receive;
    if (setup.contains("qp_b_recv_wrs") && setup.at("qp_b_recv_wrs").is_array() && !setup.at("qp_b_recv_wrs").empty()) {
        if (scatter_to_cqe) return *unreproduced_value("inputs.setup.qp_b_recv_wrs", "with --scatter-to-cqe");
        qp_b_receive.emplace(inputs.at("qp_b"), setup.at("qp_b_recv_wrs"));
        if (!qp_b_receive->posted) return CaseResult::mismatch("a setup receive of QP B was refused");
        queues.receive_b = &qp_b_receive->queue;
    }

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
    if (scatter_to_cqe) {
        for (std::size_t i = 0; i < receives.requests.size(); ++i) {
            for (mlx5::ScatterGatherElement& element : receives.elements[i]) {
                if (!scratch.place(element)) return CaseResult::unsupported(kScratchTooSmall);
            }
            queues.receive_buffers[receives.requests[i].wr_id] = receives.elements[i];
        }
    }
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
        // The SRQ indices the setup's receives take: the free list from its head.
        for (std::uint32_t i = 0, index = shared_receive->queue.head(); i < receives.requests.size(); ++i) {
            queues.shared_receive_posted.push_back(index);
            index = mlx5::load_big16(shared_receive->buffer.data() +
                                     static_cast<std::size_t>(index) * shared_receive->queue.ring().stride +
                                     mlx5::kSrqNextWqeIndex);
        }
        if (!receives.requests.empty() &&
            shared_receive->queue.post(receives.requests.data(), static_cast<std::uint32_t>(receives.requests.size()),
                                       nullptr) != mlx5::PostResult::ok) {
            return CaseResult::mismatch("a setup SRQ receive was refused");
        }
        queues.shared_receive = &shared_receive->queue;
        if (completed_before != 0) {
            return *unreproduced_value("inputs.setup.rq_completions_emulated_before", "QP A receives from an SRQ");
        }
        return check_poll(inputs.at("cq"), outputs, queues);
    }
    // The harness completes receives by rq.tail = rq.head: those completed before the setup were
    // posted first, so they moved the head as much as the tail (and the setup's receives start
    // that far into the ring).
    if (std::optional<CaseResult> refused = post_completed_fillers(receive_queue, completed_before)) return *refused;
    if (!receives.requests.empty() &&
        receive_queue.post(receives.requests.data(), static_cast<std::uint32_t>(receives.requests.size()), nullptr) !=
            mlx5::PostResult::ok) {
        return CaseResult::mismatch("a setup receive was refused");
    }
    queues.receive = &receive_queue;
    return check_poll(inputs.at("cq"), outputs, queues);
}

}  // namespace rdmachan::golden
