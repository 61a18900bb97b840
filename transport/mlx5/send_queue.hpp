// The mlx5 send-queue encoder: writes WQEs straight into the send ring and rings the doorbell
// (doorbell record, then BlueFlame copy or 8-byte doorbell). Layouts and ordering follow
// mlx5-facts.md §1, §3 and §4; the bytes are checked against libmlx5's own by
// mlx5-golden-check. Header-only and free of exceptions, allocation and locks, so that it
// also runs as CUDA device code. One SendQueue is used by one thread at a time.
//
// The common WQE (no inline payload, not reaching the ring end, room to spare) takes a fast
// path with no per-segment wrap checks; everything else goes through one out-of-line general
// path. Both are the same encoder template, so they cannot drift apart.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"

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

// The 48-byte extended address vector of a DC work request: the base vector of the peer's
// address handle (mlx5dv_ah.av on hardware) with the DCT number and DC key filled in, as
// rdma-core's mlx5_send_wr_set_dc_addr does (mlx5-facts.md §1).
RDMACHAN_HOST_DEVICE inline void make_dc_address_vector(
    std::uint8_t (&address_vector)[kAddressVectorSize], const std::uint8_t* base_address_vector,
    std::uint32_t dctn, std::uint64_t dc_key) {
    std::memcpy(address_vector, base_address_vector, kAddressVectorSize);
    store_big64(address_vector + kAvDcKey, dc_key);
    const std::uint32_t dqp_dct = load_big32(address_vector + kAvDqpDct);
    store_big32(address_vector + kAvDqpDct, dqp_dct | kExtendedAddressVector | (dctn & 0xffffff));
}

