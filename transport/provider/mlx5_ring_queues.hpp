// The ring-based family of the transport interface: the mlx5 direct data path writing WQEs into
// and reading CQEs from rings, whoever owns them — a ConnectX (rings from mlx5dv_init_obj) or the
// software device. Providers supply the rings and the control plane (connect, move to error);
// posting and polling are the same code for both.
#pragma once

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "transport/device_interface.hpp"
#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/receive_queue.hpp"
#include "transport/mlx5/send_queue.hpp"

namespace rdmachan::transport {

// Where a ring CQ's completion events come from, besides the data path's arm (which writes the
// arm doorbell record and the CQ doorbell): the software device's eventfd, or a ConnectX CQ's
// completion channel.
class RingCompletionEvents {
public:
    virtual ~RingCompletionEvents() = default;
    virtual int descriptor() const noexcept = 0;
    // Right after the data path's arm: the software device is told, as ring_send_doorbell tells
    // it of a send doorbell; on a ConnectX the arm's register write was the doorbell.
    virtual void armed() noexcept = 0;
    // Takes one raised event; false when none was raised.
    virtual bool take() noexcept = 0;
};

// A CQ ring shared by any number of queue pairs: a CQE names its QP by number, and the QP's
// rings say which work request it completes.
class RingCompletionQueue final : public CompletionQueue {
public:
    // owner keeps the device object behind the ring alive; events, when the device has them.
    RingCompletionQueue(const mlx5::CompletionQueueRing& ring, std::shared_ptr<void> owner,
                        std::unique_ptr<RingCompletionEvents> events = nullptr);
    std::uint32_t poll(mlx5::Completion* completions, std::uint32_t capacity) noexcept override;
    std::uint32_t depth() const noexcept override { return ring_.cqe_count; }
    int event_descriptor() const noexcept override { return events_ != nullptr ? events_->descriptor() : -1; }
    bool arm() noexcept override;
    void take_event() noexcept override;

    // Control plane: queue pairs register their rings here while they exist.
    void attach(std::uint32_t qpn, mlx5::CompletionTarget* target);
    void detach(std::uint32_t qpn);
    const std::shared_ptr<void>& owner() const { return owner_; }

private:
    mlx5::CompletionTarget* find(std::uint32_t qpn) const noexcept;
    mlx5::CompletionTarget* search(std::uint32_t qpn) const noexcept;

    mlx5::CompletionQueueRing ring_;
    std::shared_ptr<void> owner_;
    mlx5::CompletionQueue queue_;
    std::unique_ptr<RingCompletionEvents> events_;
    // Sorted by qpn; a handful to a few thousand entries, searched by bisection.
    std::vector<std::pair<std::uint32_t, mlx5::CompletionTarget*>> targets_;
    // The last queue pair found: consecutive completions mostly come from the same one (always,
    // with one queue pair), and then no search is made. Reset by attach and detach.
    mutable std::uint32_t last_qpn_ = 0;
    mutable mlx5::CompletionTarget* last_target_ = nullptr;
};

struct RingQueuePairInit {
    mlx5::SendQueueRing send_ring;
    mlx5::ReceiveQueueRing receive_ring;
    std::uint32_t max_send_wr = 0;  // as granted
    std::uint32_t max_recv_wr = 0;
    std::uint32_t max_send_sge = 1;
    std::uint32_t max_inline_data = 0;
    bool dc_initiator = false;  // WQEs carry the address vector; no receive queue
    // Created with scatter-to-CQE: a CQE's data goes to the buffers of the WQE it completed, the
    // send WQE's read back from send_ring.
    bool scatter_to_cqe = false;
    std::shared_ptr<RingCompletionQueue> send_queue;
    std::shared_ptr<RingCompletionQueue> receive_queue;
};

// Posting for one queue pair over its rings. A provider derives from it for the control plane.
class RingQueuePair : public QueuePair {
public:
    explicit RingQueuePair(RingQueuePairInit init);
    ~RingQueuePair() override;
    RingQueuePair(const RingQueuePair&) = delete;
    RingQueuePair& operator=(const RingQueuePair&) = delete;

    std::uint32_t qpn() const noexcept override { return init_.send_ring.qpn; }
    mlx5::PostResult post_send(const mlx5::SendWorkRequest* requests, std::uint32_t count,
                               std::uint32_t* posted) noexcept override;
    mlx5::PostResult post_one(const mlx5::SendWorkRequest& request) noexcept override;
    mlx5::PostResult post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                  std::uint32_t* posted) noexcept override;
    std::uint32_t max_send_wr() const noexcept override { return init_.max_send_wr; }
    std::uint32_t max_recv_wr() const noexcept override { return init_.max_recv_wr; }
    // After the device reset the queue pair (DC initiator recovery): producer index back to 0.
    void reset_send_queue() { send_.reset(); }

protected:
    // The software device learns of a doorbell through a call (the hardware through the
    // BlueFlame write the send queue already made): a plain function pointer, not a virtual.
    void set_doorbell_notification(void (*notify)(void*), void* context) {
        notify_ = notify;
        notify_context_ = context;
    }

private:
    RingQueuePairInit init_;
    std::vector<std::uint64_t> send_wr_ids_;
    std::vector<std::uint32_t> send_wqe_ends_;
    std::vector<std::uint8_t> send_umr_opcodes_;  // per UMR WQE: LOCAL_INV or key configuration
    std::vector<std::uint64_t> receive_wr_ids_;
    mlx5::SendQueue send_;
    mlx5::ReceiveQueue receive_;
    mlx5::CompletionTarget target_;
    void (*notify_)(void*) = nullptr;
    void* notify_context_ = nullptr;
};

}  // namespace rdmachan::transport
