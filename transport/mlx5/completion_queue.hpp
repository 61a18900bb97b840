// The mlx5 completion-queue poller: reads CQEs straight from the CQ buffer (owner bit, read
// barrier, decode), retires the send, receive or SRQ WQE each one names, and writes the 24-bit
// consumer index to the CQ doorbell record. Facts: mlx5-facts.md §5; behaviour checked against
// libmlx5's mlx5_poll_cq_v1 by mlx5-golden-check. Header-only, no exceptions, allocation or
// locks.
//
// Off the common case: CQEs carrying data (scatter-to-CQE, inline_scatter.hpp) for a target
// that says its QP was created with it, and compressed sessions (compressed_session.hpp) on a
// ring that says its CQ was. A poll ends before a compressed session that follows other CQEs
// and the next poll starts with it, so that the loop over plain CQEs carries nothing for them.
//
// Deliberate differences from libmlx5 v44 (docs/ARCHITECTURE.md says why):
// - a non-SRQ responder CQE is matched by its wqe_counter, not by in-order consumption;
// - a CQE carrying data (format 1 or 2) for a target without scatter_to_cqe, or a compressed
//   CQE (format 3) on a ring without compressed_cqes, is reported as a local QP operation error
//   instead of being unpacked; a receive's data stops at its list's invalid-lkey terminator;
//   a requester's data in a 128-byte CQE is read where rdma-core 45184d2c8 reads it;
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
#include "transport/mlx5/compressed_session.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/inline_scatter.hpp"
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
    // The QP was created with scatter-to-CQE (mlx5dv's default, unless
    // MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE): a CQE's data goes to the WQE's buffers. Without
    // it such a CQE is reported as a local QP operation error.
    bool scatter_to_cqe = false;
    // The send queue's WQEBBs (send_wqe_count of them), RC layout: a read's or an atomic's data
    // in a CQE goes to the data segments of its WQE, read back from here. nullptr: such a CQE is
    // a local QP operation error.
    const std::uint8_t* send_ring = nullptr;
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
          cqe_stride_(ring.cqe_size),
          cqe_stride_shift_(ring.cqe_size == 128 ? 7 : 6),
          next_cqe64_(first_cqe64_ +
                      static_cast<std::size_t>(consumer_index & (ring.cqe_count - 1)) *
                          ring.cqe_size),
          owner_parity_((consumer_index & ring.cqe_count) != 0 ? 1 : 0),
          consumer_index_(consumer_index) {}

    // Polls up to `capacity` completions into `completions`; returns how many. `resolve(qpn,
    // user_index)` returns a CompletionTarget* for the QP a CQE names, or nullptr; it is copied
    // (cheap for a lambda, whose captures then stay in registers), so it must not keep state in
    // itself that the caller reads afterwards. It must give the same answer for the same QPN
    // during a poll: consecutive send completions of one QP ask it once, for the first of them.
    // The target and its tracking must not change during the poll, nor overlap `completions`.
    template <typename Resolver>
    RDMACHAN_ALWAYS_INLINE std::uint32_t poll(Completion* completions, std::uint32_t capacity,
                                              Resolver&& resolve) {
        // An empty CQ is the most frequent poll of all: it looks at one op_own byte and
        // rewrites the doorbell record, without setting up the loop.
        const std::uint8_t* const cqe = next_cqe64_;
        const std::uint8_t state = cqe_state(load_acquire8(cqe + kCqeOpOwn), owner_parity_);
        if (RDMACHAN_UNLIKELY(capacity == 0) || state >= kNotOwned) {
            // libmlx5 updates the consumer index on every poll, also an empty one (cq.c
            // update_cons_index).
            store_release32(ring_.doorbell_record + kCqSetConsumerIndex,
                            host_to_big32(consumer_index_ & 0xffffff));
            return 0;
        }
        // The resolver goes by value: a lambda's captures then travel in registers.
        return poll_owned<std::remove_cvref_t<Resolver>>(completions, capacity, resolve, state,
                                                         cqe);
    }

    // Asks the CQ for one completion event, for the next CQE after the consumer index (with
    // `solicited_only`, the next solicited or error one), as libmlx5's mlx5_arm_cq does. The arm
    // must carry this poller's consumer index: libmlx5's ibv_req_notify_cq would send its own,
    // which a direct poller never advances (mlx5-facts.md §9, pitfall 7). The CQ must have a UAR
    // (ring().uar). Not thread safe against poll(): both read the consumer index.
    RDMACHAN_HOST_DEVICE void arm(bool solicited_only) {
        const std::uint32_t word = (arm_sequence_ & kCqArmSequenceMask) << kCqArmSequenceShift |
                                   (solicited_only ? kCqArmSolicited : kCqArmNext) |
                                   (consumer_index_ & kCqConsumerIndexMask);
        store_release32(ring_.doorbell_record + kCqArm, host_to_big32(word));
        // The record in host memory is visible before the register write that rings it
        // (libmlx5's mmio_wc_start).
        flush_writes();
        mmio_write64(ring_.uar + kCqDoorbellOffset,
                     host_to_big64(static_cast<std::uint64_t>(word) << 32 | ring_.cqn));
        // The UAR page may be mapped write-combining: the register write leaves the CPU now,
        // not whenever the buffer drains (libmlx5 flushes after it too).
        flush_writes();
    }

    // A completion event of this CQ was taken: the next arm carries the next sequence number,
    // as libmlx5's does after each event ibv_get_cq_event hands out (mlx5_cq_event). Call it
    // once per event read from the CQ's completion channel.
    RDMACHAN_HOST_DEVICE void event_received() {
        arm_sequence_ = static_cast<std::uint8_t>((arm_sequence_ + 1) & kCqArmSequenceMask);
    }

    // The sequence number the next arm writes, 0 to 3.
    RDMACHAN_HOST_DEVICE std::uint32_t arm_sequence() const { return arm_sequence_; }

    // Whether the entry at the consumer index holds a CQE software owns, i.e. whether poll()
    // would return a completion; nothing is consumed. After arm(), a caller checks it before it
    // sleeps on the event: a CQE written before the arm may raise no event.
    RDMACHAN_HOST_DEVICE bool completion_waiting() const {
        return cqe_state(load_acquire8(next_cqe64_ + kCqeOpOwn), owner_parity_) < kNotOwned;
    }

    RDMACHAN_HOST_DEVICE std::uint32_t consumer_index() const { return consumer_index_; }
    RDMACHAN_HOST_DEVICE const CompletionQueueRing& ring() const { return ring_; }

  private:
    // cqe_state() of an entry software does not own (yet), and the largest value of a successful
    // requester CQE in the plain 64-byte format.
    static constexpr std::uint32_t kNotOwned = kCqeInvalid << 3;
    static constexpr std::uint32_t kPlainRequester = 1;
    // The format bits in cqe_state(): both set for a compressed CQE (format 3).
    static constexpr std::uint32_t kStateCompressed = kCqeFormatMask >> 1;

    // Ownership and the common case in one byte (mlx5-facts.md §5). Software owns the entry when
    // its opcode is not "invalid" and its owner bit equals the pass parity of the index. With
    // x = op_own ^ parity, rotating x right by one puts the owner mismatch in bit 7, the opcode in
    // bits 6:3, the format in bits 2:1 and the solicited bit in bit 0: the entry is ours exactly
    // when the result is below kNotOwned (owner matches, opcode < 0xf), and a successful
    // requester CQE in the plain format (opcode 0, format 0) exactly when it is at most 1.
    RDMACHAN_ALWAYS_INLINE static std::uint8_t cqe_state(std::uint8_t op_own,
                                                         std::uint32_t parity) {
        const std::uint8_t x = static_cast<std::uint8_t>(op_own ^ parity);
        return static_cast<std::uint8_t>((x >> 1) | (x << 7));
    }

    // The first CQE of a poll, once it is known to be ours, with no loop set up: a poll for one
    // completion of a send ends here. Anything else continues in poll_more(). Out of line, so
    // that the empty poll above saves no registers (compilers otherwise may set up a frame
    // before the empty check).
    template <typename Resolver>
    RDMACHAN_NOINLINE std::uint32_t poll_owned(Completion* completion, std::uint32_t capacity,
                                               Resolver resolve, std::uint8_t state,
                                               const std::uint8_t* cqe) {
        if (RDMACHAN_UNLIKELY(state > kPlainRequester)) {
            if (RDMACHAN_UNLIKELY((state & kStateCompressed) == kStateCompressed))
                return poll_session(completion, capacity, resolve);
            return poll_more(completion, capacity, resolve, nullptr, 0);
        }
        // The CQE body is read only after its owner bit said it is complete (mlx5-facts.md §5).
        from_device_barrier();
        const std::uint32_t sop_drop_qpn = load32(cqe + kCqeSopDropQpn);  // as stored (big-endian)
        const std::uint32_t qpn = byte_swap32(sop_drop_qpn) & 0xffffff;
        CompletionTarget* const target =
            resolve(qpn, load_big32(cqe + kCqeSrqnUserIndex) & 0xffffff);
        const std::uint32_t entry = requester_entry(sop_drop_qpn & 0xff);
        if (RDMACHAN_UNLIKELY(target == nullptr || target->send == nullptr ||
                              entry > kRequesterPlainEntryMax))
            return poll_more(completion, capacity, resolve, target, kFirstResolved);
        store_send_fields(*completion, cqe, entry, static_cast<std::uint64_t>(qpn) << 32);
        const std::uint32_t slot = load_big16(cqe + kCqeWqeCounter) & (target->send_wqe_count - 1);
        SendQueueTracking& tracking = *target->send;
        store_wr_id(*completion, tracking.wr_id[slot]);
        tracking.consumer_index = tracking.wqe_end[slot];
        cqe += cqe_stride_;
        if (RDMACHAN_UNLIKELY(cqe == end_cqe64_)) {  // next pass of the ring: owner bit flips
            cqe = first_cqe64_;
            owner_parity_ ^= 1;
        }
        next_cqe64_ = cqe;
        if (capacity == 1 || cqe_state(load_acquire8(cqe + kCqeOpOwn), owner_parity_) >= kNotOwned)
            return finish(1);
        return poll_more(completion + 1, capacity - 1, resolve, nullptr, 1);
    }

    // The loop over the CQEs from next_cqe64_ (which is ours) on. `done_resolved` holds the
    // completions this poll already took (bit 0) and kFirstResolved when `first_target` is what
    // the resolver returned for the first CQE (six arguments, so that the calls above are jumps).
    static constexpr std::uint32_t kFirstResolved = 2;
    template <typename Resolver>
    RDMACHAN_ALWAYS_INLINE std::uint32_t poll_more(Completion* completions, std::uint32_t capacity,
                                                   Resolver& resolve,
                                                   CompletionTarget* first_target,
                                                   std::uint32_t done_resolved) {
        // 64-byte CQEs (the usual size) get a loop with the stride known at compile time.
        if (cqe_stride_ == kCqeSize64)
            return poll_loop<Resolver, kCqeSize64>(completions, capacity, resolve, first_target,
                                                   done_resolved);
        return poll_loop<Resolver, 0>(completions, capacity, resolve, first_target, done_resolved);
    }

    // Consecutive send completions of one QP (the QPN alone names the QP of a requester CQE)
    // reuse the resolver's answer and the QP's tracking arrays, and while sop_drop_qpn (QPN and
    // WQE opcode) stays the same, the decoded opcode as well: the common CQE costs one compare.
    // kStride is the CQE size, or 0 for ring_.cqe_size at run time.
    template <typename Resolver, std::uint32_t kStride>
    RDMACHAN_NOINLINE std::uint32_t poll_loop(Completion* const completions,
                                              const std::uint32_t capacity, Resolver resolve,
                                              CompletionTarget* first_target,
                                              const std::uint32_t done_resolved) {
        bool first_resolved = (done_resolved & kFirstResolved) != 0;
        // Completion has byte fields, stores through them may alias this object, and the barrier
        // below is a compiler barrier too: without locals every iteration would reload the ring
        // description from memory.
        const std::size_t stride = kStride != 0 ? kStride : cqe_stride_;
        const std::uint8_t* cqe = next_cqe64_;
        std::uint32_t parity = owner_parity_;
        std::uint8_t state = cqe_state(load_acquire8(cqe + kCqeOpOwn), parity);
        Completion* completion = completions;
        // The loop runs to `limit`: the ring end or the last entry the caller has room for,
        // whichever comes first, so that it checks one bound per CQE.
        const std::uint8_t* limit = pass_limit(cqe, capacity);
        // The last send completion: its sop_drop_qpn as stored (the initial value is no WQE
        // opcode we post, so it matches no CQE until set), its table entry, the qp_num word and
        // the QP's tracking.
        std::uint64_t cached_sop_drop_qpn = std::uint64_t{1} << 32;
        std::uint64_t cached_bytes = 0;
        std::uint64_t qpn_word = 0;
        const std::uint64_t* wr_ids = nullptr;
        const std::uint32_t* wqe_ends = nullptr;
        std::uint32_t wqe_mask = 0;
        std::uint32_t* send_consumer_index = nullptr;
        for (;;) {
            if (RDMACHAN_LIKELY(state <= kPlainRequester)) {
                // The CQE body is read only after its owner bit said it is complete
                // (mlx5-facts.md §5).
                from_device_barrier();
                const std::uint32_t sop_drop_qpn = load32(cqe + kCqeSopDropQpn);
                if (RDMACHAN_UNLIKELY(sop_drop_qpn != cached_sop_drop_qpn)) {
                    const std::uint32_t entry = requester_entry(sop_drop_qpn & 0xff);
                    if (entry == kRequesterUnknown) goto general;
                    // Another QP, or none yet (the QPN is bytes 1-3 as stored).
                    if (send_consumer_index == nullptr ||
                        ((sop_drop_qpn ^ cached_sop_drop_qpn) & 0xffffff00) != 0) {
                        const std::uint32_t qpn = byte_swap32(sop_drop_qpn) & 0xffffff;
                        CompletionTarget* target = first_target;
                        if (!first_resolved)
                            target = resolve(qpn, load_big32(cqe + kCqeSrqnUserIndex) & 0xffffff);
                        first_resolved = false;
                        if (target == nullptr || target->send == nullptr) {
                            decode(cqe, entry_of(cqe, stride), byte_swap32(sop_drop_qpn), target,
                                   *completion);
                            cached_sop_drop_qpn = std::uint64_t{1} << 32;
                            send_consumer_index = nullptr;
                            goto next;
                        }
                        qpn_word = static_cast<std::uint64_t>(qpn) << 32;
                        wr_ids = target->send->wr_id;
                        wqe_ends = target->send->wqe_end;
                        wqe_mask = (target->send_wqe_count - 1) & 0xffff;
                        send_consumer_index = &target->send->consumer_index;
                    }
                    if (entry > kRequesterPlainEntryMax) {
                        // byte_len from the CQE or 8: filled here, not cached.
                        *send_consumer_index = complete_send(*completion, cqe, wr_ids, wqe_ends,
                                                             wqe_mask, entry, qpn_word);
                        cached_sop_drop_qpn = sop_drop_qpn | std::uint64_t{1} << 32;
                        goto next;
                    }
                    cached_sop_drop_qpn = sop_drop_qpn;
                    cached_bytes = entry;
                }
                *send_consumer_index = complete_plain_send(*completion, cqe, wr_ids, wqe_ends,
                                                           wqe_mask, cached_bytes, qpn_word);
            } else {
                // Not ours yet, or a compressed session (format 3, state bits 2:1): the poll
                // ends before it, and the next one starts with it (poll_owned()).
                if (state >= kNotOwned || (state & kStateCompressed) == kStateCompressed) break;
                from_device_barrier();
            general:
                // Responder, error and every other CQE: the general decoder.
                const std::uint32_t sop_drop_qpn = load_big32(cqe + kCqeSopDropQpn);
                CompletionTarget* target = first_target;
                if (!first_resolved)
                    target = resolve(sop_drop_qpn & 0xffffff,
                                     load_big32(cqe + kCqeSrqnUserIndex) & 0xffffff);
                first_resolved = false;
                decode(cqe, entry_of(cqe, stride), sop_drop_qpn, target, *completion);
                // decode() may have retired send WQEs of the cached QP: the cache stays valid,
                // as complete_send() reads the consumer index afresh from wqe_ends each time.
            }
        next:
            ++completion;
            cqe += stride;
            if (RDMACHAN_UNLIKELY(cqe == limit)) {
                if (cqe == end_cqe64_) {  // next pass of the ring: owner bit flips
                    cqe = first_cqe64_;
                    parity ^= 1;
                }
                const std::uint32_t room =
                    capacity - static_cast<std::uint32_t>(completion - completions);
                if (room == 0) break;
                limit = pass_limit(cqe, room);
            }
            state = cqe_state(load_acquire8(cqe + kCqeOpOwn), parity);
        }
        next_cqe64_ = cqe;
        owner_parity_ = static_cast<std::uint8_t>(parity);
        return finish((done_resolved & 1) + static_cast<std::uint32_t>(completion - completions));
    }

    // A poll whose first CQE is compressed (a session's title, or the next entry of one begun):
    // as many of its CQEs as there is room for, and of the sessions right after it; the CQEs
    // after those go to the loop, which ends the poll before the next session.
    template <typename Resolver>
    RDMACHAN_NOINLINE std::uint32_t poll_session(Completion* completion, std::uint32_t room,
                                                 Resolver resolve) {
        std::uint32_t done = 0;
        for (;;) {
            const std::uint32_t taken = take_session(completion, room, resolve);
            completion += taken;
            room -= taken;
            done += taken;
            const std::uint8_t state =
                cqe_state(load_acquire8(next_cqe64_ + kCqeOpOwn), owner_parity_);
            if (room == 0 || state >= kNotOwned) return finish(done);
            if ((state & kStateCompressed) != kStateCompressed) {
                // The CQEs after the sessions, up to the next session (the loop stops there, so
                // this never nests); the loop's finish() writes the doorbell record for all.
                consumer_index_ += done;
                return done + poll_more(completion, room, resolve, nullptr, 0);
            }
        }
    }

    // Consumes up to `room` (at least 1) CQEs of the compressed session at next_cqe64_ into
    // `completions` and returns how many; next_cqe64_ and owner_parity_ move past them. A title
    // that cannot start a session, or any compressed CQE on a ring without compressed_cqes, is
    // decoded alone, as a local QP operation error. A session left unfinished marks its next
    // entry as a software-owned compressed CQE, so that the next poll, even an empty one's first
    // look, comes back here: the common poll never asks whether a session is open.
    template <typename Resolver>
    RDMACHAN_ALWAYS_INLINE std::uint32_t take_session(Completion* completions, std::uint32_t room,
                                                 Resolver& resolve) {
        CompressedSession& session = session_;
        const std::uint8_t* cqe = next_cqe64_;
        std::uint32_t parity = owner_parity_;
        from_device_barrier();
        if (!session.active()) {
            const std::uint32_t size =
                ring_.compressed_cqes ? CompressedSession::size_of(cqe, ring_.cqe_count) : 0;
            if (size == 0) {
                const std::uint32_t sop_drop_qpn = load_big32(cqe + kCqeSopDropQpn);
                decode(cqe, entry_of(cqe, cqe_stride_), sop_drop_qpn,
                       resolve(sop_drop_qpn & 0xffffff,
                               load_big32(cqe + kCqeSrqnUserIndex) & 0xffffff),
                       completions[0]);
            } else {
                std::memcpy(session.title, cqe, kCqeSize64);
                const std::uint8_t* first_array = cqe + cqe_stride_;
                if (first_array == end_cqe64_) first_array = first_cqe64_;
                std::memcpy(session.minis, first_array, kCqeSize64);
                session.loaded_array = 0;
                session.position = 0;
                session.size = size;
            }
        }
        std::uint32_t taken = 0;
        if (session.active()) {
            const std::uint32_t sop_drop_qpn = load_big32(session.title + kCqeSopDropQpn);
            CompletionTarget* const target = resolve(
                sop_drop_qpn & 0xffffff, load_big32(session.title + kCqeSrqnUserIndex) & 0xffffff);
            // What the CQEs share is decoded once: a requester CQE's fields come from its mini
            // CQE's WQE opcode (requester_entry), a responder's from the first one decoded.
            // Anything else goes through decode() expanded.
            const std::uint8_t opcode = session.title[kCqeOpOwn] >> 4;
            SendQueueTracking* const send =
                opcode == kCqeRequester && target != nullptr ? target->send : nullptr;
            if (RDMACHAN_LIKELY(send != nullptr))
                taken = take_requester_minis(completions, room, cqe, parity, *target,
                                             sop_drop_qpn & 0xffffff);
            else {
                next_cqe64_ = cqe;
                owner_parity_ = static_cast<std::uint8_t>(parity);
                taken = take_other_minis(completions, room, target, opcode);
                cqe = next_cqe64_;
                parity = owner_parity_;
            }
            if (session.active()) {
                const std::uint32_t array = session.position / kMiniCqesPerEntry;
                if (array != session.loaded_array) {
                    std::memcpy(session.minis, cqe, kCqeSize64);
                    session.loaded_array = array;
                }
                const_cast<std::uint8_t*>(cqe)[kCqeOpOwn] =
                    static_cast<std::uint8_t>(kCqeFormatMask | parity);
            }
        } else {
            taken = 1;  // the malformed title, decoded above
            cqe = next_entry(cqe, parity);
        }
        next_cqe64_ = cqe;
        owner_parity_ = static_cast<std::uint8_t>(parity);
        return taken;
    }

    // The CQEs of every other session (a responder's, or one whose QP resolves to no send
    // queue) from `cqe` on, up to `room` or the session's end: the first decoded expanded, the
    // rest from it while it succeeded. Moves next_cqe64_ and owner_parity_ past the entries
    // taken, rewriting each.
    RDMACHAN_NOINLINE std::uint32_t take_other_minis(Completion* completions, std::uint32_t room,
                                                     CompletionTarget* target,
                                                     std::uint8_t opcode) {
        CompressedSession& session = session_;
        const std::uint8_t* cqe = next_cqe64_;
        std::uint32_t parity = owner_parity_;
        Completion shared{};
        bool have_shared = false;
        alignas(8) std::uint8_t expanded[kCqeSize64];
        std::uint32_t taken = 0;
        while (taken < room && session.active()) {
            const std::uint32_t array = session.position / kMiniCqesPerEntry;
            if (array != session.loaded_array) {  // this entry is the array
                std::memcpy(session.minis, cqe, kCqeSize64);
                session.loaded_array = array;
            }
            const std::uint8_t* const mini =
                session.minis + (session.position % kMiniCqesPerEntry) * kMiniCqeSize;
            Completion& completion = completions[taken];
            if (have_shared) {
                completion = shared;
                completion.byte_len = load_big32(mini + kMiniCqeByteCount);
                completion.wr_id =
                    retire(opcode, target,
                           static_cast<std::uint16_t>(
                               load_big16(session.title + kCqeWqeCounter) + session.position));
            } else {
                session.expand(expanded);
                decode(expanded, entry_of(expanded, cqe_stride_),
                       load_big32(expanded + kCqeSopDropQpn), target, completion);
                have_shared = opcode != kCqeRequester && target != nullptr &&
                              completion.status == CompletionStatus::success;
                shared = completion;
            }
            // Not software's on any later pass until the NIC writes it again. The ring is the
            // caller's writable memory (CompletionQueueRing::buffer).
            const_cast<std::uint8_t*>(cqe)[kCqeOpOwn] = static_cast<std::uint8_t>(kCqeInvalid << 4);
            ++session.position;
            ++taken;
            cqe = next_entry(cqe, parity);
        }
        next_cqe64_ = cqe;
        owner_parity_ = static_cast<std::uint8_t>(parity);
        return taken;
    }

    // The CQEs of a requester session (target.send set) from `cqe` on, up to `room` or the
    // session's end: a successful one without a byte count in the two stores
    // complete_plain_send() makes, its WQE counter and WQE opcode from its mini CQE, the table
    // entry cached while the WQE opcode repeats, and the send queue's consumer index written
    // once, after the last. Other WQE opcodes (a read's or an atomic's byte count, or one the
    // table does not know) take take_other_mini(). Moves `cqe` and `parity` past the entries
    // taken, rewriting each, and returns how many.
    RDMACHAN_ALWAYS_INLINE std::uint32_t take_requester_minis(Completion* completions,
                                                              std::uint32_t room,
                                                              const std::uint8_t*& cqe,
                                                              std::uint32_t& parity,
                                                              CompletionTarget& target,
                                                              std::uint32_t qpn) {
        CompressedSession& session = session_;
        SendQueueTracking& send = *target.send;
        const std::uint64_t* const wr_ids = send.wr_id;
        const std::uint32_t wqe_mask = (target.send_wqe_count - 1) & 0xffff;
        const std::uint64_t qpn_word = static_cast<std::uint64_t>(qpn) << 32;
        // Locals: the stores into the completions and the ring may alias the members.
        const std::size_t stride = cqe_stride_;
        const std::uint8_t* const ring_end = end_cqe64_;
        const std::uint8_t* walk = cqe;
        std::uint32_t walk_parity = parity;
        const std::uint32_t left = session.size - session.position;
        const std::uint32_t count = room < left ? room : left;
        std::uint32_t position = session.position;
        const std::uint32_t end = position + count;
        // The last plain table entry taken, kept across polls (the table does not change).
        std::uint32_t cached_opcode = mini_cached_opcode_;
        std::uint64_t cached_bytes = mini_cached_bytes_;
        std::size_t last_slot = kNoSlot;
        Completion* completion = completions;
        while (position < end) {
            if ((position % kMiniCqesPerEntry) == 0 &&
                position / kMiniCqesPerEntry != session.loaded_array) {  // this entry is the array
                std::memcpy(session.minis, walk, kCqeSize64);
                session.loaded_array = position / kMiniCqesPerEntry;
            }
            // The mini CQEs of the loaded array, up to its end, the last one taken or the ring's
            // end, whichever comes first: the loop below checks one bound.
            const std::uint32_t array_end = (position | (kMiniCqesPerEntry - 1)) + 1;
            std::uint32_t chunk_end = array_end < end ? array_end : end;
            const auto to_ring_end =
                static_cast<std::uint32_t>((ring_end - walk) >> cqe_stride_shift_);
            if (chunk_end - position > to_ring_end) chunk_end = position + to_ring_end;
            const std::uint8_t* mini = session.minis + (position % kMiniCqesPerEntry) * kMiniCqeSize;
            const std::uint8_t* const chunk_minis_end = mini + (chunk_end - position) * kMiniCqeSize;
            for (; mini != chunk_minis_end; mini += kMiniCqeSize, ++completion) {
                const std::uint32_t opcode = mini[kMiniCqeWqeOpcode];
                bool plain = true;
                if (RDMACHAN_UNLIKELY(opcode != cached_opcode)) {
                    const std::uint32_t entry = requester_entry(opcode);
                    plain = entry <= kRequesterPlainEntryMax;
                    if (plain) {
                        cached_opcode = opcode;
                        cached_bytes = entry;
                    } else {
                        const auto at = static_cast<std::uint32_t>(
                            chunk_end - (chunk_minis_end - mini) / kMiniCqeSize);
                        last_slot = take_other_mini(*completion, mini, entry, at, last_slot,
                                                    target, qpn_word);
                    }
                }
                if (RDMACHAN_LIKELY(plain)) {
                    unsigned char* const out = reinterpret_cast<unsigned char*>(completion);
                    std::memcpy(out + offsetof(Completion, status), &cached_bytes, sizeof cached_bytes);
                    std::memcpy(out + offsetof(Completion, byte_len), &qpn_word, sizeof qpn_word);
                    last_slot = static_cast<std::size_t>(load_big16(mini + kMiniCqeWqeCounter) & wqe_mask);
                    store_wr_id(*completion, wr_ids[last_slot]);
                }
                // Not software's on any later pass until the NIC writes it again. The ring is
                // the caller's writable memory (CompletionQueueRing::buffer).
                const_cast<std::uint8_t*>(walk)[kCqeOpOwn] = static_cast<std::uint8_t>(kCqeInvalid << 4);
                walk += stride;
            }
            if (walk == ring_end) {
                walk = first_cqe64_;
                walk_parity ^= 1;
            }
            position = chunk_end;
        }
        if (last_slot != kNoSlot) send.consumer_index = send.wqe_end[last_slot];
        mini_cached_opcode_ = cached_opcode;
        mini_cached_bytes_ = cached_bytes;
        session.position = position;
        cqe = walk;
        parity = walk_parity;
        return count;
    }

    // take_requester_minis() for a mini CQE whose WQE opcode has a table entry with a byte count
    // (a read's, an atomic's) or none: `entry` is that entry. Returns the slot whose WQE the send queue retires after it (kNoSlot: none
    // left to retire, decode() retired it).
    static constexpr std::size_t kNoSlot = ~std::size_t{0};
    RDMACHAN_NOINLINE std::size_t take_other_mini(Completion& completion,
                                                    const std::uint8_t* mini, std::uint32_t entry,
                                                    std::uint32_t position, std::size_t last_slot,
                                                    CompletionTarget& target,
                                                    std::uint64_t qpn_word) {
        SendQueueTracking& send = *target.send;
        if (entry != kRequesterUnknown) {
            std::uint64_t length_qpn = qpn_word;
            if (entry > kRequesterPlainEntryMax) {
                length_qpn |=
                    (entry & kRequesterLengthFromCqe) != 0 ? load_big32(mini + kMiniCqeByteCount) : 8;
            }
            const std::uint64_t bytes = entry & kRequesterPlainEntryMax;
            unsigned char* const out = reinterpret_cast<unsigned char*>(&completion);
            std::memcpy(out + offsetof(Completion, status), &bytes, sizeof bytes);
            std::memcpy(out + offsetof(Completion, byte_len), &length_qpn, sizeof length_qpn);
            const std::uint32_t slot = load_big16(mini + kMiniCqeWqeCounter) & (target.send_wqe_count - 1);
            store_wr_id(completion, send.wr_id[slot]);
            return slot;
        }
        // Decoded as the NIC would have written it uncompressed; the WQEs before it retire first.
        if (last_slot != kNoSlot) send.consumer_index = send.wqe_end[last_slot];
        CompressedSession& session = session_;
        session.position = position;
        alignas(8) std::uint8_t expanded[kCqeSize64];
        session.expand(expanded);
        decode(expanded, entry_of(expanded, cqe_stride_), load_big32(expanded + kCqeSopDropQpn),
               &target, completion);
        return kNoSlot;
    }

    // decode()'s second argument: the CQE's op_own and the CQE size.
    RDMACHAN_HOST_DEVICE static std::uint32_t entry_of(const std::uint8_t* cqe, std::size_t size) {
        return cqe[kCqeOpOwn] | static_cast<std::uint32_t>(size) << 8;
    }

    // The entry after `cqe`; past the ring's end, the first, on the next pass.
    RDMACHAN_HOST_DEVICE const std::uint8_t* next_entry(const std::uint8_t* cqe,
                                                        std::uint32_t& parity) const {
        cqe += cqe_stride_;
        if (cqe == end_cqe64_) {
            cqe = first_cqe64_;
            parity ^= 1;
        }
        return cqe;
    }

    // Where a walk from `cqe` for at most `room` entries stops: at the ring end or after them.
    RDMACHAN_ALWAYS_INLINE const std::uint8_t* pass_limit(const std::uint8_t* cqe,
                                                          std::uint32_t room) const {
        const std::size_t to_end = static_cast<std::size_t>(end_cqe64_ - cqe);
        const std::size_t wanted = static_cast<std::size_t>(room) * cqe_stride_;
        return cqe + (wanted < to_end ? wanted : to_end);
    }

    // Advances the consumer index by `count` and writes it to the CQ doorbell record.
    RDMACHAN_ALWAYS_INLINE std::uint32_t finish(std::uint32_t count) {
        const std::uint32_t consumer_index = consumer_index_ + count;
        consumer_index_ = consumer_index;
        // The NIC reads the consumer index to know which entries it may overwrite; the release
        // orders it after every read of the CQEs it frees.
        store_release32(ring_.doorbell_record + kCqSetConsumerIndex,
                        host_to_big32(consumer_index & 0xffffff));
        return count;
    }

    // A successful requester completion: fills the completion in three 8-byte stores and returns
    // the send queue's consumer index after the WQE the CQE names (one signaled completion
    // retires every unsignaled WQE before it).
    RDMACHAN_ALWAYS_INLINE static std::uint32_t complete_send(
        Completion& completion, const std::uint8_t* cqe, const std::uint64_t* wr_ids,
        const std::uint32_t* wqe_ends, std::uint32_t wqe_mask, std::uint32_t entry,
        std::uint64_t qpn_word) {
        store_send_fields(completion, cqe, entry, qpn_word);
        const std::uint32_t slot = wqe_counter(cqe) & wqe_mask;
        store_wr_id(completion, wr_ids[slot]);
        return wqe_ends[slot];
    }

    // complete_send() for an entry without byte_len: `bytes` is the entry.
    RDMACHAN_ALWAYS_INLINE static std::uint32_t complete_plain_send(
        Completion& completion, const std::uint8_t* cqe, const std::uint64_t* wr_ids,
        const std::uint32_t* wqe_ends, std::uint32_t wqe_mask, std::uint64_t bytes,
        std::uint64_t qpn_word) {
        unsigned char* const out = reinterpret_cast<unsigned char*>(&completion);
        std::memcpy(out + offsetof(Completion, status), &bytes, sizeof bytes);
        std::memcpy(out + offsetof(Completion, byte_len), &qpn_word, sizeof qpn_word);
        const std::uint32_t slot = wqe_counter(cqe) & wqe_mask;
        store_wr_id(completion, wr_ids[slot]);
        return wqe_ends[slot];
    }

    // Completion bytes 8-23 of a successful requester completion: status to dlid_path_bits from
    // the table entry, byte_len and qp_num.
    RDMACHAN_ALWAYS_INLINE static void store_send_fields(Completion& completion,
                                                         const std::uint8_t* cqe,
                                                         std::uint32_t entry,
                                                         std::uint64_t qpn_word) {
        std::uint64_t length_qpn = qpn_word;
        const std::uint64_t bytes = entry & kRequesterPlainEntryMax;
        if (RDMACHAN_UNLIKELY(entry != bytes)) {
            length_qpn |=
                (entry & kRequesterLengthFromCqe) != 0 ? load_big32(cqe + kCqeByteCount) : 8;
        }
        unsigned char* const out = reinterpret_cast<unsigned char*>(&completion);
        std::memcpy(out + offsetof(Completion, status), &bytes, sizeof bytes);
        std::memcpy(out + offsetof(Completion, byte_len), &length_qpn, sizeof length_qpn);
    }

    // Stored on its own, after the others: the compiler would otherwise pair it with the status
    // word into one 16-byte vector store, built with two more instructions.
    RDMACHAN_ALWAYS_INLINE static void store_wr_id(Completion& completion, std::uint64_t wr_id) {
        unsigned char* const out = reinterpret_cast<unsigned char*>(&completion);
#if !defined(__CUDA_ARCH__)
        asm("" : "+m"(*out));
#endif
        std::memcpy(out + offsetof(Completion, wr_id), &wr_id, sizeof wr_id);
    }

    // wqe_counter in bits 15:0, with sop_drop_qpn's low 16 bits above it: one load and a byte
    // swap, for a mask below 2^16.
    RDMACHAN_ALWAYS_INLINE static std::uint32_t wqe_counter(const std::uint8_t* cqe) {
        static_assert(kCqeWqeCounter == kCqeSopDropQpn + 4);
        return load_big32(cqe + kCqeWqeCounter - 2);
    }

    RDMACHAN_ALWAYS_INLINE static std::uint32_t load32(const std::uint8_t* source) {
        std::uint32_t value;
        std::memcpy(&value, source, sizeof value);
        return value;
    }

    // A requester completion's status, opcode and flags as Completion bytes 8-10 (bytes 11-15,
    // is_receive to dlid_path_bits, are zero), by the WQE opcode, with bits 31:24 saying what
    // the three stores cannot carry as they stand: byte_len from the CQE (RDMA read) or 8
    // (atomics), or an opcode we do not post (decode() reports it as a general error).
    static constexpr std::uint32_t kRequesterLengthFromCqe = 1u << 24;
    static constexpr std::uint32_t kRequesterLengthEight = 2u << 24;
    static constexpr std::uint32_t kRequesterUnknown = 0xff000000u;
    static constexpr std::uint32_t kRequesterPlainEntryMax = 0xffffff;
    RDMACHAN_ALWAYS_INLINE static constexpr std::uint32_t requester_bytes(CompletionOpcode opcode,
                                                                          std::uint8_t flags) {
        return static_cast<std::uint32_t>(CompletionStatus::success) |
               static_cast<std::uint32_t>(opcode) << 8 | static_cast<std::uint32_t>(flags) << 16;
    }
    RDMACHAN_HOST_DEVICE static constexpr std::uint32_t requester_fields(std::uint32_t wqe_opcode) {
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
                return requester_bytes(CompletionOpcode::rdma_read, 0) | kRequesterLengthFromCqe;
            case kOpcodeAtomicCompareAndSwap:
                return requester_bytes(CompletionOpcode::atomic_compare_and_swap, 0) |
                       kRequesterLengthEight;
            case kOpcodeAtomicFetchAndAdd:
                return requester_bytes(CompletionOpcode::atomic_fetch_and_add, 0) |
                       kRequesterLengthEight;
            case kOpcodeUmr:
                // LOCAL_INV or a key configuration: the send tracking says which, so decode()
                // takes it.
                return kRequesterUnknown;
            default:
                return kRequesterUnknown;
        }
    }
    struct RequesterTable {
        std::uint32_t entry[256];
    };
    static constexpr RequesterTable make_requester_table() {
        RequesterTable table{};
        for (std::uint32_t opcode = 0; opcode < 256; ++opcode)
            table.entry[opcode] = requester_fields(opcode);
        return table;
    }
    RDMACHAN_ALWAYS_INLINE static std::uint32_t requester_entry(std::uint32_t wqe_opcode) {
#if defined(__CUDA_ARCH__)
        return requester_fields(wqe_opcode);
#else
        // One load indexed by the opcode byte, instead of a range check and a branch per field.
        static constexpr RequesterTable kTable = make_requester_table();
        return kTable.entry[wqe_opcode];
#endif
    }
    static_assert(offsetof(Completion, status) == 8 && offsetof(Completion, opcode) == 9 &&
                      offsetof(Completion, flags) == 10 && offsetof(Completion, is_receive) == 11 &&
                      offsetof(Completion, vendor_error) == 12 &&
                      offsetof(Completion, syndrome) == 13 && offsetof(Completion, sl) == 14 &&
                      offsetof(Completion, dlid_path_bits) == 15 &&
                      offsetof(Completion, byte_len) == 16 && offsetof(Completion, qp_num) == 20 &&
                      sizeof(bool) == 1 && static_cast<int>(CompletionStatus::success) == 0,
                  "complete_send() fills Completion bytes 0-23 in three words in this order");

    // Everything but the common requester CQE: responder, error, unknown-QP and other CQEs.
    // `entry` is the CQE's op_own in bits 7:0 and the CQ's CQE size above (five arguments: the
    // poll loop keeps its cursor in the sixth argument register).
    RDMACHAN_COLD static void decode(const std::uint8_t* cqe, std::uint32_t entry,
                                     std::uint32_t sop_drop_qpn, CompletionTarget* target,
                                     Completion& completion) {
        const std::uint8_t op_own = static_cast<std::uint8_t>(entry);
        const std::uint32_t cqe_size = entry >> 8;
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
        const std::uint32_t format = (op_own >> 2) & 3;
        if (RDMACHAN_UNLIKELY(format != 0 && opcode <= kCqeResponderSendInvalidate &&
                              (format == kCqeFormatCompressed || !target->scatter_to_cqe))) {
            // Inline-scatter format on a QP created without scatter-to-CQE, or a compressed
            // CQE on a CQ created without compression (or a malformed title).
            completion.wr_id = retire(opcode, target, wqe_counter);
            completion.status = CompletionStatus::local_qp_operation_error;
            return;
        }
        switch (opcode) {
            case kCqeRequester: {
                if (RDMACHAN_UNLIKELY(target->send == nullptr)) {
                    completion.wr_id = 0;
                    completion.status = CompletionStatus::general_error;
                    return;
                }
                completion.wr_id = retire_send(*target->send, target->send_wqe_count, wqe_counter);
                completion.status = CompletionStatus::success;
                decode_requester_opcode(cqe, sop_drop_qpn >> 24, completion);
                // A UMR WQE's completion opcode was recorded when it was posted (libmlx5
                // sq.wr_data[]); without the record it can only have been a LOCAL_INV.
                if ((sop_drop_qpn >> 24) == kOpcodeUmr && target->send->umr_opcode != nullptr)
                    completion.opcode = static_cast<CompletionOpcode>(
                        target->send->umr_opcode[wqe_counter & (target->send_wqe_count - 1)]);
                if (RDMACHAN_UNLIKELY(format != 0))
                    completion.status = scatter_requester(cqe, format, cqe_size, *target,
                                                          wqe_counter, completion.byte_len);
                return;
            }
            case kCqeResponderWriteImmediate:
            case kCqeResponderSend:
            case kCqeResponderSendImmediate:
            case kCqeResponderSendInvalidate: {
                completion.wr_id = retire(opcode, target, wqe_counter);
                completion.status = CompletionStatus::success;
                decode_responder(cqe, opcode, completion);
                if (RDMACHAN_UNLIKELY(format != 0)) {
                    completion.status = scatter_responder(cqe, format, cqe_size, *target,
                                                          wqe_counter, completion.byte_len);
                    // A receive whose data did not fit reports no flags, as libmlx5's does.
                    if (completion.status != CompletionStatus::success) completion.flags = 0;
                }
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

    // A read's or an atomic's response data in the CQE goes to the buffers of the WQE the CQE
    // names (mlx5_copy_to_send_wqe); anything else with data is what libmlx5 reports.
    RDMACHAN_HOST_DEVICE static CompletionStatus scatter_requester(
        const std::uint8_t* cqe, std::uint32_t format, std::uint32_t cqe_size,
        const CompletionTarget& target, std::uint16_t wqe_counter, std::uint32_t byte_len) {
        const std::uint8_t* const data = inline_scatter_data(cqe, format, cqe_size);
        if (data == nullptr || target.send_ring == nullptr)
            return CompletionStatus::local_qp_operation_error;
        switch (
            scatter_to_send(target.send_ring, target.send_wqe_count, wqe_counter, data, byte_len)) {
            case SendScatterResult::placed:
                return CompletionStatus::success;
            case SendScatterResult::too_long:
                return CompletionStatus::local_length_error;
            case SendScatterResult::wrong_opcode:
                break;
        }
        return CompletionStatus::remote_invalid_request;
    }

    // A received message's data in the CQE goes to the buffers of the receive WQE it consumed
    // (mlx5_copy_to_recv_wqe, mlx5_copy_to_recv_srq).
    RDMACHAN_HOST_DEVICE static CompletionStatus scatter_responder(
        const std::uint8_t* cqe, std::uint32_t format, std::uint32_t cqe_size,
        const CompletionTarget& target, std::uint16_t wqe_counter, std::uint32_t byte_len) {
        const std::uint8_t* const data = inline_scatter_data(cqe, format, cqe_size);
        const std::uint8_t* segments = nullptr;
        std::uint32_t count = 0;
        if (target.shared_receive != nullptr) {
            const SharedReceiveQueueRing& ring = target.shared_receive->ring();
            segments = ring.buffer +
                       static_cast<std::size_t>(wqe_counter & (ring.wqe_count - 1)) * ring.stride +
                       kSrqNextSegmentSize;
            count = target.shared_receive->max_sge();
        } else if (target.receive != nullptr) {
            const ReceiveQueueRing& ring = target.receive->ring();
            const std::uint32_t list = target.receive->max_sge() * kDataSegmentSize;
            segments = ring.buffer +
                       static_cast<std::size_t>(wqe_counter & (ring.wqe_count - 1)) * ring.stride +
                       (ring.stride - list);
            count = target.receive->max_sge();
        }
        if (data == nullptr || segments == nullptr)
            return CompletionStatus::local_qp_operation_error;
        return scatter_to_receive(segments, count, data, byte_len)
                   ? CompletionStatus::success
                   : CompletionStatus::local_length_error;
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
    std::size_t cqe_stride_ = 64;  // ring_.cqe_size, in pointer width
    std::uint32_t cqe_stride_shift_ = 6;  // its log2 (CQEs are 64 or 128 bytes)
    const std::uint8_t* next_cqe64_ = nullptr;
    std::uint8_t owner_parity_ = 0;
    std::uint8_t arm_sequence_ = 0;  // 2 bits: the completion events taken, modulo 4
    std::uint32_t consumer_index_ = 0;
    // The compressed session being consumed; its next entry is marked (take_session).
    CompressedSession session_{};
    // take_requester_minis()'s last plain WQE opcode (0x100: none yet) and its table entry.
    std::uint32_t mini_cached_opcode_ = 0x100;
    std::uint64_t mini_cached_bytes_ = 0;
};

}  // namespace rdmachan::mlx5
