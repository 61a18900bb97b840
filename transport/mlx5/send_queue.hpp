// The mlx5 send-queue encoder: writes WQEs straight into the send ring and rings the doorbell
// (doorbell record, then BlueFlame copy or 8-byte doorbell). Layouts and ordering follow
// mlx5-facts.md §1, §3 and §4; the bytes are checked against libmlx5's own by
// mlx5-golden-check. Header-only and free of exceptions, allocation and locks, so that it
// also runs as CUDA device code. One SendQueue is used by one thread at a time.
//
// The common WQE (no inline payload, not reaching the ring end, room to spare) takes a fast
// path with no per-segment wrap checks; everything else goes through one out-of-line general
// path. Both write the segments with the same helpers (wqe_segments.hpp), so they cannot drift
// apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/completion.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/umr_segments.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/mlx5/wqe_segments.hpp"

// The general path stays out of line so that the hot loop keeps its registers.
#if defined(__CUDACC__)
#define RDMACHAN_SEND_COLD __noinline__
#else
#define RDMACHAN_SEND_COLD __attribute__((noinline, cold))
#endif

namespace rdmachan::mlx5 {

struct SendQueueConfig {
    std::uint32_t max_sge = 1;
    std::uint32_t max_inline_data = 0;
    bool signal_all = false;       // sq_sig_all: every WQE asks for a CQE
    bool prefer_blueflame = true;  // BlueFlame for every eligible single-WQE post, not only inline
    bool dc_initiator = false;     // WQEs carry a 48-byte address vector after the ctrl segment
    bool wqe_signature = false;    // the QP was created with WQ signatures (rarely used)
};

class SendQueue {
  public:
    SendQueue() = default;

    RDMACHAN_HOST_DEVICE SendQueue(const SendQueueRing& ring, const SendQueueTracking& tracking,
                                   const SendQueueConfig& config)
        : ring_(ring),
          tracking_(tracking),
          config_(config),
          ring_end_(ring.buffer +
                    static_cast<std::size_t>(ring.wqe_count) * kSendWqeBasicBlockSize),
          mask_(ring.wqe_count - 1),
          qpn_big_(host_to_big32(ring.qpn << 8)),
          header_units_(config.dc_initiator ? kDciHeaderUnits : 1),
          // ctrl bytes 8-11 as a little-endian word: fm_ce_se is the top byte.
          signal_all_word_(config.signal_all ? static_cast<std::uint32_t>(kCtrlCqUpdate) << 24 : 0),
          // Up to this many SGEs a WQE can neither exceed max_sge nor the 6-bit ds (ctrl, AV,
          // remote address and atomic take at most 6 units).
          fast_path_max_sge_(detail::minimum(config.max_sge, kMaxDs - 6)),
          // The largest WQE the fast path writes: ctrl, address vector, remote address and
          // atomic segments, and every SGE it accepts. A WQ signature is computed over the
          // finished WQE, which only the general path does, so with WQ signatures no room is
          // ever enough and every WQE, also one without SGEs, gets its signature there. The
          // fast path takes one SGE without comparing it with max_sge, so a queue without SGEs
          // has no fast path either.
          fast_path_max_wqebbs_(config.wqe_signature || config.max_sge == 0
                                    ? kNoFastPath
                                    : (header_units_ + 2 + fast_path_max_sge_ + 3) / 4),
          // The inlined RC post writes one SGE only (several go to the general path), so its
          // WQEs are all kOneSgeWqebbs<1> long.
          rc_fast_path_max_wqebbs_(config.dc_initiator || fast_path_max_wqebbs_ == kNoFastPath
                                       ? kNoFastPath
                                       : kOneSgeWqebbs<1>),
          blueflame_max_ds_(ring.blueflame_size / kSegmentUnit),
          blueflame_preferred_max_ds_(config.prefer_blueflame ? ring.blueflame_size / kSegmentUnit
                                                              : 0),
          // BlueFlame wants ds > 1 and ds <= the preferred maximum: one unsigned compare of
          // ds - 2 against this.
          blueflame_fast_limit_(blueflame_preferred_max_ds_ >= 2 ? blueflame_preferred_max_ds_ - 1
                                                                 : 0),
          blueflame_one_block_limit_(detail::minimum(blueflame_fast_limit_, 3)),
          pending_blueflame_max_ds_(blueflame_preferred_max_ds_),
          pending_start_(tracking.producer_index) {
        refresh_fast_room();
    }

    // Writes up to `count` WQEs and rings one doorbell for all of them (and for any written
    // earlier with write()). Stops at the first request that is refused; *posted says how many
    // were written.
    RDMACHAN_ALWAYS_INLINE PostResult post(const SendWorkRequest* requests, std::uint32_t count,
                                           std::uint32_t* posted) {
        // RC or DCI is decided once per post, so the encoder knows its header size. The RC post
        // is inlined into the caller; the DCI one is the same code, out of line. A DCI's
        // rc_fast_path_max_wqebbs_ fails the RC post's room check, which sends it there.
        return post_fast<1, false>(requests, count, posted);
    }

    // Writes one WQE without ringing the doorbell, so callers can batch across calls. A refused
    // request writes nothing into the ring.
    RDMACHAN_ALWAYS_INLINE PostResult write(const SendWorkRequest& request) {
        return header_units_ == 1 ? write_checked<1>(request)
                                  : write_checked<kDciHeaderUnits>(request);
    }

    // Makes every WQE written since the last doorbell visible to the NIC (mlx5-facts.md §4).
    RDMACHAN_HOST_DEVICE void ring_doorbell() {
        ring_doorbell(tracking_.producer_index, pending_last_wqe_);
    }

