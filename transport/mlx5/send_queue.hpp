// The mlx5 send-queue encoder: writes WQEs straight into the send ring and rings the doorbell
// (doorbell record, then BlueFlame copy or 8-byte doorbell). Layouts and ordering follow
// mlx5-facts.md §1, §3 and §4; the bytes are checked against libmlx5's own by
// mlx5-golden-check. Header-only and free of exceptions, allocation and locks, so that it
// also runs as CUDA device code. One SendQueue is used by one thread at a time.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

struct SendQueueConfig {
    std::uint32_t max_sge = 1;
    std::uint32_t max_inline_data = 0;
    bool signal_all = false;        // sq_sig_all: every WQE asks for a CQE
    bool prefer_blueflame = true;   // BlueFlame for every eligible single-WQE post, not only inline
    bool dc_initiator = false;      // WQEs carry a 48-byte address vector after the ctrl segment
    bool wqe_signature = false;     // the QP was created with WQ signatures (rarely used)
};

// The 48-byte extended address vector of a DC work request: the base vector of the peer's
// address handle (mlx5dv_ah.av on hardware) with the DCT number and DC key filled in, as
// rdma-core's mlx5_send_wr_set_dc_addr does (mlx5-facts.md §1).
RDMACHAN_HOST_DEVICE inline void make_dc_address_vector(std::uint8_t (&address_vector)[kAddressVectorSize],
                                                        const std::uint8_t* base_address_vector,
                                                        std::uint32_t dctn, std::uint64_t dc_key) {
    std::memcpy(address_vector, base_address_vector, kAddressVectorSize);
    store_big64(address_vector + kAvDcKey, dc_key);
    const std::uint32_t dqp_dct = load_big32(address_vector + kAvDqpDct);
    store_big32(address_vector + kAvDqpDct, dqp_dct | kExtendedAddressVector | (dctn & 0xffffff));
}

class SendQueue {
public:
    SendQueue() = default;

    RDMACHAN_HOST_DEVICE SendQueue(const SendQueueRing& ring, const SendQueueTracking& tracking,
                                   const SendQueueConfig& config)
        : ring_(ring),
          tracking_(tracking),
          config_(config),
          ring_end_(ring.buffer + static_cast<std::size_t>(ring.wqe_count) * kSendWqeBasicBlockSize),
          mask_(ring.wqe_count - 1) {}

    // Writes up to `count` WQEs and rings one doorbell for all that were written. Stops at the
    // first request that is refused; *posted says how many were written.
    RDMACHAN_HOST_DEVICE PostResult post(const SendWorkRequest* requests, std::uint32_t count,
                                         std::uint32_t* posted) {
        PostResult result = PostResult::ok;
        std::uint32_t written = 0;
        for (; written < count; ++written) {
            result = write(requests[written]);
            if (result != PostResult::ok) break;
        }
        if (written != 0) ring_doorbell();
        if (posted != nullptr) *posted = written;
        return result;
    }

