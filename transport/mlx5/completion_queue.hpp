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

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

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
        case kSyndromeLocalLength:
            return CompletionStatus::local_length_error;
        case kSyndromeLocalQpOperation:
            return CompletionStatus::local_qp_operation_error;
        case kSyndromeLocalProtection:
            return CompletionStatus::local_protection_error;
        case kSyndromeWorkRequestFlushed:
            return CompletionStatus::work_request_flushed;
        case kSyndromeMemoryWindowBind:
            return CompletionStatus::memory_window_bind_error;
        case kSyndromeBadResponse:
            return CompletionStatus::bad_response;
        case kSyndromeLocalAccess:
            return CompletionStatus::local_access_error;
        case kSyndromeRemoteInvalidRequest:
            return CompletionStatus::remote_invalid_request;
        case kSyndromeRemoteAccess:
            return CompletionStatus::remote_access_error;
        case kSyndromeRemoteOperation:
            return CompletionStatus::remote_operation_error;
        case kSyndromeTransportRetryExceeded:
            return CompletionStatus::transport_retry_exceeded;
        case kSyndromeRnrRetryExceeded:
            return CompletionStatus::rnr_retry_exceeded;
        case kSyndromeRemoteAborted:
            return CompletionStatus::remote_aborted;
        default:
            return CompletionStatus::general_error;
    }
}

class CompletionQueue {
  public:
    CompletionQueue() = default;

    RDMACHAN_HOST_DEVICE explicit CompletionQueue(const CompletionQueueRing& ring,
                                                  std::uint32_t consumer_index = 0)
        : ring_(ring),
          // The mlx5_cqe64 is the last 64 bytes of an entry (128-byte CQEs put inline data first).
          first_cqe64_(ring.buffer + (ring.cqe_size - kCqeSize64)),
          end_cqe64_(first_cqe64_ + static_cast<std::size_t>(ring.cqe_count) * ring.cqe_size),
          next_cqe64_(first_cqe64_ +
                      static_cast<std::size_t>(consumer_index & (ring.cqe_count - 1)) *
                          ring.cqe_size),
          owner_parity_((consumer_index & ring.cqe_count) != 0 ? 1 : 0),
          consumer_index_(consumer_index) {}

    // Polls up to `capacity` completions into `completions`; returns how many. `resolve(qpn,
    // user_index)` returns a CompletionTarget* for the QP a CQE names, or nullptr; it is copied
    // (cheap for a lambda, whose captures then stay in registers), so it must not keep state in
    // itself that the caller reads afterwards.
    template <typename Resolver>
    RDMACHAN_ALWAYS_INLINE std::uint32_t poll(Completion* completions, std::uint32_t capacity,
                                              Resolver&& resolve) {
        // An empty CQ is the most frequent poll of all: it looks at one op_own byte and
        // rewrites the doorbell record, without setting up the loop.
        const std::uint8_t op_own = load_acquire8(next_cqe64_ + kCqeOpOwn);
        if (RDMACHAN_UNLIKELY(capacity == 0) || !software_owned(op_own, owner_parity_)) {
            // libmlx5 updates the consumer index on every poll, also an empty one (cq.c
            // update_cons_index).
            store_release32(ring_.doorbell_record + kCqSetConsumerIndex,
                            host_to_big32(consumer_index_ & 0xffffff));
            return 0;
        }
        // The resolver goes by value: a lambda's captures then travel in registers.
        return poll_owned<std::remove_cvref_t<Resolver>>(completions, capacity, resolve, op_own);
    }

    RDMACHAN_HOST_DEVICE std::uint32_t consumer_index() const { return consumer_index_; }
    RDMACHAN_HOST_DEVICE const CompletionQueueRing& ring() const { return ring_; }