    RDMACHAN_HOST_DEVICE std::uint32_t free_wqebbs() const {
        return ring_.wqe_count - (tracking_.producer_index - tracking_.consumer_index);
    }

    RDMACHAN_HOST_DEVICE SendQueueTracking& tracking() { return tracking_; }
    RDMACHAN_HOST_DEVICE const SendQueueRing& ring() const { return ring_; }
    RDMACHAN_HOST_DEVICE std::uint32_t blueflame_offset() const { return blueflame_offset_; }
    RDMACHAN_HOST_DEVICE void set_blueflame_offset(std::uint32_t offset) {
        blueflame_offset_ = offset;
    }
    // Whether WQEs were written with write() that no doorbell covers yet.
    RDMACHAN_HOST_DEVICE bool doorbell_pending() const {
        return tracking_.producer_index != pending_start_;
    }

    // After a QP is reset (DCI recovery), the producer index restarts at 0 (mlx5-facts.md §6).
    RDMACHAN_HOST_DEVICE void reset() {
        tracking_.producer_index = 0;
        tracking_.consumer_index = 0;
        pending_start_ = 0;
        pending_blueflame_max_ds_ = blueflame_preferred_max_ds_;
        next_fence_ = 0;
        refresh_fast_room();
    }

  private:
    // ctrl plus the 48-byte address vector on a DC initiator.
    static constexpr std::uint32_t kDciHeaderUnits = 1 + kAddressVectorSize / kSegmentUnit;
    static constexpr std::uint32_t kNoFastPath = ~0u;
    // The WQEBBs of a fast-path WQE with one SGE: the same for every opcode (no, one or two
    // header segments after ctrl and the address vector).
    template <std::uint32_t kHeaderUnits>
    static constexpr std::uint32_t kOneSgeWqebbs = (kHeaderUnits + 1 + 3) / 4;
    static_assert(kOneSgeWqebbs<1> == (1 + 2 + 1 + 3) / 4 &&
                  kOneSgeWqebbs<kDciHeaderUnits> == (kDciHeaderUnits + 2 + 1 + 3) / 4);

    // Where the fast path writes: the next WQE's slot and address, and where the last one went.
    // Held in registers across a post's WQEs: ring stores may alias any member. The fast path
    // never reaches past the ring end, so the slot only grows (up to wqe_count) and the
    // producer index is index_base + slot; the tracking arrays are indexed by the slot itself.
    struct Cursor {
        // Pointer-sized, so that it indexes the tracking arrays without a zero extension.
        std::size_t slot;
        std::uint32_t index_base;  // the producer index with the slot bits cleared
        std::uint8_t* wqe;
        std::uint8_t* last_wqe;
        std::uint32_t qpn_big;
        std::uint64_t* wr_ids;
        std::uint32_t* wqe_ends;

        RDMACHAN_HOST_DEVICE std::uint32_t producer_index() const {
            return index_base + static_cast<std::uint32_t>(slot);
        }
    };

    RDMACHAN_ALWAYS_INLINE Cursor load_cursor(std::uint32_t producer_index) const {
        const std::uint32_t slot = producer_index & mask_;
        return {slot,
                producer_index - slot,
                ring_.buffer + std::size_t{slot} * kSendWqeBasicBlockSize,
                pending_last_wqe_,
                qpn_big_,
                tracking_.wr_id,
                tracking_.wqe_end};
    }

    RDMACHAN_HOST_DEVICE std::uint8_t* wqe_at(std::uint32_t producer_index) const {
        return ring_.buffer +
               static_cast<std::size_t>(producer_index & mask_) * kSendWqeBasicBlockSize;
    }

    // Whether `count` of the largest WQE the fast post writes fit in its room.
    template <std::uint32_t kHeaderUnits>
    RDMACHAN_ALWAYS_INLINE bool fast_room_fits(std::uint32_t count) const {
        const std::uint32_t max_wqebbs =
            kHeaderUnits == 1 ? rc_fast_path_max_wqebbs_ : fast_path_max_wqebbs_;
        return count != 0 && static_cast<std::uint64_t>(count) * max_wqebbs <=
                                 post_fast_end_ - tracking_.producer_index;
    }

    // The fast room is computed only when the general path writes a WQE, so it runs out at the
    // ring end (and where the free room ended) even when completions have freed the ring since.
    // A post that does not fit computes it afresh once, unless WQEs written with write() wait for
    // a doorbell (the general post rings for them).
    RDMACHAN_HOST_DEVICE void refresh_fast_room() {
        if (doorbell_pending()) return;
        refresh_fast_end();
        post_fast_end_ = fast_end_;
    }

