// The mlx5 receive queue of an RC QP: bare 16-byte data segments per WQE, no control segment,
// a terminator segment when the list is shorter than the WQE holds, and the receive doorbell
// record (dbrec[0]) holding the 16-bit head. Layout checked against libmlx5's mlx5_post_recv by
// mlx5-golden-check. Header-only, no exceptions, allocation or locks.
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

struct ReceiveQueueConfig {
    std::uint32_t qpn = 0;             // only for WQE signatures
    bool wqe_signature = false;        // the QP was created with WQ signatures
};

class ReceiveQueue {
public:
    ReceiveQueue() = default;

    // wr_ids: caller-owned array of ring.wqe_count entries.
    RDMACHAN_HOST_DEVICE ReceiveQueue(const ReceiveQueueRing& ring, std::uint64_t* wr_ids,
                                      const ReceiveQueueConfig& config)
        : ring_(ring),
          wr_ids_(wr_ids),
          config_(config),
          mask_(ring.wqe_count - 1),
          max_sge_((ring.stride - (config.wqe_signature ? kReceiveSignatureSegmentSize : 0)) / kDataSegmentSize) {}

    // Posts up to `count` receive WQEs and writes the doorbell record once if any was posted.
    RDMACHAN_HOST_DEVICE PostResult post(const ReceiveWorkRequest* requests, std::uint32_t count,
                                         std::uint32_t* posted) {
        PostResult result = PostResult::ok;
        std::uint32_t written = 0;
        for (; written < count; ++written) {
            const ReceiveWorkRequest& request = requests[written];
            if (head_ - tail_ >= ring_.wqe_count) { result = PostResult::queue_full; break; }
            if (request.num_sge > max_sge_) { result = PostResult::too_many_sge; break; }
            write(request);
        }
        if (written != 0) {
            to_device_barrier();
            store_release32(ring_.doorbell_record + kReceiveDoorbell, host_to_big32(head_ & 0xffff));
        }
        if (posted != nullptr) *posted = written;
        return result;
    }

    // A responder CQE consumed the WQE its wqe_counter names; returns that WQE's wr_id. Using the
    // counter (as rdma-core does since v55) rather than assuming in-order consumption means a
    // completion can never be matched with the wrong buffer.
    RDMACHAN_HOST_DEVICE std::uint64_t complete(std::uint16_t wqe_counter) {
        ++tail_;
        return wr_ids_[wqe_counter & mask_];
    }

    RDMACHAN_HOST_DEVICE std::uint32_t outstanding() const { return head_ - tail_; }
    RDMACHAN_HOST_DEVICE std::uint32_t head() const { return head_; }
    RDMACHAN_HOST_DEVICE std::uint32_t tail() const { return tail_; }
    RDMACHAN_HOST_DEVICE std::uint32_t max_sge() const { return max_sge_; }
    RDMACHAN_HOST_DEVICE const ReceiveQueueRing& ring() const { return ring_; }
    // For a queue whose earlier WQEs were posted by someone else (tests, recovery).
    RDMACHAN_HOST_DEVICE void set_counters(std::uint32_t head, std::uint32_t tail) {
        head_ = head;
        tail_ = tail;
    }

private:
    RDMACHAN_HOST_DEVICE void write(const ReceiveWorkRequest& request) {
        const std::uint32_t slot = head_ & mask_;
        std::uint8_t* const wqe = ring_.buffer + static_cast<std::size_t>(slot) * ring_.stride;
        std::uint8_t* segment = wqe;
        if (config_.wqe_signature) {
            std::memset(wqe, 0, ring_.stride);
            segment += kReceiveSignatureSegmentSize;
        }
        std::uint32_t segments = 0;
        for (std::uint32_t i = 0; i < request.num_sge; ++i) {
            const ScatterGatherElement& element = request.sg_list[i];
            if (element.length == 0) continue;  // dropped and the list compacted, as libmlx5 does
            store_big32(segment, element.length);
            store_big32(segment + 4, element.lkey);
            store_big64(segment + 8, element.addr);
            segment += kDataSegmentSize;
            ++segments;
        }
        // The NIC scans up to max_sge segments; a shorter list ends with an invalid-lkey segment.
        if (segments < max_sge_) {
            store_big32(segment, 0);
            store_big32(segment + 4, kInvalidLkey);
            store_big64(segment + 8, 0);
        }
        if (config_.wqe_signature) {
            // The signature length counts the request's SGEs, compacted or not (libmlx5 does).
            const std::uint32_t length = (request.num_sge + 1) * kDataSegmentSize;
            std::uint8_t value = complement_xor(wqe, length);
            const std::uint32_t qpn = config_.qpn;
            value ^= complement_xor(reinterpret_cast<const std::uint8_t*>(&qpn), 4);
            const std::uint16_t index = static_cast<std::uint16_t>(head_ & 0xffff);
            value ^= complement_xor(reinterpret_cast<const std::uint8_t*>(&index), 2);
            wqe[4] = value;
        }
        wr_ids_[slot] = request.wr_id;
        ++head_;
    }

    RDMACHAN_HOST_DEVICE static std::uint8_t complement_xor(const std::uint8_t* bytes, std::uint32_t length) {
        std::uint8_t value = 0;
        for (std::uint32_t i = 0; i < length; ++i) value ^= bytes[i];
        return static_cast<std::uint8_t>(~value);
    }

    ReceiveQueueRing ring_{};
    std::uint64_t* wr_ids_ = nullptr;
    ReceiveQueueConfig config_{};
    std::uint32_t mask_ = 0;
    std::uint32_t max_sge_ = 0;
    std::uint32_t head_ = 0;  // WQEs posted, free running
    std::uint32_t tail_ = 0;  // WQEs completed
};

}  // namespace rdmachan::mlx5