    // Writes one WQE without ringing the doorbell, so callers can batch across calls. A refused
    // request writes nothing into the ring.
    RDMACHAN_HOST_DEVICE PostResult write(const SendWorkRequest& request) {
        const bool is_inline = (request.flags & kSendInline) != 0;
        std::uint8_t opcode = 0;
        std::uint32_t header_units = 1;  // ctrl
        if (config_.dc_initiator) {
            if (request.dc_address_vector == nullptr) return PostResult::invalid_request;
            header_units += kAddressVectorSize / kSegmentUnit;
        }
        bool has_remote_address = false;
        bool is_atomic = false;
        std::uint32_t immediate_field = 0;
        switch (request.opcode) {
            case SendOpcode::rdma_write: opcode = kOpcodeRdmaWrite; has_remote_address = true; break;
            case SendOpcode::rdma_write_with_immediate:
                opcode = kOpcodeRdmaWriteImmediate;
                has_remote_address = true;
                immediate_field = request.immediate;
                break;
            case SendOpcode::send: opcode = kOpcodeSend; break;
            case SendOpcode::send_with_immediate:
                opcode = kOpcodeSendImmediate;
                immediate_field = request.immediate;
                break;
            case SendOpcode::send_with_invalidate:
                opcode = kOpcodeSendInvalidate;
                immediate_field = request.immediate;
                break;
            case SendOpcode::rdma_read:
                if (is_inline) return PostResult::invalid_request;
                opcode = kOpcodeRdmaRead;
                has_remote_address = true;
                break;
            case SendOpcode::atomic_compare_and_swap:
            case SendOpcode::atomic_fetch_and_add:
                if (is_inline) return PostResult::invalid_request;
                opcode = request.opcode == SendOpcode::atomic_compare_and_swap
                             ? kOpcodeAtomicCompareAndSwap
                             : kOpcodeAtomicFetchAndAdd;
                has_remote_address = true;
                is_atomic = true;
                break;
            default: return PostResult::invalid_request;
        }
        if (has_remote_address) header_units += kRemoteAddressSegmentSize / kSegmentUnit;
        if (is_atomic) header_units += kAtomicSegmentSize / kSegmentUnit;
        if (request.num_sge > config_.max_sge) return PostResult::too_many_sge;

        // Size the data part before writing a byte: a refused request must leave the ring as it
        // was, and the WQE must fit in the free WQEBBs.
        std::uint32_t data_units = 0;
        std::uint32_t inline_length = 0;
        if (is_inline) {
            for (std::uint32_t i = 0; i < request.num_sge; ++i) inline_length += request.sg_list[i].length;
            if (inline_length > config_.max_inline_data) return PostResult::inline_too_large;
            // A zero-length inline payload adds no segment at all (libmlx5 set_data_inl_seg).
            if (inline_length != 0) data_units = (inline_length + kInlineHeaderSize + kSegmentUnit - 1) / kSegmentUnit;
        } else {
            for (std::uint32_t i = 0; i < request.num_sge; ++i) data_units += request.sg_list[i].length != 0;
        }
        const std::uint32_t ds = header_units + data_units;
        if (ds > kMaxDs) return PostResult::invalid_request;
        const std::uint32_t wqebbs = (ds * kSegmentUnit + kSendWqeBasicBlockSize - 1) / kSendWqeBasicBlockSize;
        if (wqebbs > free_wqebbs()) return PostResult::queue_full;

        const std::uint32_t producer_index = tracking_.producer_index;
        std::uint8_t* const wqe = ring_.buffer + static_cast<std::size_t>(producer_index & mask_) * kSendWqeBasicBlockSize;

        std::uint8_t fm_ce_se = 0;
        if ((request.flags & kSendSignaled) != 0 || config_.signal_all) fm_ce_se |= kCtrlCqUpdate;
        if ((request.flags & kSendSolicited) != 0) fm_ce_se |= kCtrlSolicited;
        if ((request.flags & kSendFence) != 0) fm_ce_se |= kCtrlFence;

        store_big32(wqe + kCtrlOpmodIndexOpcode, ((producer_index & 0xffff) << 8) | opcode);
        store_big32(wqe + kCtrlQpnDs, (ring_.qpn << 8) | ds);
        // Bytes 8-11 (signature, DCI stream channel, fm_ce_se) are written as one word so that
        // no stale byte of an earlier WQE in this slot survives (mlx5-facts.md §9.1).
        store_big32(wqe + kCtrlSignature, (static_cast<std::uint32_t>(request.dci_stream_id) << 8) | fm_ce_se);
        store_big32(wqe + kCtrlImmediate, immediate_field);

        // Segments start on 16-byte boundaries and the ring end is 64-byte aligned, so a
        // segment either fits before the end or starts exactly at it (mlx5-facts.md §3).
        std::uint8_t* segment = wqe + kControlSegmentSize;
        if (config_.dc_initiator) {
            // ctrl + AV is exactly 64 bytes: it fills this WQEBB.
            std::memcpy(segment, request.dc_address_vector, kAddressVectorSize);
            segment = wrap(segment + kAddressVectorSize);
        }
        if (has_remote_address) {
            store_big64(segment, request.remote_addr);
            store_big32(segment + 8, request.rkey);
            store_big32(segment + 12, 0);
            segment = wrap(segment + kRemoteAddressSegmentSize);
        }
        if (is_atomic) {
            if (request.opcode == SendOpcode::atomic_compare_and_swap) {
                store_big64(segment, request.swap);
                store_big64(segment + 8, request.compare_add);
            } else {
                store_big64(segment, request.compare_add);  // the compare field is unused
            }
            segment = wrap(segment + kAtomicSegmentSize);
        }
        if (is_inline) {
            if (inline_length != 0) write_inline(segment, request, inline_length);
        } else {
            for (std::uint32_t i = 0; i < request.num_sge; ++i) {
                const ScatterGatherElement& element = request.sg_list[i];
                if (element.length == 0) continue;  // a zero-length SGE is skipped, not encoded
                store_big32(segment, element.length);
                store_big32(segment + 4, element.lkey);
                store_big64(segment + 8, element.addr);
                segment = wrap(segment + kDataSegmentSize);
            }
        }
        if (config_.wqe_signature) wqe[kCtrlSignature] = signature(wqe, ds * kSegmentUnit);

        const std::uint32_t slot = producer_index & mask_;
        tracking_.wr_id[slot] = request.wr_id;
        tracking_.wqe_end[slot] = producer_index + wqebbs;
        tracking_.producer_index = producer_index + wqebbs;

        pending_last_wqe_ = wqe;
        pending_last_ds_ = ds;
        pending_last_inline_ = is_inline;
        ++pending_count_;
        return PostResult::ok;
    }