    // The post: when `count` of the largest fast-path WQE fit before the ring end and in the free
    // room, no WQE of the batch needs a room check of its own. Everything else, and any request
    // the fast path does not take, continues on the general post. kRefreshed: the fast room was
    // just recomputed, so a post that does not fit goes to the general post.
    template <std::uint32_t kHeaderUnits, bool kRefreshed>
    RDMACHAN_ALWAYS_INLINE PostResult post_fast(const SendWorkRequest* requests,
                                                std::uint32_t count, std::uint32_t* posted) {
        if (RDMACHAN_UNLIKELY(!fast_room_fits<kHeaderUnits>(count))) {
            if (kHeaderUnits == 1 && header_units_ != 1) return post_dci(requests, count, posted);
            if constexpr (!kRefreshed) return post_refreshed<kHeaderUnits>(requests, count, posted);
            return post_general<kHeaderUnits>(requests, count, 0, posted);
        }
        const std::uint32_t start = tracking_.producer_index;
        constexpr bool kMultiSge = kHeaderUnits != 1;
        Cursor cursor = load_cursor(start);
        const SendWorkRequest* const end = requests + count;
        const SendWorkRequest* const stop =
            write_runs<kHeaderUnits, kMultiSge>(requests, end, cursor);
        const std::uint32_t producer_index = cursor.producer_index();
        tracking_.producer_index = producer_index;
        // With one SGE per WQE every fast-path WQE has the same WQEBB count, so the last one is
        // found from the next slot instead of being carried through the loop.
        std::uint8_t* const last_wqe =
            kMultiSge ? cursor.last_wqe
                      : cursor.wqe - kOneSgeWqebbs<kHeaderUnits> * kSendWqeBasicBlockSize;
        if (RDMACHAN_UNLIKELY(stop != end)) {
            // The general post rings for the WQEs written here too: they are pending.
            if (producer_index != start) {
                pending_last_wqe_ = last_wqe;
                pending_blueflame_max_ds_ = blueflame_preferred_max_ds_;
            }
            return post_general<kHeaderUnits>(stop, static_cast<std::uint32_t>(end - stop),
                                              static_cast<std::uint32_t>(stop - requests), posted);
        }
        ring_doorbell_fast(producer_index, last_wqe, count == 1);
        if (posted != nullptr) *posted = count;
        return PostResult::ok;
    }

    // The DCI post is out of line already: it refreshes the fast room before its only copy of the
    // fast path.
    RDMACHAN_NOINLINE PostResult post_dci(const SendWorkRequest* requests, std::uint32_t count,
                                          std::uint32_t* posted) {
        if (!fast_room_fits<kDciHeaderUnits>(count)) refresh_fast_room();
        return post_fast<kDciHeaderUnits, true>(requests, count, posted);
    }

    template <std::uint32_t kHeaderUnits>
    RDMACHAN_COLD PostResult post_refreshed(const SendWorkRequest* requests, std::uint32_t count,
                                            std::uint32_t* posted) {
        refresh_fast_room();
        return post_fast<kHeaderUnits, true>(requests, count, posted);
    }

    // Requests one at a time, each checked for room: after a request the fast path did not
    // take, a batch larger than the fast room, or a post of nothing (which still rings for
    // WQEs written with write()). `done` requests of this post were already written.
    template <std::uint32_t kHeaderUnits>
    RDMACHAN_NOINLINE PostResult post_general(const SendWorkRequest* requests, std::uint32_t count,
                                              std::uint32_t done, std::uint32_t* posted) {
        PostResult result = PostResult::ok;
        std::uint32_t written = 0;
        for (; written < count; ++written) {
            result = write_checked<kHeaderUnits>(requests[written]);
            if (RDMACHAN_UNLIKELY(result != PostResult::ok)) break;
        }
        ring_doorbell(tracking_.producer_index, pending_last_wqe_);
        if (posted != nullptr) *posted = done + written;
        return result;
    }

    // One WQE through the fast path if it fits the fast room, else through the general path.
    template <std::uint32_t kHeaderUnits>
    RDMACHAN_ALWAYS_INLINE PostResult write_checked(const SendWorkRequest& request) {
        const std::uint32_t start = tracking_.producer_index;
        Cursor cursor = load_cursor(start);
        if (RDMACHAN_LIKELY(fast_end_ - start >= fast_path_max_wqebbs_) &&
            write_one<kHeaderUnits>(request, cursor)) {
            const std::uint32_t producer_index = cursor.producer_index();
            tracking_.producer_index = producer_index;
            pending_last_wqe_ = cursor.last_wqe;
            pending_blueflame_max_ds_ = blueflame_preferred_max_ds_;
            post_fast_end_ = producer_index;
            return PostResult::ok;
        }
        const PostResult result = write_general(request);
        if (result == PostResult::ok) post_fast_end_ = tracking_.producer_index;
        return result;
    }

    // The fast path over a batch. Consecutive requests with the same opcode stay in that
    // opcode's loop, so the opcode is dispatched through the jump table only when it changes.
    // Returns the first request not written (`end` when all were).
    template <std::uint32_t kHeaderUnits, bool kMultiSge>
    RDMACHAN_ALWAYS_INLINE const SendWorkRequest* write_runs(const SendWorkRequest* request,
                                                             const SendWorkRequest* end,
                                                             Cursor& cursor) {
        for (;;) {
            bool more;
            switch (request->opcode) {
                case SendOpcode::rdma_write:
                    more = write_run<SendOpcode::rdma_write, kHeaderUnits, kMultiSge>(request, end,
                                                                                      cursor);
                    break;
                case SendOpcode::rdma_write_with_immediate:
                    more =
                        write_run<SendOpcode::rdma_write_with_immediate, kHeaderUnits, kMultiSge>(
                            request, end, cursor);
                    break;
                case SendOpcode::send:
                    more =
                        write_run<SendOpcode::send, kHeaderUnits, kMultiSge>(request, end, cursor);
                    break;
                case SendOpcode::send_with_immediate:
                    more = write_run<SendOpcode::send_with_immediate, kHeaderUnits, kMultiSge>(
                        request, end, cursor);
                    break;
                case SendOpcode::send_with_invalidate:
                    more = write_run<SendOpcode::send_with_invalidate, kHeaderUnits, kMultiSge>(
                        request, end, cursor);
                    break;
                case SendOpcode::rdma_read:
                    more = write_run<SendOpcode::rdma_read, kHeaderUnits, kMultiSge>(request, end,
                                                                                     cursor);
                    break;
                case SendOpcode::atomic_compare_and_swap:
                    more = write_run<SendOpcode::atomic_compare_and_swap, kHeaderUnits, kMultiSge>(
                        request, end, cursor);
                    break;
                case SendOpcode::atomic_fetch_and_add:
                    more = write_run<SendOpcode::atomic_fetch_and_add, kHeaderUnits, kMultiSge>(
                        request, end, cursor);
                    break;
                default:
                    return request;  // the general path refuses it
            }
            if (!more) return request;
        }
    }

