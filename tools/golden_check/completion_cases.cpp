// Replays the polls of recv-vectors.json (libmlx5 v44's mlx5_poll_cq_v1 on hand-written CQEs)
// through the project's CompletionQueue and compares the completions, the consumer index, the
// CQ doorbell record and the receive-queue / SRQ bookkeeping.
#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "tools/golden_check/completion_check.hpp"
#include "tools/golden_check/hex.hpp"
#include "transport/mlx5/inline_scatter.hpp"

namespace rdmachan::golden {
namespace {

namespace mlx5 = rdmachan::mlx5;
using nlohmann::json;

// ibv_wc_flags bits.
constexpr std::uint32_t kIbvWcGrh = 1;
constexpr std::uint32_t kIbvWcWithImmediate = 2;
constexpr std::uint32_t kIbvWcWithInvalidate = 8;

std::uint32_t verbs_flags(const mlx5::Completion& completion) {
    std::uint32_t flags = 0;
    if ((completion.flags & mlx5::kCompletionGrh) != 0) flags |= kIbvWcGrh;
    if ((completion.flags & mlx5::kCompletionWithImmediate) != 0) flags |= kIbvWcWithImmediate;
    if ((completion.flags & mlx5::kCompletionWithInvalidate) != 0) flags |= kIbvWcWithInvalidate;
    return flags;
}

// Compares the ibv_wc fields libmlx5 wrote (non-null in the vector) with our completion.
std::string compare_completion(const json& fields, const mlx5::Completion& completion, std::size_t index) {
    auto differs = [&](const char* field, std::uint64_t ours) -> std::string {
        if (!fields.contains(field) || fields.at(field).is_null()) return {};
        const std::uint64_t theirs = number(fields.at(field));
        if (theirs == ours) return {};
        return "in completion " + std::to_string(index) + " field " + field + ": libmlx5 " + std::to_string(theirs) +
               ", ours " + std::to_string(ours);
    };
    std::string difference;
    for (auto [field, ours] : std::initializer_list<std::pair<const char*, std::uint64_t>>{
             {"wr_id", completion.wr_id},
             {"status", static_cast<std::uint64_t>(completion.status)},
             {"opcode", static_cast<std::uint64_t>(completion.opcode)},
             {"vendor_err", completion.vendor_error},
             {"byte_len", completion.byte_len},
             {"qp_num", completion.qp_num},
             {"src_qp", completion.src_qp},
             {"wc_flags", verbs_flags(completion)},
             {"pkey_index", completion.pkey_index},
             {"slid", completion.slid},
             {"sl", completion.sl},
             {"dlid_path_bits", completion.dlid_path_bits}}) {
        difference = differs(field, ours);
        if (!difference.empty()) return difference;
    }
    if (fields.contains("imm_data_or_invalidated_rkey") && !fields.at("imm_data_or_invalidated_rkey").is_null()) {
        const json& immediate = fields.at("imm_data_or_invalidated_rkey");
        if ((completion.flags & mlx5::kCompletionWithInvalidate) != 0) {
            if (number(immediate.at("invalidated_rkey")) != completion.invalidated_rkey) {
                return "in completion " + std::to_string(index) + ": invalidated rkey differs";
            }
        } else if (number(immediate.at("imm_data_be32toh")) != completion.immediate) {
            return "in completion " + std::to_string(index) + ": immediate differs";
        }
    }
    return {};
}

// CheckOptions::scatter_to_cqe: the scratch memory after the poll holds exactly what the
// completions polled from CQEs carrying data put there: each CQE's data (its byte count, at most
// what its format holds) spread over the buffers of the work request the completion names, in
// order, up to the first with an invalid lkey (a successful completion, or a local length
// error, which libmlx5 also reports after copying what fits); every other byte untouched.
std::string compare_unpacked_data(const PollQueues& queues, const std::map<std::uint64_t, std::vector<std::uint8_t>>& entries,
                                  const mlx5::Completion* completions, std::uint32_t count, std::uint32_t cqe_size) {
    const std::vector<std::uint8_t>& scratch = *queues.scratch;
    std::vector<std::uint8_t> expected(scratch.size(), 0);
    auto entry = entries.begin();
    for (std::uint32_t i = 0; i < count && entry != entries.end(); ++i, ++entry) {
        const std::uint8_t* cqe64 = entry->second.data() + (cqe_size - mlx5::kCqeSize64);
        const std::uint8_t format = (cqe64[mlx5::kCqeOpOwn] >> 2) & 3;
        const mlx5::Completion& completion = completions[i];
        if (format != mlx5::kCqeFormatInlineScatter32 && format != mlx5::kCqeFormatInlineScatter64) continue;
        if (completion.status != mlx5::CompletionStatus::success &&
            completion.status != mlx5::CompletionStatus::local_length_error) {
            continue;
        }
        const std::uint8_t* data = mlx5::inline_scatter_data(cqe64, format, cqe_size);
        if (data == nullptr) continue;
        const std::uint32_t capacity =
            format == mlx5::kCqeFormatInlineScatter32 ? mlx5::kInlineScatterBytes : 2 * mlx5::kInlineScatterBytes;
        std::uint32_t size = std::min(mlx5::load_big32(cqe64 + mlx5::kCqeByteCount), capacity);
        const auto& buffers = completion.is_receive ? queues.receive_buffers : queues.send_buffers;
        const auto named = buffers.find(completion.wr_id);
        if (named == buffers.end()) {
            return "in completion " + std::to_string(i) + ": its wr_id names no work request the setup posted";
        }
        for (const mlx5::ScatterGatherElement& element : named->second) {
            if (size == 0 || element.lkey == mlx5::kInvalidLkey) break;
            const std::uint32_t copy = std::min(size, element.length);
            const std::size_t offset = static_cast<std::size_t>(element.addr - reinterpret_cast<std::uintptr_t>(scratch.data()));
            std::copy(data, data + copy, expected.begin() + static_cast<std::ptrdiff_t>(offset));
            data += copy;
            size -= copy;
        }
    }
    for (std::size_t offset = 0; offset < scratch.size(); ++offset) {
        if (scratch[offset] != expected[offset]) {
            return "in the bytes unpacked from CQEs into the work requests' buffers: scratch byte " + std::to_string(offset) +
                   " is " + std::to_string(scratch[offset]) + ", expected " + std::to_string(expected[offset]);
        }
    }
    return {};
}

}  // namespace

CaseResult check_poll(const json& cq, const json& outputs, PollQueues& queues) {
    const std::uint32_t cqe_count = static_cast<std::uint32_t>(number(cq.at("ncqe")));
    const std::uint32_t cqe_size = static_cast<std::uint32_t>(number(cq.at("cqe_size")));
    const std::uint32_t consumer_index = static_cast<std::uint32_t>(number(outputs.at("state_before").at("cq_cons_index")));
    const std::uint32_t ne = static_cast<std::uint32_t>(number(outputs.at("ne")));

    // A fresh CQ: every entry invalid and owned by hardware, as libmlx5 initialises it.
    std::vector<std::uint8_t> buffer(static_cast<std::size_t>(cqe_count) * cqe_size, 0);
    for (std::uint32_t i = 0; i < cqe_count; ++i) buffer[static_cast<std::size_t>(i) * cqe_size + cqe_size - 1] = 0xf0;
    std::uint32_t doorbell_record[2] = {0xdeadbeef, 0xdeadbeef};
    if (queues.pre_polled > consumer_index) {
        return CaseResult::unsupported("inputs.setup.pre_polled_cqes not reproduced: more than state_before.cq_cons_index");
    }

    mlx5::CompletionQueueRing ring;
    ring.buffer = buffer.data();
    ring.cqe_count = cqe_count;
    ring.cqe_size = cqe_size;
    ring.cqn = static_cast<std::uint32_t>(number(cq.at("cqn")));
    ring.doorbell_record = doorbell_record;
    mlx5::CompletionQueue completion_queue(ring, consumer_index - queues.pre_polled);

    mlx5::CompletionTarget qp_a;
    qp_a.send = queues.send;
    qp_a.send_wqe_count = queues.send_wqe_count;
    qp_a.receive = queues.receive;
    qp_a.shared_receive = queues.shared_receive;
    qp_a.scatter_to_cqe = queues.scatter_to_cqe;
    qp_a.send_ring = queues.scatter_to_cqe ? queues.send_ring : nullptr;
    mlx5::CompletionTarget qp_b;  // the second QP of the harness: its receive queue, if any
    qp_b.receive = queues.receive_b;
    auto resolve = [&](std::uint32_t, std::uint32_t user_index) {
        if (user_index == queues.qp_a_user_index) return &qp_a;
        if (user_index == queues.qp_b_user_index) return &qp_b;
        return static_cast<mlx5::CompletionTarget*>(nullptr);
    };

    // Receives completed before the capture: each a RESP_SEND CQE for QP A's oldest receive,
    // polled through our CompletionQueue as libmlx5 polled them.
    for (std::uint32_t i = 0; i < queues.pre_polled; ++i) {
        std::uint32_t wqe_counter = 0;
        if (queues.shared_receive != nullptr) {
            if (i >= queues.shared_receive_posted.size()) {
                // An SRQ CQE names its WQE by wqe_counter, and libmlx5 frees that WQE whatever
                // it is: with none posted left, the capture does not say which one was named.
                return CaseResult::unsupported("inputs.setup.pre_polled_cqes not reproduced: more than the SRQ receives "
                                               "posted, and the capture does not record which WQE the rest named");
            }
            wqe_counter = queues.shared_receive_posted[i];
        } else if (queues.receive != nullptr) {
            // Outstanding or not: handle_responder takes the slot at the tail and advances it.
            wqe_counter = queues.receive->tail();
        } else {
            return CaseResult::unsupported("inputs.setup.pre_polled_cqes not reproduced: QP A has no receive queue");
        }
        const std::uint32_t index = completion_queue.consumer_index();
        std::uint8_t* cqe = buffer.data() + static_cast<std::size_t>(index % cqe_count) * cqe_size + (cqe_size - mlx5::kCqeSize64);
        std::fill(cqe, cqe + mlx5::kCqeSize64, std::uint8_t{0});
        mlx5::store_big32(cqe + mlx5::kCqeSrqnUserIndex, queues.qp_a_user_index);
        mlx5::store_big32(cqe + mlx5::kCqeByteCount, 0x40);
        mlx5::store_big32(cqe + mlx5::kCqeSopDropQpn, queues.qp_a_qpn & 0xffffff);
        mlx5::store_big16(cqe + mlx5::kCqeWqeCounter, static_cast<std::uint16_t>(wqe_counter));
        cqe[mlx5::kCqeOpOwn] = static_cast<std::uint8_t>((mlx5::kCqeResponderSend << 4) | ((index / cqe_count) & 1));
        mlx5::Completion completion;
        if (completion_queue.poll(&completion, 1, resolve) != 1 || completion.status != mlx5::CompletionStatus::success) {
            return CaseResult::mismatch("a pre-polled receive completion (inputs.setup.pre_polled_cqes) was not delivered");
        }
    }

    // The state libmlx5 had when the capture began must be the one we rebuilt from the inputs.
    const json& before = outputs.at("state_before");
    if (completion_queue.consumer_index() != consumer_index) {
        return CaseResult::mismatch("in the consumer index before the capture");
    }
    if (queues.receive != nullptr && before.contains("qp_a_rq") &&
        (queues.receive->head() != number(before.at("qp_a_rq").at("head")) ||
         queues.receive->tail() != number(before.at("qp_a_rq").at("tail")))) {
        return CaseResult::mismatch("in the receive queue head/tail before the capture: libmlx5 " +
                                    before.at("qp_a_rq").dump() + ", ours " + std::to_string(queues.receive->head()) +
                                    "/" + std::to_string(queues.receive->tail()));
    }
    if (queues.receive_b != nullptr && before.contains("qp_b_rq") &&
        (queues.receive_b->head() != number(before.at("qp_b_rq").at("head")) ||
         queues.receive_b->tail() != number(before.at("qp_b_rq").at("tail")))) {
        return CaseResult::mismatch("in QP B's receive queue head/tail before the capture: libmlx5 " +
                                    before.at("qp_b_rq").dump() + ", ours " + std::to_string(queues.receive_b->head()) +
                                    "/" + std::to_string(queues.receive_b->tail()));
    }
    if (queues.send != nullptr && before.contains("qp_a_sq") &&
        queues.send->producer_index != number(before.at("qp_a_sq").at("cur_post"))) {
        return CaseResult::mismatch("in the send queue's cur_post before the capture");
    }
    if (queues.shared_receive != nullptr && before.contains("srq")) {
        const json& srq = before.at("srq");
        if (queues.shared_receive->head() != number(srq.at("head")) || queues.shared_receive->tail() != number(srq.at("tail"))) {
            return CaseResult::mismatch("in the SRQ head/tail before the capture");
        }
        std::string difference = compare_srq_links(*queues.shared_receive, before.at("srq_links"));
        if (!difference.empty()) return CaseResult::mismatch(difference + " before the capture");
    }

    // Deliberate differences are found from the CQE bytes, never from the case's name.
    std::uint32_t in_order_receive = queues.receive != nullptr ? queues.receive->tail() : 0;
    std::uint32_t in_order_receive_b = queues.receive_b != nullptr ? queues.receive_b->tail() : 0;
    std::map<std::uint64_t, std::vector<std::uint8_t>> polled_entries;  // the entries the poll reads, by cq_index
    for (const json& written : outputs.at("cqes_written")) {
        const std::vector<std::uint8_t> entry = bytes_from_hex(written.at("entry_hex").get<std::string>());
        const std::size_t slot = static_cast<std::size_t>(number(written.at("slot")));
        std::copy(entry.begin(), entry.end(), buffer.begin() + slot * cqe_size);
        if (number(written.at("cq_index")) < consumer_index) continue;
        polled_entries[number(written.at("cq_index"))] = entry;
        const std::uint8_t* cqe64 = entry.data() + (cqe_size - mlx5::kCqeSize64);
        const std::uint8_t opcode = cqe64[mlx5::kCqeOpOwn] >> 4;
        const std::uint8_t format = (cqe64[mlx5::kCqeOpOwn] >> 2) & 3;
        const std::uint32_t user_index = mlx5::load_big32(cqe64 + mlx5::kCqeSrqnUserIndex) & 0xffffff;
        if (opcode == mlx5::kCqeInvalid) continue;
        if (format == mlx5::kCqeFormatCompressed && opcode <= mlx5::kCqeResponderSendInvalidate && queues.scatter_to_cqe) {
            return CaseResult::unsupported(
                "differs on purpose — format 3 is a compressed CQE, which libmlx5 v44 unpacks as inline scatter; on a CQ "
                "created without compression it is reported as a local QP operation error");
        }
        if (format != 0 && opcode <= mlx5::kCqeResponderSendInvalidate && !queues.scatter_to_cqe) {
            return CaseResult::unsupported(
                "differs on purpose — scatter-to-CQE is disabled when our QPs are created "
                "(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE); a CQE in format " +
                std::to_string(format) + " is reported as a local QP operation error, not unpacked");
        }
        if (opcode == mlx5::kCqeResize || opcode == mlx5::kCqeNoPacket) {
            return CaseResult::unsupported("differs on purpose — a resize or no-packet CQE completes none of our work "
                                           "requests: consumed and reported as a general error");
        }
        if (user_index != queues.qp_a_user_index && user_index != queues.qp_b_user_index) {
            return CaseResult::unsupported("differs on purpose — a CQE for an unknown QP is consumed and reported as a "
                                           "general-error completion naming its QPN, instead of failing the poll");
        }
        if (opcode == mlx5::kCqeResponderError && cqe64[mlx5::kCqeSyndrome] == mlx5::kSyndromeRemoteAborted &&
            cqe64[mlx5::kCqeVendorSyndrome] == 0x93) {
            return CaseResult::unsupported("on-demand paging page faults are not handled: rdmachan registers no ODP memory");
        }
        const bool responder = (opcode >= mlx5::kCqeResponderWriteImmediate && opcode <= mlx5::kCqeResponderSendInvalidate) ||
                               opcode == mlx5::kCqeResponderError;
        // Each QP's receive queue, as libmlx5 v44 consumes it: in order.
        mlx5::ReceiveQueue* receive = nullptr;
        std::uint32_t* in_order = nullptr;
        if (user_index == queues.qp_a_user_index && queues.shared_receive == nullptr) {
            receive = queues.receive;
            in_order = &in_order_receive;
        } else if (user_index == queues.qp_b_user_index) {
            receive = queues.receive_b;
            in_order = &in_order_receive_b;
        }
        if (responder && receive != nullptr) {
            const std::uint16_t wqe_counter = mlx5::load_big16(cqe64 + mlx5::kCqeWqeCounter);
            const std::uint32_t mask = receive->ring().wqe_count - 1;
            if ((wqe_counter & mask) != (*in_order & mask)) {
                return CaseResult::unsupported("differs on purpose — a receive completion is matched by its CQE's "
                                               "wqe_counter (as rdma-core does since v55), libmlx5 v44 assumes order");
            }
            ++*in_order;
        }
    }

    std::vector<mlx5::Completion> completions(ne + 1);
    const std::uint32_t count = completion_queue.poll(completions.data(), ne, resolve);

    if (count != number(outputs.at("return_code"))) {
        return CaseResult::mismatch("in the number of completions: libmlx5 " + outputs.at("return_code").dump() +
                                    ", ours " + std::to_string(count));
    }
    for (const json& wc : outputs.at("wc")) {
        const std::size_t index = static_cast<std::size_t>(number(wc.at("index")));
        if (index >= count) continue;  // scribbled by libmlx5 but not returned
        std::string difference = compare_completion(wc.at("fields"), completions[index], index);
        if (!difference.empty()) return CaseResult::mismatch(difference);
    }
    if (queues.scatter_to_cqe) {
        std::string difference = compare_unpacked_data(queues, polled_entries, completions.data(), count, cqe_size);
        if (!difference.empty()) return CaseResult::mismatch(difference);
    }
    const json& after = outputs.at("state_after");
    if (completion_queue.consumer_index() != number(after.at("cq_cons_index"))) {
        return CaseResult::mismatch("in the consumer index: libmlx5 " + after.at("cq_cons_index").dump() + ", ours " +
                                    std::to_string(completion_queue.consumer_index()));
    }
    const json& cq_doorbell = outputs.at("cq_dbrec");
    if (mlx5::big_to_host32(doorbell_record[mlx5::kCqSetConsumerIndex]) != number(cq_doorbell.at("set_ci_value"))) {
        return CaseResult::mismatch("in the CQ doorbell record: libmlx5 " + cq_doorbell.at("set_ci_value").dump());
    }
    if (doorbell_record[mlx5::kCqArm] != 0xdeadbeef) return CaseResult::mismatch("the CQ arm doorbell was written");
    if (queues.receive != nullptr && after.contains("qp_a_rq") &&
        queues.receive->tail() != number(after.at("qp_a_rq").at("tail"))) {
        return CaseResult::mismatch("in the receive queue tail after the poll");
    }
    if (queues.receive_b != nullptr && after.contains("qp_b_rq") &&
        queues.receive_b->tail() != number(after.at("qp_b_rq").at("tail"))) {
        return CaseResult::mismatch("in QP B's receive queue tail after the poll");
    }
    if (queues.shared_receive != nullptr && after.contains("srq")) {
        const json& srq = after.at("srq");
        if (queues.shared_receive->tail() != number(srq.at("tail")) || queues.shared_receive->head() != number(srq.at("head"))) {
            return CaseResult::mismatch("in the SRQ free list head/tail after the poll");
        }
        std::string difference = compare_srq_links(*queues.shared_receive, after.at("srq_links"));
        if (!difference.empty()) return CaseResult::mismatch(difference);
    }
    return CaseResult::matched();
}

std::string compare_srq_links(const mlx5::SharedReceiveQueue& queue, const json& links) {
    for (std::size_t index = 0; index < links.size(); ++index) {
        const std::uint8_t* wqe = queue.ring().buffer + index * queue.ring().stride;
        const std::uint16_t link = mlx5::load_big16(wqe + mlx5::kSrqNextWqeIndex);
        if (link != number(links[index])) {
            return "in the SRQ link of WQE " + std::to_string(index) + ": libmlx5 " + links[index].dump() + ", ours " +
                   std::to_string(link);
        }
    }
    return {};
}

}  // namespace rdmachan::golden