  private:
    // poll() once the next CQE is known to be ours; `op_own` is its op_own byte, read with acquire.
    // Out of line, so that the empty poll above saves no registers (compilers otherwise may
    // set up this loop's frame before the empty check).
    template <typename Resolver>
    RDMACHAN_NOINLINE std::uint32_t poll_owned(Completion* completions, std::uint32_t capacity,
                                               Resolver resolve, std::uint8_t op_own) {
        // Completion has byte fields, stores through them may alias this object, and the barrier
        // below is a compiler barrier too: without locals every iteration would reload the ring
        // description from memory.
        const std::uint8_t* const first_cqe64 = first_cqe64_;
        const std::uint8_t* const end_cqe64 = end_cqe64_;
        const std::uint32_t cqe_size = ring_.cqe_size;
        const std::uint8_t* cqe = next_cqe64_;
        std::uint32_t owner_parity = owner_parity_;
        Completion* completion = completions;
        // A count down rather than an end pointer: the count of polled completions is then a
        // subtraction, not a division by sizeof(Completion).
        std::uint32_t room = capacity;
        for (;;) {
            // The CQE body is read only after its owner bit said it is complete (mlx5-facts.md §5).
            from_device_barrier();
            const std::uint32_t sop_drop_qpn = load_big32(cqe + kCqeSopDropQpn);
            CompletionTarget* const target =
                resolve(sop_drop_qpn & 0xffffff, load_big32(cqe + kCqeSrqnUserIndex) & 0xffffff);
            const std::uint64_t requester = requester_fields(sop_drop_qpn >> 24);
            // The common CQE: a successful send-side completion in the plain 64-byte format
            // (opcode and format bits of op_own zero) of a send opcode we post.
            if (RDMACHAN_LIKELY((op_own & 0xfc) == (kCqeRequester << 4) && target != nullptr &&
                                requester != kUnknownRequester)) {
                SendQueueTracking& tracking = *target->send;
                const std::uint32_t slot =
                    load_big16(cqe + kCqeWqeCounter) & (target->send_wqe_count - 1);
                tracking.consumer_index = tracking.wqe_end[slot];
                completion->wr_id = tracking.wr_id[slot];
                completion->qp_num = sop_drop_qpn & 0xffffff;
                completion->is_receive = false;
                store_requester_fields(*completion, requester, cqe);
            } else {
                decode(cqe, op_own, sop_drop_qpn, target, *completion);
            }
            ++completion;
            cqe += cqe_size;
            if (RDMACHAN_UNLIKELY(cqe == end_cqe64)) {  // next pass of the ring: owner bit flips
                cqe = first_cqe64;
                owner_parity ^= 1;
            }
            if (--room == 0) break;
            op_own = load_acquire8(cqe + kCqeOpOwn);
            if (!software_owned(op_own, owner_parity)) break;
        }
        const std::uint32_t count = capacity - room;
        const std::uint32_t consumer_index = consumer_index_ + count;
        next_cqe64_ = cqe;
        owner_parity_ = owner_parity;
        consumer_index_ = consumer_index;
        // The NIC reads the consumer index to know which entries it may overwrite; the release
        // orders it after every read of the CQEs it frees.
        store_release32(ring_.doorbell_record + kCqSetConsumerIndex,
                        host_to_big32(consumer_index & 0xffffff));
        return count;
    }

    // Software owns the entry when its opcode is not "invalid" and its owner bit equals the pass
    // parity of the index (mlx5-facts.md §5). Both in one compare: with x = op_own ^ parity,
    // rotating x right by one puts the owner mismatch in bit 7 and the opcode in bits 6:3, so
    // the entry is ours exactly when the result is below 0x78 (owner matches, opcode < 0xf).
    RDMACHAN_ALWAYS_INLINE static bool software_owned(std::uint8_t op_own, std::uint32_t parity) {
        const std::uint8_t x = static_cast<std::uint8_t>(op_own ^ parity);
        const std::uint8_t rotated = static_cast<std::uint8_t>((x >> 1) | (x << 7));
        return rotated < (kCqeInvalid << 3);
    }

    // A requester completion's status, opcode and flags as Completion bytes 8-15 (status,
    // opcode, flags, vendor_error, syndrome, sl, dlid_path_bits, padding; all but the first
    // three zero), with bits 63:62 saying where byte_len comes from. One table lookup per CQE
    // instead of a branch per field.
    static constexpr std::uint64_t kUnknownRequester = ~std::uint64_t{0};
    static constexpr std::uint64_t kByteLengthFromCqe = std::uint64_t{1} << 63;
    static constexpr std::uint64_t kByteLengthEight = std::uint64_t{1} << 62;
    RDMACHAN_ALWAYS_INLINE static constexpr std::uint64_t requester_bytes(CompletionOpcode opcode,
                                                                          std::uint8_t flags) {
        return static_cast<std::uint64_t>(CompletionStatus::success) |
               static_cast<std::uint64_t>(opcode) << 8 | static_cast<std::uint64_t>(flags) << 16;
    }
    RDMACHAN_ALWAYS_INLINE static constexpr std::uint64_t requester_fields(
        std::uint32_t wqe_opcode) {
        switch (wqe_opcode) {
            case kOpcodeRdmaWrite:
                return requester_bytes(CompletionOpcode::rdma_write, 0);
            case kOpcodeRdmaWriteImmediate:
                return requester_bytes(CompletionOpcode::rdma_write, kCompletionWithImmediate);
            case kOpcodeSend:
            case kOpcodeSendInvalidate:
                return requester_bytes(CompletionOpcode::send, 0);
            case kOpcodeSendImmediate:
                return requester_bytes(CompletionOpcode::send, kCompletionWithImmediate);
            case kOpcodeRdmaRead:
                return requester_bytes(CompletionOpcode::rdma_read, 0) | kByteLengthFromCqe;
            case kOpcodeAtomicCompareAndSwap:
                return requester_bytes(CompletionOpcode::atomic_compare_and_swap, 0) |
                       kByteLengthEight;
            case kOpcodeAtomicFetchAndAdd:
                return requester_bytes(CompletionOpcode::atomic_fetch_and_add, 0) |
                       kByteLengthEight;
            case kOpcodeUmr:
                return requester_bytes(CompletionOpcode::local_invalidate, 0);
            default:
                return kUnknownRequester;  // decode() reports it as a general error
        }
    }
    static_assert(offsetof(Completion, status) == 8 && offsetof(Completion, opcode) == 9 &&
                      offsetof(Completion, flags) == 10 &&
                      offsetof(Completion, vendor_error) == 11 &&
                      offsetof(Completion, syndrome) == 12 && offsetof(Completion, sl) == 13 &&
                      offsetof(Completion, dlid_path_bits) == 14 &&
                      offsetof(Completion, byte_len) == 16,
                  "requester_fields() packs Completion bytes 8-15 in this order");