    // Writes requests with opcode kOpcode until the opcode changes (returns true), the batch ends
    // or a request needs the general path (returns false; `request` is where it stopped).
    template <SendOpcode kOpcode, std::uint32_t kHeaderUnits, bool kMultiSge>
    RDMACHAN_ALWAYS_INLINE bool write_run(const SendWorkRequest*& request,
                                          const SendWorkRequest* end, Cursor& cursor) {
        do {
            if (RDMACHAN_UNLIKELY(
                    (!encode_fast<kOpcode, kHeaderUnits, kMultiSge>(*request, cursor))))
                return false;
            if (++request == end) return false;
        } while (request->opcode == kOpcode);
        return true;
    }

    // One request through the fast path, its opcode dispatched; false if it needs the general path.
    template <std::uint32_t kHeaderUnits>
    RDMACHAN_ALWAYS_INLINE bool write_one(const SendWorkRequest& request, Cursor& cursor) {
        switch (request.opcode) {
            case SendOpcode::rdma_write:
                return encode_fast<SendOpcode::rdma_write, kHeaderUnits, true>(request, cursor);
            case SendOpcode::rdma_write_with_immediate:
                return encode_fast<SendOpcode::rdma_write_with_immediate, kHeaderUnits, true>(
                    request, cursor);
            case SendOpcode::send:
                return encode_fast<SendOpcode::send, kHeaderUnits, true>(request, cursor);
            case SendOpcode::send_with_immediate:
                return encode_fast<SendOpcode::send_with_immediate, kHeaderUnits, true>(request,
                                                                                        cursor);
            case SendOpcode::send_with_invalidate:
                return encode_fast<SendOpcode::send_with_invalidate, kHeaderUnits, true>(request,
                                                                                         cursor);
            case SendOpcode::rdma_read:
                return encode_fast<SendOpcode::rdma_read, kHeaderUnits, true>(request, cursor);
            case SendOpcode::atomic_compare_and_swap:
                return encode_fast<SendOpcode::atomic_compare_and_swap, kHeaderUnits, true>(request,
                                                                                            cursor);
            case SendOpcode::atomic_fetch_and_add:
                return encode_fast<SendOpcode::atomic_fetch_and_add, kHeaderUnits, true>(request,
                                                                                         cursor);
            case SendOpcode::local_invalidate:
            case SendOpcode::configure_memory_key:
                return false;  // UMR WQEs: the general path
        }
        return false;
    }

    // The fast-path encoder: no inline data, no WQ signature, and room before the ring end (the
    // caller checked it for the largest WQE this path writes), so no segment wraps. Returns false,
    // having written nothing, for a request the general path must take.
    template <SendOpcode kOpcode, std::uint32_t kHeaderUnits, bool kMultiSge>
    RDMACHAN_ALWAYS_INLINE bool encode_fast(const SendWorkRequest& request, Cursor& cursor) {
        constexpr std::uint32_t kTraits = detail::opcode_traits(kOpcode);
        constexpr std::uint32_t kHeaderSegments = kTraits >> detail::kTraitSegmentsShift & 3;
        // Inline payloads, and flag bits that are not fm_ce_se bits, go to the general path, so
        // the flags need no mask here.
        const std::uint64_t flags = request.flags;
        if (RDMACHAN_UNLIKELY((flags & ~std::uint64_t{detail::kFmCeSeFlags}) != 0)) return false;
        const std::uint32_t num_sge = request.num_sge;
        const std::uint8_t* address_vector = nullptr;
        if constexpr (kHeaderUnits != 1) {
            address_vector = request.dc_address_vector;
            if (RDMACHAN_UNLIKELY(address_vector == nullptr)) return false;
        }

        std::uint8_t* const wqe = cursor.wqe;
        // The data segments come first: their place is fixed by the opcode. One SGE, the common
        // case, gets a WQE size known at compile time; a single zero-length SGE (which is skipped,
        // not encoded) goes to the general path.
        constexpr std::uint32_t kFixedUnits = kHeaderUnits + kHeaderSegments;
        std::uint8_t* segment = wqe + kFixedUnits * kSegmentUnit;
        const ScatterGatherElement* element = request.sg_list;
        if (RDMACHAN_LIKELY(num_sge == 1)) {
            const std::uint64_t length_lkey = detail::load_length_lkey(*element);
            if (RDMACHAN_UNLIKELY(static_cast<std::uint32_t>(length_lkey) == 0)) return false;
            detail::store_data_segment(segment, length_lkey, element->addr);
            finish_fast<kOpcode, kHeaderUnits, kMultiSge>(request, cursor, address_vector, flags,
                                                          kFixedUnits + 1);
            return true;
        }
        // Other SGE counts are left to the out-of-line paths, so that the inlined RC post needs
        // fewer registers. One SGE is always within max_sge (a queue without SGEs has no fast
        // path); more are checked. Zero-length SGEs are skipped, not encoded (libmlx5
        // set_data_ptr_seg callers).
        if (!kMultiSge || RDMACHAN_UNLIKELY(num_sge > fast_path_max_sge_)) return false;
        std::uint32_t ds = kFixedUnits;
        for (const ScatterGatherElement* const end = element + num_sge; element != end; ++element) {
            const std::uint64_t length_lkey = detail::load_length_lkey(*element);
            if (RDMACHAN_UNLIKELY(static_cast<std::uint32_t>(length_lkey) == 0)) continue;
            detail::store_data_segment(segment, length_lkey, element->addr);
            segment += kDataSegmentSize;
            ++ds;
        }
        finish_fast<kOpcode, kHeaderUnits, kMultiSge>(request, cursor, address_vector, flags, ds);
        return true;
    }