namespace detail {

// Per-opcode facts in one byte, a compile-time constant in each case of SendQueue::write's
// switch: bits 4:0 the mlx5 opcode, bits 6:5 how many 16-byte header segments follow ctrl
// (1 = remote address, 2 = remote address + atomic), bit 7 whether ctrl.imm carries the
// request's immediate (or the rkey to invalidate).
inline constexpr std::uint32_t kTraitOpcodeMask = 0x1f;
inline constexpr std::uint32_t kTraitSegmentsShift = 5;
inline constexpr std::uint32_t kTraitImmediate = 1u << 7;

RDMACHAN_HOST_DEVICE constexpr std::uint32_t opcode_traits(SendOpcode opcode) {
    switch (opcode) {
        case SendOpcode::rdma_write:
            return kOpcodeRdmaWrite | 1u << kTraitSegmentsShift;
        case SendOpcode::rdma_write_with_immediate:
            return kOpcodeRdmaWriteImmediate | 1u << kTraitSegmentsShift | kTraitImmediate;
        case SendOpcode::send:
            return kOpcodeSend;
        case SendOpcode::send_with_immediate:
            return kOpcodeSendImmediate | kTraitImmediate;
        case SendOpcode::send_with_invalidate:
            return kOpcodeSendInvalidate | kTraitImmediate;
        case SendOpcode::rdma_read:
            return kOpcodeRdmaRead | 1u << kTraitSegmentsShift;
        case SendOpcode::atomic_compare_and_swap:
            return kOpcodeAtomicCompareAndSwap | 2u << kTraitSegmentsShift;
        case SendOpcode::atomic_fetch_and_add:
            return kOpcodeAtomicFetchAndAdd | 2u << kTraitSegmentsShift;
    }
    return 0;
}

// The request flags that are ctrl.fm_ce_se bits as they stand.
static_assert(kSendSignaled == kCtrlCqUpdate && kSendSolicited == kCtrlSolicited &&
                  kSendFence == kCtrlFence && (kSendInline & 0xff) == 0,
              "the encoder copies these request flags into fm_ce_se unchanged");
inline constexpr std::uint32_t kFmCeSeFlags = kSendSignaled | kSendSolicited | kSendFence;

}  // namespace detail

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
          // remote address and atomic take at most 6 units). A WQ signature is computed over
          // the finished WQE, which only the general path does, so it gets no fast path.
          fast_path_max_sge_(config.wqe_signature ? 0 : minimum(config.max_sge, kMaxDs - 6)),
          // The largest WQE the fast path writes: ctrl, address vector, remote address and
          // atomic segments, and every SGE it accepts. With WQ signatures no room is ever
          // enough, so every WQE, also one without SGEs, gets its signature on the general path.
          fast_path_max_wqebbs_(
              config.wqe_signature ? ~0u : (header_units_ + 2 + fast_path_max_sge_ + 3) / 4),
          blueflame_max_ds_(ring.blueflame_size / kSegmentUnit),
          blueflame_preferred_max_ds_(config.prefer_blueflame ? ring.blueflame_size / kSegmentUnit
                                                              : 0),
          pending_blueflame_max_ds_(blueflame_preferred_max_ds_),
          pending_start_(tracking.producer_index) {
        refresh_fast_room();
    }

    // Writes up to `count` WQEs and rings one doorbell for all of them (and for any written
    // earlier with write()). Stops at the first request that is refused; *posted says how many
    // were written.
    RDMACHAN_ALWAYS_INLINE PostResult post(const SendWorkRequest* requests, std::uint32_t count,
                                           std::uint32_t* posted) {
        PostResult result = PostResult::ok;
        std::uint32_t written = 0;
        // RC or DCI is decided once per post, so the loop knows its header size. Ring stores may
        // alias any member, so what the loop advances lives in a local cursor meanwhile.
        Cursor cursor = load_cursor();
        if (header_units_ == 1) {
            for (; written < count; ++written) {
                result = write_as<1>(requests[written], cursor);
                if (RDMACHAN_UNLIKELY(result != PostResult::ok)) break;
            }
        } else {
            for (; written < count; ++written) {
                result = write_as<kDciHeaderUnits>(requests[written], cursor);
                if (RDMACHAN_UNLIKELY(result != PostResult::ok)) break;
            }
        }
        store_cursor(cursor);
        ring_doorbell(cursor.producer_index, cursor.last_wqe);
        if (posted != nullptr) *posted = written;
        return result;
    }

    // Writes one WQE without ringing the doorbell, so callers can batch across calls. A refused
    // request writes nothing into the ring.
    RDMACHAN_ALWAYS_INLINE PostResult write(const SendWorkRequest& request) {
        Cursor cursor = load_cursor();
        const PostResult result = header_units_ == 1 ? write_as<1>(request, cursor)
                                                     : write_as<kDciHeaderUnits>(request, cursor);
        store_cursor(cursor);
        return result;
    }

    // Makes every WQE written since the last doorbell visible to the NIC (mlx5-facts.md §4).
    RDMACHAN_ALWAYS_INLINE void ring_doorbell() {
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
        refresh_fast_room();
    }

  private:
    // ctrl plus the 48-byte address vector on a DC initiator.
    static constexpr std::uint32_t kDciHeaderUnits = 1 + kAddressVectorSize / kSegmentUnit;

    // The doorbell for WQEs up to `producer_index`, the last of them at `last_wqe`.
    RDMACHAN_ALWAYS_INLINE void ring_doorbell(std::uint32_t producer_index,
                                              const std::uint8_t* last_wqe) {
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
            copy_blueflame_block(destination, source);
            for (std::uint32_t blocks = (ds + 3) / 4 - 1; blocks != 0; --blocks) {
                destination += kSendWqeBasicBlockSize;
                source += kSendWqeBasicBlockSize;
                if (source == ring_end_) source = ring_.buffer;
                copy_blueflame_block(destination, source);
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

    // What writing WQEs reads and advances, held in registers across a post's WQEs.
    struct Cursor {
        std::uint32_t producer_index;
        std::uint32_t fast_room;
        std::uint8_t* last_wqe;
        std::uint64_t* wr_ids;
        std::uint32_t* wqe_ends;
    };

    RDMACHAN_ALWAYS_INLINE Cursor load_cursor() const {
        return {tracking_.producer_index, fast_room_, pending_last_wqe_, tracking_.wr_id,
                tracking_.wqe_end};
    }

    RDMACHAN_ALWAYS_INLINE void store_cursor(const Cursor& cursor) {
        tracking_.producer_index = cursor.producer_index;
        fast_room_ = cursor.fast_room;
        pending_last_wqe_ = cursor.last_wqe;
    }

    template <std::uint32_t kHeaderUnits>
    RDMACHAN_ALWAYS_INLINE PostResult write_as(const SendWorkRequest& request, Cursor& cursor) {
        // One switch; each case gets an encoder with its segment layout known at compile time.
        using detail::opcode_traits;
        switch (request.opcode) {
            case SendOpcode::rdma_write:
                return write_fast<opcode_traits(SendOpcode::rdma_write), kHeaderUnits>(request,
                                                                                       cursor);
            case SendOpcode::rdma_write_with_immediate:
                return write_fast<opcode_traits(SendOpcode::rdma_write_with_immediate),
                                  kHeaderUnits>(request, cursor);
            case SendOpcode::send:
                return write_fast<opcode_traits(SendOpcode::send), kHeaderUnits>(request, cursor);
            case SendOpcode::send_with_immediate:
                return write_fast<opcode_traits(SendOpcode::send_with_immediate), kHeaderUnits>(
                    request, cursor);
            case SendOpcode::send_with_invalidate:
                return write_fast<opcode_traits(SendOpcode::send_with_invalidate), kHeaderUnits>(
                    request, cursor);
            case SendOpcode::rdma_read:
                return write_fast<opcode_traits(SendOpcode::rdma_read), kHeaderUnits>(request,
                                                                                      cursor);
            case SendOpcode::atomic_compare_and_swap:
                return write_fast<opcode_traits(SendOpcode::atomic_compare_and_swap), kHeaderUnits>(
                    request, cursor);
            case SendOpcode::atomic_fetch_and_add:
                return write_fast<opcode_traits(SendOpcode::atomic_fetch_and_add), kHeaderUnits>(
                    request, cursor);
        }
        return PostResult::invalid_request;
    }

    template <std::uint32_t kTraits, std::uint32_t kHeaderUnits>
    RDMACHAN_ALWAYS_INLINE PostResult write_fast(const SendWorkRequest& request, Cursor& cursor) {
        // The fast path takes a WQE when any WQE it writes would fit: before the ring end and
        // in the free room. Only the last few WQEBBs before either go to the general path,
        // which sizes the WQE exactly.
        const bool fast = request.num_sge <= fast_path_max_sge_ &&
                          (request.flags & kSendInline) == 0 &&
                          cursor.fast_room >= fast_path_max_wqebbs_ &&
                          (kHeaderUnits == 1 || request.dc_address_vector != nullptr);
        if (RDMACHAN_UNLIKELY(!fast)) {
            // The general path works on the members: hand the cursor over and take it back.
            store_cursor(cursor);
            const PostResult result = write_general(request, kTraits);
            cursor = load_cursor();
            return result;
        }
        cursor.fast_room -= encode<false, false>(request, kTraits, kHeaderUnits, cursor, 0);
        return PostResult::ok;
    }

    // Inline payloads, WQ signatures, WQEs that reach the ring end, and every refusal: sized
    // exactly before a byte is written, then encoded with wrap checks.
    RDMACHAN_SEND_COLD RDMACHAN_HOST_DEVICE PostResult write_general(const SendWorkRequest& request,
                                                                     std::uint32_t traits) {
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
        Cursor cursor = load_cursor();
        if (is_inline) {
            encode<true, true>(request, traits, header_units_, cursor, inline_length);
            // BlueFlame carries inline WQEs even when it is not preferred for others.
            pending_blueflame_max_ds_ = blueflame_max_ds_;
        } else {
            encode<true, false>(request, traits, header_units_, cursor, 0);
            pending_blueflame_max_ds_ = blueflame_preferred_max_ds_;
        }
        store_cursor(cursor);
        refresh_fast_room();
        return PostResult::ok;
    }

    // Completions only ever add free WQEBBs, so a room computed earlier is never too large: when
    // it runs out, the general path takes the next WQE and computes it afresh.
    RDMACHAN_HOST_DEVICE void refresh_fast_room() {
        const std::uint32_t producer_index = tracking_.producer_index;
        const std::uint32_t before_ring_end = ring_.wqe_count - (producer_index & mask_);
        const std::uint32_t free = free_wqebbs();
        fast_room_ = free < before_ring_end ? free : before_ring_end;
    }

    // Writes the WQE at producer_index and accounts for it. The caller has checked that it fits.
    // Segments start on 16-byte boundaries and the ring end is 64-byte aligned, so a segment
    // either fits before the end or starts exactly at it (mlx5-facts.md §3): with kMayWrap a
    // segment pointer that reaches the end continues at the ring start.
    template <bool kMayWrap, bool kInline>
    RDMACHAN_ALWAYS_INLINE std::uint32_t encode(const SendWorkRequest& request,
                                                std::uint32_t traits, std::uint32_t header_units,
                                                Cursor& cursor, std::uint32_t inline_length) {
        const std::uint32_t producer_index = cursor.producer_index;
        // Stores into the ring may alias any member, so what the encoder needs is read once.
        std::uint8_t* const buffer = ring_.buffer;
        std::uint8_t* const ring_end = ring_end_;
        const std::uint32_t slot = producer_index & mask_;
        std::uint8_t* const wqe = buffer + static_cast<std::size_t>(slot) * kSendWqeBasicBlockSize;
        std::uint32_t ds = header_units;
        const std::uint32_t fm_ce_se = request.flags & detail::kFmCeSeFlags;
        // Bytes 8-11 (signature, DCI stream channel, fm_ce_se) are written as one word so that
        // no stale byte of an earlier WQE in this slot survives (mlx5-facts.md §9.1).
        std::uint32_t word_signature_stream_flags = (fm_ce_se << 24) | signal_all_word_;

        std::uint8_t* segment = wqe + kControlSegmentSize;
        if (header_units != 1) {
            // ctrl + address vector is exactly 64 bytes: it fills this WQEBB. Both paths have
            // refused a DCI request without one; the test keeps the compiler sure of it.
            const std::uint8_t* const address_vector = request.dc_address_vector;
            if (address_vector != nullptr) std::memcpy(segment, address_vector, kAddressVectorSize);
            segment = next_segment<kMayWrap>(segment + kAddressVectorSize, buffer, ring_end);
            word_signature_stream_flags |=
                static_cast<std::uint32_t>(byte_swap16(request.dci_stream_id)) << 8;
        }
        const std::uint32_t header_segments = traits >> detail::kTraitSegmentsShift & 3;
        if (header_segments != 0) {
            store_big64(segment, request.remote_addr);
            store_big32(segment + 8, request.rkey);
            store_big32(segment + 12, 0);
            segment = next_segment<kMayWrap>(segment + kRemoteAddressSegmentSize, buffer, ring_end);
            ds += header_segments;
            if (header_segments == 2) {
                if (request.opcode == SendOpcode::atomic_compare_and_swap) {
                    store_big64(segment, request.swap);
                    store_big64(segment + 8, request.compare_add);
                } else {
                    store_big64(segment, request.compare_add);  // the compare field is unused
                }
                segment = next_segment<kMayWrap>(segment + kAtomicSegmentSize, buffer, ring_end);
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
            const std::uint32_t num_sge = request.num_sge;
            if (num_sge == 1) {  // the common case, without the loop
                const std::uint64_t length_lkey = load_length_lkey(*element);
                if (RDMACHAN_LIKELY(static_cast<std::uint32_t>(length_lkey) != 0)) {
                    store_data_segment(segment, length_lkey, element->addr);
                    ++ds;
                }
            } else {
                for (const ScatterGatherElement* const end = element + num_sge; element != end;
                     ++element) {
                    const std::uint64_t length_lkey = load_length_lkey(*element);
                    if (RDMACHAN_UNLIKELY(static_cast<std::uint32_t>(length_lkey) == 0)) continue;
                    store_data_segment(segment, length_lkey, element->addr);
                    segment = next_segment<kMayWrap>(segment + kDataSegmentSize, buffer, ring_end);
                    ++ds;
                }
            }
        }
        // The WQE index is the producer index's low 16 bits; opmod (byte 0) stays 0.
        const std::uint32_t opcode_word =
            static_cast<std::uint32_t>(static_cast<std::uint16_t>(producer_index)) << 8 |
            (traits & detail::kTraitOpcodeMask);
        store_big32(wqe + kCtrlOpmodIndexOpcode, opcode_word);
        const std::uint32_t qpn_ds =
            qpn_big_ | (ds << 24);  // ds is the last byte of a big-endian word
        std::memcpy(wqe + kCtrlQpnDs, &qpn_ds, sizeof qpn_ds);
        std::memcpy(wqe + kCtrlSignature, &word_signature_stream_flags,
                    sizeof word_signature_stream_flags);
        store_big32(wqe + kCtrlImmediate,
                    (traits & detail::kTraitImmediate) != 0 ? request.immediate : 0);
        if constexpr (kMayWrap) {
            if (config_.wqe_signature) wqe[kCtrlSignature] = signature(wqe, ds * kSegmentUnit);
        }

        const std::uint32_t wqebbs = (ds + 3) / 4;
        cursor.wr_ids[slot] = request.wr_id;
        cursor.wqe_ends[slot] = producer_index + wqebbs;
        cursor.producer_index = producer_index + wqebbs;
        cursor.last_wqe = wqe;
        return wqebbs;
    }

    // An SGE's length (low half) and lkey (high half) in one 8-byte load: they are adjacent in
    // ScatterGatherElement as byte_count and lkey are in the data segment.
    RDMACHAN_ALWAYS_INLINE static std::uint64_t load_length_lkey(
        const ScatterGatherElement& element) {
        static_assert(offsetof(ScatterGatherElement, lkey) ==
                      offsetof(ScatterGatherElement, length) + 4);
        std::uint64_t length_lkey;
        std::memcpy(&length_lkey,
                    reinterpret_cast<const unsigned char*>(&element) +
                        offsetof(ScatterGatherElement, length),
                    sizeof length_lkey);
        return length_lkey;
    }

    // The halves swapped into big-endian order (rotate, then byte swap): one store for both.
    RDMACHAN_ALWAYS_INLINE static void store_data_segment(std::uint8_t* segment,
                                                          std::uint64_t length_lkey,
                                                          std::uint64_t addr) {
        store_big64(segment, length_lkey << 32 | length_lkey >> 32);
        store_big64(segment + 8, addr);
    }

    RDMACHAN_ALWAYS_INLINE static std::uint32_t minimum(std::uint32_t a, std::uint32_t b) {
        return a < b ? a : b;
    }

    template <bool kMayWrap>
    RDMACHAN_ALWAYS_INLINE static std::uint8_t* next_segment(std::uint8_t* position,
                                                             std::uint8_t* buffer,
                                                             std::uint8_t* ring_end) {
        if constexpr (kMayWrap) {
            if (position == ring_end) return buffer;
        }
        return position;
    }

    // Eight ordered 64-bit stores, never memcpy: string moves may reorder or merge the writes
    // into the write-combining buffer (rdma-core util/mmio.h, mmio_memcpy_x64).
    RDMACHAN_ALWAYS_INLINE static void copy_blueflame_block(std::uint8_t* destination,
                                                            const std::uint8_t* source) {
#if defined(__CUDACC__)
#pragma unroll
#else
#pragma GCC unroll 8
#endif
        for (std::uint32_t word = 0; word < kSendWqeBasicBlockSize; word += 8) {
            std::uint64_t value;
            std::memcpy(&value, source + word, sizeof value);
            mmio_write64(destination + word, value);
        }
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
    std::uint32_t signal_all_word_ = 0;  // CQ update bit in the ctrl bytes 8-11 word
    std::uint32_t fast_path_max_sge_ = 0;
    std::uint32_t fast_path_max_wqebbs_ = 0;
    // WQEBBs the fast path may still fill: free, and before the ring end (so nothing wraps).
    std::uint32_t fast_room_ = 0;
    std::uint32_t blueflame_max_ds_ = 0;            // largest WQE (in ds) that BlueFlame can carry
    std::uint32_t blueflame_preferred_max_ds_ = 0;  // the same for WQEs without inline data
    std::uint32_t blueflame_offset_ = 0;
    // The WQEs written since the last doorbell: the producer index they began at, where the
    // last one is, and the largest BlueFlame copy its kind allows (inline or not).
    std::uint32_t pending_blueflame_max_ds_ = 0;
    std::uint32_t pending_start_ = 0;
    std::uint8_t* pending_last_wqe_ = nullptr;
};

}  // namespace rdmachan::mlx5