    RDMACHAN_ALWAYS_INLINE static void store_requester_fields(Completion& completion,
                                                              std::uint64_t fields,
                                                              const std::uint8_t* cqe) {
        const std::uint64_t bytes = fields & 0xffffffff;
        std::memcpy(reinterpret_cast<unsigned char*>(&completion) + offsetof(Completion, status),
                    &bytes, sizeof bytes);
        std::uint32_t byte_len = 0;
        if (RDMACHAN_UNLIKELY((fields >> 62) != 0))
            byte_len = (fields & kByteLengthFromCqe) != 0 ? load_big32(cqe + kCqeByteCount) : 8;
        completion.byte_len = byte_len;
    }

    // Everything but the common requester CQE: responder, error, unknown-QP and other CQEs.
    RDMACHAN_COLD static void decode(const std::uint8_t* cqe, std::uint8_t op_own,
                                     std::uint32_t sop_drop_qpn, CompletionTarget* target,
                                     Completion& completion) {
        const std::uint8_t opcode = op_own >> 4;
        const std::uint32_t qpn = sop_drop_qpn & 0xffffff;
        const std::uint16_t wqe_counter = load_big16(cqe + kCqeWqeCounter);
        completion.qp_num = qpn;
        completion.flags = 0;
        completion.syndrome = 0;
        completion.vendor_error = 0;
        completion.byte_len = 0;
        completion.is_receive = opcode != kCqeRequester && opcode != kCqeRequesterError;
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
            return target->send != nullptr
                       ? retire_send(*target->send, target->send_wqe_count, wqe_counter)
                       : 0;
        }
        if (target->shared_receive != nullptr) return target->shared_receive->complete(wqe_counter);
        if (target->receive != nullptr) return target->receive->complete(wqe_counter);
        return 0;
    }

    RDMACHAN_HOST_DEVICE static void decode_requester_opcode(const std::uint8_t* cqe,
                                                             std::uint32_t wqe_opcode,
                                                             Completion& completion) {
        switch (wqe_opcode) {
            case kOpcodeRdmaWriteImmediate:
                completion.flags = kCompletionWithImmediate;
                [[fallthrough]];
            case kOpcodeRdmaWrite:
                completion.opcode = CompletionOpcode::rdma_write;
                break;
            case kOpcodeSendImmediate:
                completion.flags = kCompletionWithImmediate;
                [[fallthrough]];
            case kOpcodeSend:
            case kOpcodeSendInvalidate:
                completion.opcode = CompletionOpcode::send;
                break;
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
            case kOpcodeUmr:
                completion.opcode = CompletionOpcode::local_invalidate;
                break;
            default:
                completion.status = CompletionStatus::general_error;
                break;
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
            default:
                completion.opcode = CompletionOpcode::receive;
                break;
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
    // The ring walked as pointers: each points at the mlx5_cqe64 part of an entry. The owner
    // parity is the pass parity of the consumer index, (consumer_index / cqe_count) & 1.
    const std::uint8_t* first_cqe64_ = nullptr;
    const std::uint8_t* end_cqe64_ = nullptr;
    const std::uint8_t* next_cqe64_ = nullptr;
    std::uint32_t owner_parity_ = 0;
    std::uint32_t consumer_index_ = 0;
};

}  // namespace rdmachan::mlx5
