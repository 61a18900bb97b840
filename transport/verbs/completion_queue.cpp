#include "transport/verbs/completion_queue.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cerrno>

#include "transport/verbs/verbs_error.hpp"
#include "transport/verbs/work_request_translation.hpp"

namespace rdmachan::verbs {

namespace {
// Entries fetched per ibv_poll_cq call; the stack array stays small (48 B per ibv_wc).
constexpr std::size_t kPollBatch = 32;
}  // namespace

std::shared_ptr<CompletionQueue> CompletionQueue::create(
    std::shared_ptr<Context> context, std::uint32_t depth,
    std::shared_ptr<CompletionChannel> channel) {
    errno = 0;
    ibv_cq* cq = ibv_create_cq(context->handle(), static_cast<int>(depth), nullptr,
                               channel != nullptr ? channel->handle() : nullptr, 0);
    if (cq == nullptr) {
        throw_from_errno("ibv_create_cq",
                         fmt::format("device '{}' depth {}", context->name(), depth));
    }
    return std::shared_ptr<CompletionQueue>(
        new CompletionQueue(std::move(context), cq, nullptr, std::move(channel)));
}

std::shared_ptr<CompletionQueue> CompletionQueue::adopt(
    std::shared_ptr<Context> context, ibv_cq* cq, std::shared_ptr<const void> keep_alive,
    std::shared_ptr<CompletionChannel> channel) {
    return std::shared_ptr<CompletionQueue>(
        new CompletionQueue(std::move(context), cq, std::move(keep_alive), std::move(channel)));
}

CompletionQueue::~CompletionQueue() {
    // ibv_destroy_cq returns only once every event ibv_get_cq_event handed out was
    // acknowledged (events still queued unread are dropped by the kernel, not waited for).
    if (unacknowledged_ != 0) ibv_ack_cq_events(cq_, unacknowledged_);
    ibv_destroy_cq(cq_);
}

std::uint32_t CompletionQueue::poll(std::span<mlx5::Completion> completions) noexcept {
    std::uint32_t filled = 0;
    if (held_ && !completions.empty()) {
        completions[filled++] = held_completion_;
        held_ = false;
    }
    ibv_wc entries[kPollBatch];
    while (filled < completions.size()) {
        const std::size_t wanted = std::min(kPollBatch, completions.size() - filled);
        const int count = ibv_poll_cq(cq_, static_cast<int>(wanted), entries);
        if (count < 0) {
            mlx5::Completion failure;
            failure.status = mlx5::CompletionStatus::fatal;
            failure.vendor_error = static_cast<std::uint8_t>(-count);
            completions[filled++] = failure;
            break;
        }
        for (int i = 0; i < count; ++i) completions[filled++] = from_ibv_wc(entries[i]);
        if (static_cast<std::size_t>(count) < wanted) break;  // the CQ is empty
    }
    return filled;
}

bool CompletionQueue::arm() noexcept {
    if (channel_ == nullptr || held_) return false;
    if (ibv_req_notify_cq(cq_, 0) != 0) return false;
    // Requested first, polled second: a completion the poll misses comes after the request
    // and raises the event.
    mlx5::Completion completion;
    if (poll({&completion, 1}) == 0) return true;
    held_completion_ = completion;
    held_ = true;
    return false;
}

bool CompletionQueue::take_event() noexcept {
    if (channel_ == nullptr) return false;
    ibv_cq* cq = nullptr;
    void* cq_context = nullptr;
    if (ibv_get_cq_event(channel_->handle(), &cq, &cq_context) != 0) return false;  // none queued
    if (cq != cq_) {
        // Each channel serves one CQ, so this cannot happen; were it another CQ's event, it is
        // acknowledged at once, so that CQ's destruction does not wait for it.
        ibv_ack_cq_events(cq, 1);
        return false;
    }
    if (++unacknowledged_ == kAcknowledgeBatch) {
        ibv_ack_cq_events(cq_, unacknowledged_);
        unacknowledged_ = 0;
    }
    return true;
}

}  // namespace rdmachan::verbs