    // The fast-path WQE after its data segments: the segments before them, ctrl, and the
    // bookkeeping. Written twice in encode_fast so that one SGE gets a constant `ds`.
    template <SendOpcode kOpcode, std::uint32_t kHeaderUnits, bool kMultiSge>
    RDMACHAN_ALWAYS_INLINE void finish_fast(const SendWorkRequest& request, Cursor& cursor,
                                            const std::uint8_t* address_vector, std::uint64_t flags,
                                            std::uint32_t ds) {
        constexpr std::uint32_t kTraits = detail::opcode_traits(kOpcode);
        constexpr std::uint32_t kHeaderSegments = kTraits >> detail::kTraitSegmentsShift & 3;
        std::uint8_t* const wqe = cursor.wqe;
        // Held in 64 bits: with a zero immediate it fills ctrl bytes 8-15 in one store.
        std::uint64_t flags_word = flags | signal_all_word_;
        std::uint8_t* segment = wqe + kControlSegmentSize;
        if constexpr (kHeaderUnits != 1) {
            // ctrl + address vector is exactly 64 bytes: it fills this WQEBB.
            std::memcpy(segment, address_vector, kAddressVectorSize);
            segment += kAddressVectorSize;
            flags_word |= static_cast<std::uint64_t>(byte_swap16(request.dci_stream_id)) << 8;
        } else {
            (void)address_vector;
        }
        if constexpr (kHeaderSegments != 0) {
            detail::store_remote_address(segment, request);
            if constexpr (kHeaderSegments == 2)
                detail::store_atomic<kOpcode == SendOpcode::atomic_compare_and_swap>(
                    segment + kRemoteAddressSegmentSize, request);
        }
        const std::size_t slot = cursor.slot;
        const std::uint32_t producer_index = cursor.producer_index();
        // qpn_big_ has a zero ds byte, so adding ds there is an OR.
        detail::store_control(wqe, producer_index, kTraits, cursor.qpn_big + (ds << 24), flags_word,
                      request);

        const std::uint32_t wqebbs = (ds + 3) / 4;
        cursor.wr_ids[slot] = request.wr_id;
        cursor.wqe_ends[slot] = producer_index + wqebbs;
        cursor.slot = slot + wqebbs;
        // Without several SGEs, the caller finds the last WQE from cursor.wqe (kOneSgeWqebbs).
        if constexpr (kMultiSge) cursor.last_wqe = wqe;
        cursor.wqe = wqe + wqebbs * kSendWqeBasicBlockSize;
    }

    // Inline payloads, WQ signatures, WQEs that reach the ring end, and every refusal: sized
    // exactly before a byte is written, then encoded with wrap checks.
    RDMACHAN_SEND_COLD RDMACHAN_HOST_DEVICE PostResult
    write_general(const SendWorkRequest& request) {
        if (request.opcode == SendOpcode::local_invalidate ||
            request.opcode == SendOpcode::configure_memory_key)
            return write_umr(request);
        if (static_cast<std::uint32_t>(request.opcode) >
            static_cast<std::uint32_t>(SendOpcode::atomic_fetch_and_add))
            return PostResult::invalid_request;
        const std::uint32_t traits = detail::opcode_traits(request.opcode);
        if (request.num_sge > config_.max_sge) return PostResult::too_many_sge;
        const bool is_inline = (request.flags & kSendInline) != 0;
        const std::uint32_t header_segments = traits >> detail::kTraitSegmentsShift & 3;
        // Reads and atomics have no outgoing payload to carry inline.
        if (is_inline && (request.opcode == SendOpcode::rdma_read || header_segments == 2)) {
            return PostResult::invalid_request;
        }
        if (header_units_ != 1 && request.dc_address_vector == nullptr)
            return PostResult::invalid_request;
        std::uint32_t data_units = 0;
        std::uint32_t inline_length = 0;
        if (is_inline) {
            for (std::uint32_t i = 0; i < request.num_sge; ++i)
                inline_length += request.sg_list[i].length;
            if (inline_length > config_.max_inline_data) return PostResult::inline_too_large;
            // A zero-length inline payload adds no segment at all (libmlx5 set_data_inl_seg).
            if (inline_length != 0)
                data_units = (inline_length + kInlineHeaderSize + kSegmentUnit - 1) / kSegmentUnit;
        } else {
            for (std::uint32_t i = 0; i < request.num_sge; ++i)
                data_units += request.sg_list[i].length != 0;
        }
        const std::uint32_t ds = header_units_ + header_segments + data_units;
        if (ds > kMaxDs) return PostResult::invalid_request;
        const std::uint32_t wqebbs = (ds + 3) / 4;
        if (wqebbs > free_wqebbs()) return PostResult::queue_full;
        std::uint8_t* const wqe = wqe_at(tracking_.producer_index);
        if (is_inline) {
            encode_general<true>(request, traits, wqe, inline_length);
            // BlueFlame carries inline WQEs even when it is not preferred for others.
            pending_blueflame_max_ds_ = blueflame_max_ds_;
        } else {
            encode_general<false>(request, traits, wqe, 0);
            pending_blueflame_max_ds_ = blueflame_preferred_max_ds_;
        }
        pending_last_wqe_ = wqe;
        refresh_fast_end();
        return PostResult::ok;
    }

