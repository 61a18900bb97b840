// The mlx5 completion-queue poller: reads CQEs straight from the CQ buffer (owner bit, read
// barrier, decode), retires the send, receive or SRQ WQE each one names, and writes the 24-bit
// consumer index to the CQ doorbell record. Facts: mlx5-facts.md §5; behaviour checked against
// libmlx5's mlx5_poll_cq_v1 by mlx5-golden-check. Header-only, no exceptions, allocation or
// locks.
//
// Deliberate differences from libmlx5 v44 (docs/ARCHITECTURE.md says why):
// - a non-SRQ responder CQE is matched by its wqe_counter, not by in-order consumption;
// - scatter-to-CQE is disabled when our QPs are created, so a CQE carrying inline data
//   (format 1 or 2) or a compressed CQE (format 3) is reported as a local QP operation error
//   instead of being unpacked;
// - a CQE whose QP the caller does not know, a resize or a no-packet CQE is consumed and
//   reported as a general-error completion naming the QPN, instead of failing the whole poll.
#pragma once

#include <cstdint>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/completion.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/receive_queue.hpp"
#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

// The queues a CQE can name. The poll's resolver returns one of these for a QPN / user index.
struct CompletionTarget {
    SendQueueTracking* send = nullptr;
    std::uint32_t send_wqe_count = 0;
    ReceiveQueue* receive = nullptr;
    SharedReceiveQueue* shared_receive = nullptr;
};

// The error CQE syndrome, as a verbs status (cq.c mlx5_handle_error_cqe).
RDMACHAN_HOST_DEVICE inline CompletionStatus status_from_syndrome(std::uint8_t syndrome) {
    switch (syndrome) {
        case kSyndromeLocalLength: return CompletionStatus::local_length_error;
        case kSyndromeLocalQpOperation: return CompletionStatus::local_qp_operation_error;
        case kSyndromeLocalProtection: return CompletionStatus::local_protection_error;
        case kSyndromeWorkRequestFlushed: return CompletionStatus::work_request_flushed;
        case kSyndromeMemoryWindowBind: return CompletionStatus::memory_window_bind_error;
        case kSyndromeBadResponse: return CompletionStatus::bad_response;
        case kSyndromeLocalAccess: return CompletionStatus::local_access_error;
        case kSyndromeRemoteInvalidRequest: return CompletionStatus::remote_invalid_request;
        case kSyndromeRemoteAccess: return CompletionStatus::remote_access_error;
        case kSyndromeRemoteOperation: return CompletionStatus::remote_operation_error;
        case kSyndromeTransportRetryExceeded: return CompletionStatus::transport_retry_exceeded;
        case kSyndromeRnrRetryExceeded: return CompletionStatus::rnr_retry_exceeded;
        case kSyndromeRemoteAborted: return CompletionStatus::remote_aborted;
        default: return CompletionStatus::general_error;
    }
}

class CompletionQueue {
public:
    CompletionQueue() = default;

    RDMACHAN_HOST_DEVICE explicit CompletionQueue(const CompletionQueueRing& ring, std::uint32_t consumer_index = 0)
        : ring_(ring),
          // The mlx5_cqe64 is the last 64 bytes of an entry (128-byte CQEs put inline data first).
          first_cqe64_(ring.buffer + (ring.cqe_size - kCqeSize64)),
          mask_(ring.cqe_count - 1),
          consumer_index_(consumer_index) {
        shift_ = 0;
        while ((1u << shift_) < ring.cqe_size) ++shift_;
    }

    // Polls up to `capacity` completions into `completions`; returns how many. `resolve(qpn,
    // user_index)` returns a CompletionTarget* for the QP a CQE names, or nullptr.
    template <typename Resolver>
    RDMACHAN_HOST_DEVICE std::uint32_t poll(Completion* completions, std::uint32_t capacity, Resolver&& resolve) {
        std::uint32_t count = 0;
        while (count < capacity) {
            const std::uint8_t* cqe = first_cqe64_ + (static_cast<std::size_t>(consumer_index_ & mask_) << shift_);
            const std::uint8_t op_own = load_acquire8(cqe + kCqeOpOwn);
            const std::uint8_t opcode = op_own >> 4;
            // Software owns the entry when the owner bit equals the pass parity of the index.
            if (opcode == kCqeInvalid || (op_own & 1u) != ((consumer_index_ & ring_.cqe_count) != 0)) break;
            from_device_barrier();
            ++consumer_index_;
            decode(cqe, op_own, completions[count], resolve);
            ++count;
        }
        // libmlx5 updates the consumer index on every poll, also an empty one (cq.c
        // update_cons_index). The NIC reads it to know which entries it may overwrite.
        store_release32(ring_.doorbell_record + kCqSetConsumerIndex, host_to_big32(consumer_index_ & 0xffffff));
        return count;
    }