    // Makes every WQE written since the last doorbell visible to the NIC (mlx5-facts.md §4).
    RDMACHAN_HOST_DEVICE void ring_doorbell() {
        if (pending_count_ == 0) return;
        to_device_barrier();
        store_release32(ring_.doorbell_record + kSendDoorbell, host_to_big32(tracking_.producer_index & 0xffff));
        flush_writes();
        std::uint8_t* const destination = ring_.blueflame_register + blueflame_offset_;
        const std::uint32_t wqe_bytes = pending_last_ds_ * kSegmentUnit;
        const bool blueflame = ring_.blueflame_size != 0 && pending_count_ == 1 && pending_last_ds_ > 1 &&
                               wqe_bytes <= ring_.blueflame_size &&
                               (pending_last_inline_ || config_.prefer_blueflame);
        if (blueflame) {
            // Ordered 64-bit stores, never memcpy: string moves may reorder or merge the writes
            // into the write-combining buffer (rdma-core util/mmio.h).
            const std::uint8_t* source = pending_last_wqe_;
            const std::uint32_t blocks = (wqe_bytes + kSendWqeBasicBlockSize - 1) / kSendWqeBasicBlockSize;
            for (std::uint32_t block = 0; block < blocks; ++block) {
                std::uint8_t* target = destination + block * kSendWqeBasicBlockSize;
                for (std::uint32_t word = 0; word < kSendWqeBasicBlockSize; word += 8) {
                    std::uint64_t value;
                    std::memcpy(&value, source + word, sizeof value);
                    mmio_write64(target + word, value);
                }
                source = wrap(source + kSendWqeBasicBlockSize);
            }
        } else {
            std::uint64_t value;
            std::memcpy(&value, pending_last_wqe_, sizeof value);
            mmio_write64(destination, value);
        }
        flush_writes();
        blueflame_offset_ ^= ring_.blueflame_size;
        pending_count_ = 0;
    }

    RDMACHAN_HOST_DEVICE std::uint32_t free_wqebbs() const {
        return ring_.wqe_count - (tracking_.producer_index - tracking_.consumer_index);
    }

    RDMACHAN_HOST_DEVICE SendQueueTracking& tracking() { return tracking_; }
    RDMACHAN_HOST_DEVICE const SendQueueRing& ring() const { return ring_; }
    RDMACHAN_HOST_DEVICE std::uint32_t blueflame_offset() const { return blueflame_offset_; }
    RDMACHAN_HOST_DEVICE void set_blueflame_offset(std::uint32_t offset) { blueflame_offset_ = offset; }

    // After a QP is reset (DCI recovery), the producer index restarts at 0 (mlx5-facts.md §6).
    RDMACHAN_HOST_DEVICE void reset() {
        tracking_.producer_index = 0;
        tracking_.consumer_index = 0;
        pending_count_ = 0;
    }

private:
    template <typename Pointer>
    RDMACHAN_ALWAYS_INLINE Pointer wrap(Pointer position) const {
        return position == ring_end_ ? ring_.buffer : position;
    }

    // Inline payload: a 4-byte header, then the SGEs' bytes back to back, split at the ring end
    // and continued at its start (libmlx5 memcpy_to_wqe). The header itself is 16-byte aligned
    // and so never split.
    RDMACHAN_HOST_DEVICE void write_inline(std::uint8_t* segment, const SendWorkRequest& request,
                                           std::uint32_t inline_length) const {
        store_big32(segment, inline_length | kInlineFlag);
        std::uint8_t* position = segment + kInlineHeaderSize;
        for (std::uint32_t i = 0; i < request.num_sge; ++i) {
            const std::uint8_t* source = reinterpret_cast<const std::uint8_t*>(request.sg_list[i].addr);
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
    RDMACHAN_HOST_DEVICE std::uint8_t signature(const std::uint8_t* wqe, std::uint32_t length) const {
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
    std::uint8_t* ring_end_ = nullptr;
    std::uint32_t mask_ = 0;
    std::uint32_t blueflame_offset_ = 0;
    // The WQEs written since the last doorbell: how many, and the last one's place and size.
    std::uint8_t* pending_last_wqe_ = nullptr;
    std::uint32_t pending_last_ds_ = 0;
    std::uint32_t pending_count_ = 0;
    bool pending_last_inline_ = false;
};

}  // namespace rdmachan::mlx5