    // Completions only ever add free WQEBBs, so a fast end computed earlier is never too far:
    // when the fast path reaches it, the general path takes the next WQE and computes it afresh.
    // A fence owed to the request after a UMR WQE leaves the fast path no room: the general path
    // writes that request and pays the fence.
    RDMACHAN_HOST_DEVICE void refresh_fast_end() {
        const std::uint32_t producer_index = tracking_.producer_index;
        if (next_fence_ != 0) {
            fast_end_ = producer_index;
            return;
        }
        const std::uint32_t before_ring_end = ring_.wqe_count - (producer_index & mask_);
        const std::uint32_t free = free_wqebbs();
        fast_end_ = producer_index + (free < before_ring_end ? free : before_ring_end);
    }

    // Writes the WQE at the producer index and accounts for it; the caller has checked that it
    // fits. Segments start on 16-byte boundaries and the ring end is 64-byte aligned, so a
    // segment either fits before the end or starts exactly at it (mlx5-facts.md §3): a segment
    // pointer that reaches the end continues at the ring start.
    template <bool kInline>
    RDMACHAN_HOST_DEVICE void encode_general(const SendWorkRequest& request, std::uint32_t traits,
                                             std::uint8_t* wqe, std::uint32_t inline_length) {
        const std::uint32_t producer_index = tracking_.producer_index;
        std::uint8_t* const buffer = ring_.buffer;
        std::uint8_t* const ring_end = ring_end_;
        std::uint32_t ds = header_units_;
        // Bytes 8-11 (signature, DCI stream channel, fm_ce_se) are written as one word so that
        // no stale byte of an earlier WQE in this slot survives (mlx5-facts.md §9.1).
        std::uint64_t flags_word = fenced_flags_word(request);

        std::uint8_t* segment = wqe + kControlSegmentSize;
        if (header_units_ != 1) {
            // ctrl + address vector is exactly 64 bytes: it fills this WQEBB. The caller refused
            // a DCI request without one.
            std::memcpy(segment, request.dc_address_vector, kAddressVectorSize);
            segment = detail::next_segment(segment + kAddressVectorSize, buffer, ring_end);
            flags_word |= static_cast<std::uint64_t>(byte_swap16(request.dci_stream_id)) << 8;
        }
        const std::uint32_t header_segments = traits >> detail::kTraitSegmentsShift & 3;
        if (header_segments != 0) {
            detail::store_remote_address(segment, request);
            segment = detail::next_segment(segment + kRemoteAddressSegmentSize, buffer, ring_end);
            ds += header_segments;
            if (header_segments == 2) {
                if (request.opcode == SendOpcode::atomic_compare_and_swap)
                    detail::store_atomic<true>(segment, request);
                else
                    detail::store_atomic<false>(segment, request);
                segment = detail::next_segment(segment + kAtomicSegmentSize, buffer, ring_end);
            }
        }
        if constexpr (kInline) {
            if (inline_length != 0) {
                write_inline(segment, request, inline_length);
                ds += (inline_length + kInlineHeaderSize + kSegmentUnit - 1) / kSegmentUnit;
            }
        } else {
            // A zero-length SGE is skipped, not encoded (libmlx5 set_data_ptr_seg callers).
            const ScatterGatherElement* element = request.sg_list;
            for (const ScatterGatherElement* const end = element + request.num_sge; element != end;
                 ++element) {
                const std::uint64_t length_lkey = detail::load_length_lkey(*element);
                if (static_cast<std::uint32_t>(length_lkey) == 0) continue;
                detail::store_data_segment(segment, length_lkey, element->addr);
                segment = detail::next_segment(segment + kDataSegmentSize, buffer, ring_end);
                ++ds;
            }
        }
        detail::store_control(wqe, producer_index, traits, qpn_big_ | ds << 24, flags_word, request);
        if (config_.wqe_signature) wqe[kCtrlSignature] = signature(wqe, ds * kSegmentUnit);

        const std::uint32_t wqebbs = (ds + 3) / 4;
        const std::uint32_t slot = producer_index & mask_;
        tracking_.wr_id[slot] = request.wr_id;
        tracking_.wqe_end[slot] = producer_index + wqebbs;
        tracking_.producer_index = producer_index + wqebbs;
    }

    // ctrl bytes 8-11 from the request's flags, with the fence a UMR WQE before it owes: libmlx5
    // keeps it in qp->fm_cache across posts, and an explicit fence replaces it (mlx5_post_send,
    // _common_wqe_init_op). Either way the debt is paid by this WQE.
    RDMACHAN_HOST_DEVICE std::uint64_t fenced_flags_word(const SendWorkRequest& request) {
        std::uint64_t flags_word =
            static_cast<std::uint64_t>(request.flags & detail::kFmCeSeFlags) | signal_all_word_;
        if ((request.flags & kSendFence) == 0)
            flags_word |= static_cast<std::uint64_t>(next_fence_) << 24;
        next_fence_ = 0;
        return flags_word;
    }

