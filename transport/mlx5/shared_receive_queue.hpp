// The mlx5 shared receive queue: each WQE starts with a 16-byte next segment whose
// next_wqe_index (be16, bytes 2-3) links the free list that software and NIC walk together,
// then data segments. Posting never touches the next segment; completing a WQE appends it at the
// tail of the list (link[tail] = index), which is where the NIC will find it again. The ring's
// creator (libmlx5's mlx5_create_srq, or the software device) links 0→1→…→n-1 at creation.
#pragma once

#include <cstdint>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

inline constexpr std::uint32_t kSrqNextWqeIndex = 2;  // offset of next_wqe_index in the next segment

class SharedReceiveQueue {
public:
    SharedReceiveQueue() = default;

    // wr_ids: caller-owned, ring.wqe_count entries. head/tail: the free list's ends; a fresh
    // queue has head 0 and tail = the last WQE of the initial list, which is never posted
    // (the list is full when head == tail).
    RDMACHAN_HOST_DEVICE SharedReceiveQueue(const SharedReceiveQueueRing& ring, std::uint64_t* wr_ids,
                                            std::uint32_t head, std::uint32_t tail)
        : ring_(ring),
          wr_ids_(wr_ids),
          max_sge_((ring.stride - kSrqNextSegmentSize) / kDataSegmentSize),
          head_(head),
          tail_(tail) {}

    RDMACHAN_HOST_DEVICE PostResult post(const ReceiveWorkRequest* requests, std::uint32_t count,
                                         std::uint32_t* posted) {
        PostResult result = PostResult::ok;
        std::uint32_t written = 0;
        for (; written < count; ++written) {
            const ReceiveWorkRequest& request = requests[written];
            if (request.num_sge > max_sge_) { result = PostResult::too_many_sge; break; }
            if (head_ == tail_) { result = PostResult::queue_full; break; }
            std::uint8_t* const wqe = wqe_at(head_);
            std::uint8_t* segment = wqe + kSrqNextSegmentSize;
            for (std::uint32_t i = 0; i < request.num_sge; ++i) {
                // Zero-length SGEs are kept on an SRQ, as libmlx5 does.
                const ScatterGatherElement& element = request.sg_list[i];
                store_big32(segment, element.length);
                store_big32(segment + 4, element.lkey);
                store_big64(segment + 8, element.addr);
                segment += kDataSegmentSize;
            }
            if (request.num_sge < max_sge_) {
                store_big32(segment, 0);
                store_big32(segment + 4, kInvalidLkey);
                store_big64(segment + 8, 0);
            }
            wr_ids_[head_] = request.wr_id;
            head_ = load_big16(wqe + kSrqNextWqeIndex);
        }
        if (written != 0) {
            counter_ = static_cast<std::uint16_t>(counter_ + written);
            to_device_barrier();
            store_release32(ring_.doorbell_record, host_to_big32(counter_));
        }
        if (posted != nullptr) *posted = written;
        return result;
    }

    // A responder CQE (success or error) names the SRQ WQE it consumed; returns its wr_id and
    // gives the WQE back to the free list.
    RDMACHAN_HOST_DEVICE std::uint64_t complete(std::uint16_t wqe_counter) {
        const std::uint32_t index = wqe_counter & (ring_.wqe_count - 1);
        const std::uint64_t wr_id = wr_ids_[index];
        release(index);
        return wr_id;
    }

    RDMACHAN_HOST_DEVICE void release(std::uint32_t index) {
        store_big16(wqe_at(tail_) + kSrqNextWqeIndex, static_cast<std::uint16_t>(index));
        tail_ = index;
    }

    RDMACHAN_HOST_DEVICE std::uint32_t head() const { return head_; }
    RDMACHAN_HOST_DEVICE std::uint32_t tail() const { return tail_; }
    RDMACHAN_HOST_DEVICE std::uint16_t counter() const { return counter_; }
    RDMACHAN_HOST_DEVICE void set_counter(std::uint16_t counter) { counter_ = counter; }
    RDMACHAN_HOST_DEVICE std::uint32_t max_sge() const { return max_sge_; }
    RDMACHAN_HOST_DEVICE const SharedReceiveQueueRing& ring() const { return ring_; }

private:
    RDMACHAN_HOST_DEVICE std::uint8_t* wqe_at(std::uint32_t index) const {
        return ring_.buffer + static_cast<std::size_t>(index) * ring_.stride;
    }

    SharedReceiveQueueRing ring_{};
    std::uint64_t* wr_ids_ = nullptr;
    std::uint32_t max_sge_ = 0;
    std::uint32_t head_ = 0;
    std::uint32_t tail_ = 0;
    std::uint16_t counter_ = 0;  // WQEs posted, as the doorbell record carries it (16 bits)
};

}  // namespace rdmachan::mlx5
