#include "transport/provider/mlx5_ring_queues.hpp"

#include <algorithm>

#include "common/thread_sanitizer.hpp"
#if RDMACHAN_THREAD_SANITIZER
#include "transport/soft/device.hpp"
#endif

namespace rdmachan::transport {

RingCompletionQueue::RingCompletionQueue(const mlx5::CompletionQueueRing& ring, std::shared_ptr<void> owner,
                                         std::unique_ptr<RingCompletionEvents> events)
    : ring_(ring), owner_(std::move(owner)), queue_(ring), events_(std::move(events)) {}

bool RingCompletionQueue::arm() noexcept {
    if (events_ == nullptr || queue_.completion_waiting()) return false;
    queue_.arm(false);
    events_->armed();
    // A CQE written between the check and the arm: whether its event comes depends on where the
    // device drew the line; the caller polls it now rather than sleep on that.
    return !queue_.completion_waiting();
}

void RingCompletionQueue::take_event() noexcept {
    if (events_ != nullptr && events_->take()) queue_.event_received();
}

mlx5::CompletionTarget* RingCompletionQueue::find(std::uint32_t qpn) const noexcept {
    if (qpn == last_qpn_ && last_target_ != nullptr) return last_target_;
    mlx5::CompletionTarget* const target = search(qpn);
    if (target != nullptr) {
        last_qpn_ = qpn;
        last_target_ = target;
    }
    return target;
}

mlx5::CompletionTarget* RingCompletionQueue::search(std::uint32_t qpn) const noexcept {
    const auto found = std::lower_bound(targets_.begin(), targets_.end(), qpn,
                                        [](const auto& entry, std::uint32_t key) { return entry.first < key; });
    return found != targets_.end() && found->first == qpn ? found->second : nullptr;
}

std::uint32_t RingCompletionQueue::poll(mlx5::Completion* completions, std::uint32_t capacity) noexcept {
    const std::uint32_t count = queue_.poll(completions, capacity, [this](std::uint32_t qpn, std::uint32_t) { return find(qpn); });
#if RDMACHAN_THREAD_SANITIZER
    // On the software device a same-host peer's thread may write a CQE into this CQ (a zero-hop
    // receive), after this process's device thread placed the bytes of an earlier request that
    // the peer's completion says arrived. The order runs through the peer's process, which
    // ThreadSanitizer cannot see: the device thread releases after every request it performs,
    // and a completion polled acquires, as soft::acquire_remote_writes says. Real memory order
    // needs nothing more than the CQE's owner byte, read with acquire.
    if (count != 0) soft::acquire_remote_writes();
#endif
    return count;
}

void RingCompletionQueue::attach(std::uint32_t qpn, mlx5::CompletionTarget* target) {
    const auto position = std::lower_bound(targets_.begin(), targets_.end(), qpn,
                                           [](const auto& entry, std::uint32_t key) { return entry.first < key; });
    targets_.insert(position, {qpn, target});
    last_target_ = nullptr;
}

void RingCompletionQueue::detach(std::uint32_t qpn) {
    std::erase_if(targets_, [qpn](const auto& entry) { return entry.first == qpn; });
    last_target_ = nullptr;
}

RingQueuePair::RingQueuePair(RingQueuePairInit init)
    : init_(std::move(init)),
      send_wr_ids_(init_.send_ring.wqe_count),
      send_wqe_ends_(init_.send_ring.wqe_count),
      send_umr_opcodes_(init_.send_ring.wqe_count),
      receive_wr_ids_(init_.receive_ring.wqe_count) {
    mlx5::SendQueueConfig config;
    config.max_sge = init_.max_send_sge;
    config.max_inline_data = init_.max_inline_data;
    config.dc_initiator = init_.dc_initiator;
    send_ = mlx5::SendQueue(init_.send_ring,
                            {send_wr_ids_.data(), send_wqe_ends_.data(), 0, 0, send_umr_opcodes_.data()}, config);
    receive_ = mlx5::ReceiveQueue(init_.receive_ring, receive_wr_ids_.data(), {});
    target_.send = &send_.tracking();
    target_.send_wqe_count = init_.send_ring.wqe_count;
    target_.receive = init_.receive_ring.wqe_count != 0 ? &receive_ : nullptr;
    target_.scatter_to_cqe = init_.scatter_to_cqe;
    target_.send_ring = init_.scatter_to_cqe ? init_.send_ring.buffer : nullptr;
    init_.send_queue->attach(qpn(), &target_);
    if (init_.receive_queue != init_.send_queue) init_.receive_queue->attach(qpn(), &target_);
}

RingQueuePair::~RingQueuePair() {
    init_.send_queue->detach(qpn());
    if (init_.receive_queue != init_.send_queue) init_.receive_queue->detach(qpn());
}

mlx5::PostResult RingQueuePair::post_send(const mlx5::SendWorkRequest* requests, std::uint32_t count,
                                          std::uint32_t* posted) noexcept {
    std::uint32_t accepted = 0;
    const mlx5::PostResult result = send_.post(requests, count, &accepted);
    if (accepted != 0 && notify_ != nullptr) notify_(notify_context_);
    if (posted != nullptr) *posted = accepted;
    return result;
}

// The same post with a count of one known to the compiler: no loop over requests, no count.
mlx5::PostResult RingQueuePair::post_one(const mlx5::SendWorkRequest& request) noexcept {
    const mlx5::PostResult result = send_.post(&request, 1, nullptr);
    // One request is accepted exactly when the post is ok.
    if (result == mlx5::PostResult::ok && notify_ != nullptr) notify_(notify_context_);
    return result;
}

mlx5::PostResult RingQueuePair::post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                             std::uint32_t* posted) noexcept {
    return receive_.post(requests, count, posted);
}

}  // namespace rdmachan::transport
