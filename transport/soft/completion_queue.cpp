// Completion queues of the software device: the mlx5 CQE ring and its doorbell records, and
// the arm doorbell that asks for a completion event.
#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#include "transport/soft/object_creation.hpp"

namespace rdmachan::soft {

std::shared_ptr<CompletionQueue> Device::create_completion_queue(std::uint32_t entries,
                                                                 std::uint32_t cqe_size,
                                                                 bool compressed) {
    creation::check_range("create_completion_queue", "entries", entries, 1, 4u << 20);
    if (cqe_size != 64 && cqe_size != 128)
        creation::fail("create_completion_queue: cqe_size = " + std::to_string(cqe_size) +
                       " (64 or 128)");
    auto context = std::make_unique<CompletionQueueContext>();
    const std::uint32_t count = creation::round_up_power_of_two(entries + 1);
    const std::size_t entry_bytes = static_cast<std::size_t>(count) * cqe_size;
    context->buffer =
        std::make_unique<AlignedBuffer>(entry_bytes + creation::kDoorbellBlockBytes, core_->arena);
    // Every entry starts invalid and owned by hardware, as libmlx5 initialises it.
    for (std::uint32_t i = 0; i < count; ++i) {
        context->buffer->data[static_cast<std::size_t>(i) * cqe_size + cqe_size - 1] =
            mlx5::kCqeInvalid << 4;
    }
    context->ring.buffer = context->buffer->data;
    context->ring.cqe_count = count;
    context->ring.cqe_size = cqe_size;
    context->ring.doorbell_record =
        reinterpret_cast<std::uint32_t*>(context->buffer->data + entry_bytes);
    context->ring.uar = context->uar;
    context->ring.compressed_cqes = compressed;
    context->compressed = compressed;
    context->event_descriptor = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (context->event_descriptor < 0) {
        creation::fail("create_completion_queue: eventfd for its completion events: " +
                       std::string(std::strerror(errno)));
    }
    const int event_descriptor = context->event_descriptor;
    std::lock_guard lock(core_->mutex);
    creation::publish_ring_memory(*core_);
    context->ring.cqn = core_->next_handle++;
    const mlx5::CompletionQueueRing ring = context->ring;
    core_->completion_queues[ring.cqn] = std::move(context);
    return std::shared_ptr<CompletionQueue>(
        new CompletionQueue(shared_from_this(), ring, event_descriptor));
}

CompletionQueueContext::~CompletionQueueContext() {
    if (event_descriptor >= 0) ::close(event_descriptor);
}

void CompletionQueue::ring_arm_doorbell() {
    const std::uint32_t word =
        mlx5::big_to_host32(mlx5::load_acquire32(ring_.doorbell_record + mlx5::kCqArm));
    // The arm word: sequence number, command (next or solicited), consumer index.
    const bool solicited_only = (word & mlx5::kCqArmSolicited) != 0;
    CompletionRingView::of(ring_, event_descriptor_)
        .take_arm(solicited_only, word & mlx5::kCqConsumerIndexMask);
}

bool CompletionQueue::take_event() {
    std::uint64_t count = 0;
    return ::read(event_descriptor_, &count, sizeof count) == static_cast<ssize_t>(sizeof count);
}

CompletionQueue::~CompletionQueue() {
    std::lock_guard lock(device_->core().mutex);
    device_->core().completion_queues.erase(ring_.cqn);
}

bool CompletionQueue::overrun() const {
    std::lock_guard lock(device_->core().mutex);
    auto found = device_->core().completion_queues.find(ring_.cqn);
    return found != device_->core().completion_queues.end() && found->second->overrun.load();
}

}  // namespace rdmachan::soft