    // LOCAL_INV or a key configuration (umr_segments.hpp): ctrl, UMR control, mkey context and
    // for a configuration the translation entries. Only an RC queue carries them here (libmlx5
    // writes a DCI's UMR without its address vector; we have no use for that). The next WQE
    // owes the initiator small fence, as libmlx5 sets fm_cache after each.
    RDMACHAN_SEND_COLD RDMACHAN_HOST_DEVICE PostResult write_umr(const SendWorkRequest& request) {
        if (header_units_ != 1) return PostResult::invalid_request;
        const bool configure = request.opcode == SendOpcode::configure_memory_key;
        std::uint32_t translation_bytes = 0;
        std::uint64_t length = 0;
        std::uint32_t key = request.immediate;
        if (configure) {
            // libmlx5 refuses a key configuration without IBV_SEND_INLINE (EOPNOTSUPP): the
            // entries travel inline in the WQE.
            if (request.layout == nullptr || (request.flags & kSendInline) == 0 ||
                tracking_.umr_opcode == nullptr)
                return PostResult::invalid_request;
            const PostResult checked = detail::check_layout(
                *request.layout, config_.max_inline_data, &translation_bytes, &length);
            if (checked != PostResult::ok) return checked;
            key = request.layout->mkey;
        }
        const std::uint32_t ds = kUmrHeaderUnits + translation_bytes / kSegmentUnit;
        if (ds > kMaxDs) return PostResult::too_many_entries;
        const std::uint32_t wqebbs = (ds + 3) / 4;
        if (wqebbs > free_wqebbs()) return PostResult::queue_full;

        const std::uint32_t producer_index = tracking_.producer_index;
        std::uint8_t* const wqe = wqe_at(producer_index);
        std::uint64_t flags_word = fenced_flags_word(request);
        // ctrl.imm: the key to invalidate, or the key being configured.
        flags_word |= static_cast<std::uint64_t>(host_to_big32(key)) << 32;
        // store_control takes a 5-bit opcode from the traits; 0x25 is wider, so ctrl is stored
        // here: opcode, WQE index, qpn_ds, then bytes 8-15 in one store.
        store_big32(wqe + kCtrlOpmodIndexOpcode, kOpcodeUmr);
        store_big16(wqe + kCtrlOpmodIndexOpcode + 1, static_cast<std::uint16_t>(producer_index));
        const std::uint32_t qpn_ds = qpn_big_ | ds << 24;
        std::memcpy(wqe + kCtrlQpnDs, &qpn_ds, sizeof qpn_ds);
        std::memcpy(wqe + kCtrlSignature, &flags_word, sizeof flags_word);
        // ctrl and the UMR control segment fill the first WQEBB; the mkey context the next.
        std::uint8_t* const umr_control = wqe + kControlSegmentSize;
        std::uint8_t* const mkey_context =
            detail::next_segment(wqe + kSendWqeBasicBlockSize, ring_.buffer, ring_end_);
        if (configure) {
            detail::store_configure(umr_control, mkey_context, *request.layout, translation_bytes,
                                    length);
            detail::store_translation(
                detail::next_segment(mkey_context + kMkeyContextSegmentSize, ring_.buffer,
                                     ring_end_),
                ring_.buffer, ring_end_, *request.layout, translation_bytes);
        } else {
            detail::store_local_invalidate(umr_control, mkey_context);
        }
        if (config_.wqe_signature) wqe[kCtrlSignature] = signature(wqe, ds * kSegmentUnit);

        const std::uint32_t slot = producer_index & mask_;
        tracking_.wr_id[slot] = request.wr_id;
        tracking_.wqe_end[slot] = producer_index + wqebbs;
        if (tracking_.umr_opcode != nullptr)
            tracking_.umr_opcode[slot] = static_cast<std::uint8_t>(
                configure ? CompletionOpcode::memory_key_configured
                          : CompletionOpcode::local_invalidate);
        tracking_.producer_index = producer_index + wqebbs;
        next_fence_ = kCtrlInitiatorSmallFence;
        pending_last_wqe_ = wqe;
        // A key configuration is an inline WQE to libmlx5 (inl_wqe), which BlueFlame carries
        // even when it is not preferred; LOCAL_INV from ibv_post_send is not.
        pending_blueflame_max_ds_ = configure ? blueflame_max_ds_ : blueflame_preferred_max_ds_;
        refresh_fast_end();
        return PostResult::ok;
    }

    // The doorbell after a fast-path post, which wrote up to `producer_index` without reaching
    // the ring end, with no WQE of write() pending; `one_wqe` says it wrote a single WQE (at
    // `last_wqe`).
    RDMACHAN_ALWAYS_INLINE void ring_doorbell_fast(std::uint32_t producer_index,
                                                   const std::uint8_t* last_wqe, bool one_wqe) {
        to_device_barrier();
        store_release32(ring_.doorbell_record + kSendDoorbell,
                        host_to_big32(producer_index & 0xffff));
        flush_writes();
        std::uint8_t* const destination = ring_.blueflame_register + blueflame_offset_;
        // ctrl byte 7 is all ds: the fast path writes ds below 64 and qpn above it.
        const std::uint32_t ds = last_wqe[kCtrlQpnDs + 3];
        // BlueFlame for a single WQE since the last doorbell (a fast-path post has none left
        // pending by write()), with ds > 1 and within the preferred size; one unsigned compare
        // for a WQE of one WQEBB. A fast-path WQE does not wrap.
        if (one_wqe && ds - 2 < blueflame_one_block_limit_) {
            detail::copy_blueflame_block(destination, last_wqe);
        } else if (one_wqe && ds - 2 < blueflame_fast_limit_) {
            for (std::uint32_t block = 0; block < (ds + 3) / 4; ++block) {
                detail::copy_blueflame_block(destination + block * kSendWqeBasicBlockSize,
                                     last_wqe + block * kSendWqeBasicBlockSize);
            }
        } else {
            // Ctrl bytes 0-7 of the last WQE: its index tells the NIC how far to fetch.
            std::uint64_t value;
            std::memcpy(&value, last_wqe, sizeof value);
            mmio_write64(destination, value);
        }
        flush_writes();
        blueflame_offset_ ^= ring_.blueflame_size;
        pending_start_ = producer_index;
    }