    RDMACHAN_HOST_DEVICE std::uint32_t consumer_index() const { return consumer_index_; }
    RDMACHAN_HOST_DEVICE const CompletionQueueRing& ring() const { return ring_; }

private:
    template <typename Resolver>
    RDMACHAN_HOST_DEVICE static void decode(const std::uint8_t* cqe, std::uint8_t op_own, Completion& completion,
                                            Resolver& resolve) {
        const std::uint8_t opcode = op_own >> 4;
        const std::uint32_t sop_drop_qpn = load_big32(cqe + kCqeSopDropQpn);
        const std::uint32_t qpn = sop_drop_qpn & 0xffffff;
        const std::uint16_t wqe_counter = load_big16(cqe + kCqeWqeCounter);
        completion.qp_num = qpn;
        completion.flags = 0;
        completion.syndrome = 0;
        completion.vendor_error = 0;
        completion.byte_len = 0;
        completion.is_receive = opcode != kCqeRequester && opcode != kCqeRequesterError;
        CompletionTarget* target = resolve(qpn, load_big32(cqe + kCqeSrqnUserIndex) & 0xffffff);
        if (RDMACHAN_UNLIKELY(target == nullptr)) {
            completion.wr_id = 0;
            completion.status = CompletionStatus::general_error;
            return;
        }
        if (RDMACHAN_UNLIKELY(((op_own >> 2) & 3) != 0 && opcode <= kCqeResponderSendInvalidate)) {
            // Inline-scatter or compressed format on a QP created without scatter-to-CQE.
            completion.wr_id = retire(opcode, target, wqe_counter);
            completion.status = CompletionStatus::local_qp_operation_error;
            return;
        }
        switch (opcode) {
            case kCqeRequester: {
                completion.wr_id = retire_send(*target->send, target->send_wqe_count, wqe_counter);
                completion.status = CompletionStatus::success;
                decode_requester_opcode(cqe, sop_drop_qpn >> 24, completion);
                return;
            }
            case kCqeResponderWriteImmediate:
            case kCqeResponderSend:
            case kCqeResponderSendImmediate:
            case kCqeResponderSendInvalidate: {
                completion.wr_id = retire(opcode, target, wqe_counter);
                completion.status = CompletionStatus::success;
                decode_responder(cqe, opcode, completion);
                return;
            }
            case kCqeRequesterError:
            case kCqeResponderError: {
                completion.wr_id = retire(opcode, target, wqe_counter);
                completion.syndrome = cqe[kCqeSyndrome];
                completion.vendor_error = cqe[kCqeVendorSyndrome];
                completion.status = status_from_syndrome(completion.syndrome);
                return;
            }
            default:
                // Resize, no-packet, signature error: nothing of ours is completed by them.
                completion.wr_id = 0;
                completion.status = CompletionStatus::general_error;
                return;
        }
    }

    RDMACHAN_HOST_DEVICE static std::uint64_t retire(std::uint8_t opcode, CompletionTarget* target,
                                                     std::uint16_t wqe_counter) {
        if (opcode == kCqeRequester || opcode == kCqeRequesterError) {
            return target->send != nullptr ? retire_send(*target->send, target->send_wqe_count, wqe_counter) : 0;
        }
        if (target->shared_receive != nullptr) return target->shared_receive->complete(wqe_counter);
        if (target->receive != nullptr) return target->receive->complete(wqe_counter);
        return 0;
    }

    RDMACHAN_HOST_DEVICE static void decode_requester_opcode(const std::uint8_t* cqe, std::uint32_t wqe_opcode,
                                                             Completion& completion) {
        switch (wqe_opcode) {
            case kOpcodeRdmaWriteImmediate: completion.flags = kCompletionWithImmediate; [[fallthrough]];
            case kOpcodeRdmaWrite: completion.opcode = CompletionOpcode::rdma_write; break;
            case kOpcodeSendImmediate: completion.flags = kCompletionWithImmediate; [[fallthrough]];
            case kOpcodeSend:
            case kOpcodeSendInvalidate: completion.opcode = CompletionOpcode::send; break;
            case kOpcodeRdmaRead:
                completion.opcode = CompletionOpcode::rdma_read;
                completion.byte_len = load_big32(cqe + kCqeByteCount);
                break;
            case kOpcodeAtomicCompareAndSwap:
                completion.opcode = CompletionOpcode::atomic_compare_and_swap;
                completion.byte_len = 8;
                break;
            case kOpcodeAtomicFetchAndAdd:
                completion.opcode = CompletionOpcode::atomic_fetch_and_add;
                completion.byte_len = 8;
                break;
            case kOpcodeUmr: completion.opcode = CompletionOpcode::local_invalidate; break;
            default: completion.status = CompletionStatus::general_error; break;
        }
    }

    RDMACHAN_HOST_DEVICE static void decode_responder(const std::uint8_t* cqe, std::uint8_t opcode,
                                                      Completion& completion) {
        completion.byte_len = load_big32(cqe + kCqeByteCount);
        const std::uint32_t immediate = load_big32(cqe + kCqeImmediateInvalidatePkey);
        switch (opcode) {
            case kCqeResponderWriteImmediate:
                completion.opcode = CompletionOpcode::receive_rdma_with_immediate;
                completion.flags = kCompletionWithImmediate;
                completion.immediate = immediate;
                break;
            case kCqeResponderSendImmediate:
                completion.opcode = CompletionOpcode::receive;
                completion.flags = kCompletionWithImmediate;
                completion.immediate = immediate;
                break;
            case kCqeResponderSendInvalidate:
                completion.opcode = CompletionOpcode::receive;
                completion.flags = kCompletionWithInvalidate;
                completion.invalidated_rkey = immediate;
                break;
            default: completion.opcode = CompletionOpcode::receive; break;
        }
        const std::uint32_t flags_rqpn = load_big32(cqe + kCqeFlagsRemoteQpn);
        completion.src_qp = flags_rqpn & 0xffffff;
        completion.sl = static_cast<std::uint8_t>((flags_rqpn >> 24) & 0xf);
        if (((flags_rqpn >> 28) & 3) != 0) completion.flags |= kCompletionGrh;
        completion.slid = load_big16(cqe + kCqeSlid);
        completion.dlid_path_bits = cqe[kCqeMlPath] & 0x7f;
        completion.pkey_index = static_cast<std::uint16_t>(immediate & 0xffff);
    }

    CompletionQueueRing ring_{};
    const std::uint8_t* first_cqe64_ = nullptr;
    std::uint32_t mask_ = 0;
    std::uint32_t shift_ = 6;
    std::uint32_t consumer_index_ = 0;
};

}  // namespace rdmachan::mlx5
