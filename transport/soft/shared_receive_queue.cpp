// Shared receive queues of the software device: the mlx5 SRQ ring of linked WQEs.
#include "transport/mlx5/shared_receive_queue.hpp"

#include "transport/soft/object_creation.hpp"

namespace rdmachan::soft {

std::shared_ptr<SharedReceiveQueue> Device::create_shared_receive_queue(
    const std::shared_ptr<ProtectionDomain>& domain, std::uint32_t max_wr, std::uint32_t max_sge) {
    creation::check_range("create_shared_receive_queue", "max_wr", max_wr, 1,
                          creation::kMaxQueueEntries - 1);
    creation::check_range("create_shared_receive_queue", "max_sge", max_sge, 1,
                          creation::kMaxScatterGatherElements);
    auto context = std::make_unique<SharedReceiveQueueContext>();
    const std::uint32_t stride =
        creation::round_up_power_of_two(std::max(32u, mlx5::kSrqNextSegmentSize + 16 * max_sge));
    // One WQE more than max_wr: the free list's tail is a sentinel that is never posted.
    const std::uint32_t count = creation::round_up_power_of_two(max_wr + 1);
    context->buffer =
        std::make_unique<AlignedBuffer>(static_cast<std::size_t>(count) * stride, core_->arena);
    context->doorbell = std::make_unique<AlignedBuffer>(64, core_->arena);
    for (std::uint32_t i = 0; i < count; ++i) {
        mlx5::store_big16(
            context->buffer->data + static_cast<std::size_t>(i) * stride + mlx5::kSrqNextWqeIndex,
            static_cast<std::uint16_t>(i + 1 < count ? i + 1 : 0));
    }
    context->protection_domain = domain->handle();
    context->ring.buffer = context->buffer->data;
    context->ring.wqe_count = count;
    context->ring.stride = stride;
    context->ring.doorbell_record = reinterpret_cast<std::uint32_t*>(context->doorbell->data);
    std::lock_guard lock(core_->mutex);
    context->ring.srqn = core_->next_handle++;
    const mlx5::SharedReceiveQueueRing ring = context->ring;
    core_->shared_receive_queues[ring.srqn] = std::move(context);
    return std::shared_ptr<SharedReceiveQueue>(new SharedReceiveQueue(domain, ring));
}

SharedReceiveQueue::~SharedReceiveQueue() {
    DeviceCore& core = domain_->device()->core();
    std::lock_guard lock(core.mutex);
    core.shared_receive_queues.erase(ring_.srqn);
}

}  // namespace rdmachan::soft