    // The doorbell for WQEs up to `producer_index`, the last of them at `last_wqe`.
    RDMACHAN_NOINLINE void ring_doorbell(std::uint32_t producer_index,
                                         const std::uint8_t* last_wqe) {
        post_fast_end_ = fast_end_;                    // nothing is pending after this
        if (producer_index == pending_start_) return;  // nothing written since the last doorbell

        to_device_barrier();
        store_release32(ring_.doorbell_record + kSendDoorbell,
                        host_to_big32(producer_index & 0xffff));
        flush_writes();
        std::uint8_t* destination = ring_.blueflame_register + blueflame_offset_;
        const std::uint8_t* source = last_wqe;
        const std::uint32_t ds = source[kCtrlQpnDs + 3] & kMaxDs;  // ctrl byte 7
        // One WQE since the last doorbell exactly when the last one covers all the new WQEBBs.
        const bool single = pending_start_ + (ds + 3) / 4 == producer_index;
        if (single && ds > 1 && ds <= pending_blueflame_max_ds_) {
            // The whole WQE in 64-byte blocks; the source wraps at the ring end like the WQE.
            // The first block needs no wrap check: a WQE starts inside the ring.
            detail::copy_blueflame_block(destination, source);
            for (std::uint32_t blocks = (ds + 3) / 4 - 1; blocks != 0; --blocks) {
                destination += kSendWqeBasicBlockSize;
                source += kSendWqeBasicBlockSize;
                if (source == ring_end_) source = ring_.buffer;
                detail::copy_blueflame_block(destination, source);
            }
        } else {
            // Ctrl bytes 0-7 of the last WQE: its index tells the NIC how far to fetch.
            std::uint64_t value;
            std::memcpy(&value, source, sizeof value);
            mmio_write64(destination, value);
        }
        flush_writes();
        blueflame_offset_ ^= ring_.blueflame_size;
        pending_start_ = producer_index;
        pending_blueflame_max_ds_ = blueflame_preferred_max_ds_;
    }

    // Inline payload: a 4-byte header, then the SGEs' bytes back to back, split at the ring end
    // and continued at its start (libmlx5 memcpy_to_wqe). The header itself is 16-byte aligned
    // and so never split.
    RDMACHAN_HOST_DEVICE void write_inline(std::uint8_t* segment, const SendWorkRequest& request,
                                           std::uint32_t inline_length) const {
        store_big32(segment, inline_length | kInlineFlag);
        std::uint8_t* position = segment + kInlineHeaderSize;
        for (std::uint32_t i = 0; i < request.num_sge; ++i) {
            const std::uint8_t* source =
                reinterpret_cast<const std::uint8_t*>(request.sg_list[i].addr);
            std::uint32_t remaining = request.sg_list[i].length;
            while (remaining != 0) {
                const std::uint32_t room = static_cast<std::uint32_t>(ring_end_ - position);
                const std::uint32_t chunk = remaining < room ? remaining : room;
                std::memcpy(position, source, chunk);
                source += chunk;
                remaining -= chunk;
                position += chunk;
                if (position == ring_end_) position = ring_.buffer;
            }
        }
    }

    // WQ signature: the complement of the XOR of the WQE's ds*16 bytes, taken in ring order.
    RDMACHAN_HOST_DEVICE std::uint8_t signature(const std::uint8_t* wqe,
                                                std::uint32_t length) const {
        std::uint8_t value = 0;
        const std::uint8_t* position = wqe;
        for (std::uint32_t i = 0; i < length; ++i) {
            value ^= *position++;
            if (position == ring_end_) position = ring_.buffer;
        }
        return static_cast<std::uint8_t>(~value);
    }

    SendQueueRing ring_{};
    SendQueueTracking tracking_{};
    SendQueueConfig config_{};
    // Per-queue constants, computed once so that the data path does not.
    std::uint8_t* ring_end_ = nullptr;
    std::uint32_t mask_ = 0;
    std::uint32_t qpn_big_ = 0;          // ctrl bytes 4-6 (qpn) as stored, ds byte zero
    std::uint32_t header_units_ = 1;     // ctrl, plus the address vector on a DCI
    std::uint64_t signal_all_word_ = 0;  // CQ update bit in the ctrl bytes 8-11 word
    std::uint32_t fast_path_max_sge_ = 0;
    std::uint32_t fast_path_max_wqebbs_ = kNoFastPath;
    std::uint32_t rc_fast_path_max_wqebbs_ = kNoFastPath;  // the RC post's (one SGE), none on a DCI
    std::uint32_t blueflame_max_ds_ = 0;            // largest WQE (in ds) that BlueFlame can carry
    std::uint32_t blueflame_preferred_max_ds_ = 0;  // the same for WQEs without inline data
    std::uint32_t blueflame_fast_limit_ = 0;
    std::uint32_t blueflame_one_block_limit_ = 0;  // the same, at most one WQEBB (ds <= 4)
    // The fast path may fill WQEBBs up to this producer index: free, and before the ring end
    // (so nothing wraps).
    std::uint32_t fast_end_ = 0;
    // fast_end_ while no WQE written with write() waits for a doorbell, else the producer index
    // (no room): a post then takes the general path, which rings for those WQEs too.
    std::uint32_t post_fast_end_ = 0;
    std::uint32_t blueflame_offset_ = 0;
    // The WQEs written since the last doorbell: the producer index they began at, where the
    // last one is, and the largest BlueFlame copy its kind allows (inline or not).
    std::uint32_t pending_blueflame_max_ds_ = 0;
    std::uint32_t pending_start_ = 0;
    std::uint8_t* pending_last_wqe_ = nullptr;
    // The fence the next WQE owes after a UMR WQE (libmlx5 qp->fm_cache): 0 or the initiator
    // small fence.
    std::uint8_t next_fence_ = 0;
};

}  // namespace rdmachan::mlx5
