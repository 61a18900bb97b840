// A verbs completion queue and its generic poll: ibv_poll_cq into a stack array, translated
// to the project's Completion values; and its completion events when it has a completion
// channel. Keeps its Context and its channel alive (the CQ is destroyed before the channel).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <span>

#include "transport/mlx5/completion.hpp"
#include "transport/verbs/completion_channel.hpp"
#include "transport/verbs/context.hpp"

namespace rdmachan::verbs {

class CompletionQueue {
  public:
    // Throws VerbsError naming the device and the requested depth. With a channel, the CQ
    // raises its events there (ibv_create_cq's channel argument).
    static std::shared_ptr<CompletionQueue> create(
        std::shared_ptr<Context> context, std::uint32_t depth,
        std::shared_ptr<CompletionChannel> channel = nullptr);
    // Takes ownership of a CQ created elsewhere (e.g. mlx5dv_create_cq, with `channel` as the
    // creation's channel); keep_alive holds whatever else the CQ depends on (a parent domain)
    // until after ibv_destroy_cq.
    static std::shared_ptr<CompletionQueue> adopt(
        std::shared_ptr<Context> context, ibv_cq* cq,
        std::shared_ptr<const void> keep_alive = nullptr,
        std::shared_ptr<CompletionChannel> channel = nullptr);
    // Acknowledges the events taken and not yet acknowledged, then ibv_destroy_cq, which would
    // otherwise wait for them forever.
    ~CompletionQueue();
    CompletionQueue(const CompletionQueue&) = delete;
    CompletionQueue& operator=(const CompletionQueue&) = delete;

    ibv_cq* handle() const noexcept { return cq_; }
    const std::shared_ptr<Context>& context() const noexcept { return context_; }
    std::uint32_t depth() const noexcept { return static_cast<std::uint32_t>(cq_->cqe); }

    // Data path: no allocation, lock of ours, or exception. Returns how many entries of
    // `completions` were filled. If ibv_poll_cq itself fails (CQ overrun, device lost), one
    // entry with status fatal and vendor_error = the error's magnitude is returned, so the
    // failure reaches the caller as a value like every other data-path error.
    std::uint32_t poll(std::span<mlx5::Completion> completions) noexcept;

    // Completion events: the channel's descriptor, -1 without a channel.
    int event_descriptor() const noexcept {
        return channel_ != nullptr ? channel_->descriptor() : -1;
    }
    // The generic verbs path's arm: ibv_req_notify_cq for the next completion, then one poll. A
    // completion that came before the request raises no event, so a waiter that slept on it
    // would sleep through it: when the poll finds one, it is kept for the next poll() and arm()
    // returns false (sleep not). Also false without a channel or when the request fails. Never
    // on a CQ the mlx5 data path polls: libmlx5's arm would carry its own consumer index, which
    // that poller never advances (mlx5-facts.md §9, pitfall 7); the ring arms it instead.
    bool arm() noexcept;
    // Takes one completion event from the channel without waiting: true if one of this CQ's
    // was queued (ibv_get_cq_event; EAGAIN means none). Events are acknowledged in batches
    // (ibv_ack_cq_events takes libibverbs' CQ mutex), the rest when the CQ is destroyed.
    bool take_event() noexcept;

    // Events taken and acknowledged together (one ibv_ack_cq_events call per batch).
    static constexpr std::uint32_t kAcknowledgeBatch = 32;

  private:
    CompletionQueue(std::shared_ptr<Context> context, ibv_cq* cq,
                    std::shared_ptr<const void> keep_alive,
                    std::shared_ptr<CompletionChannel> channel)
        : context_(std::move(context)),
          channel_(std::move(channel)),
          keep_alive_(std::move(keep_alive)),
          cq_(cq) {}
    std::shared_ptr<Context> context_;
    std::shared_ptr<CompletionChannel> channel_;  // released after the destructor destroys the CQ
    std::shared_ptr<const void> keep_alive_;
    ibv_cq* cq_;
    std::uint32_t unacknowledged_ = 0;  // events taken, not yet acknowledged
    bool held_ = false;  // a completion arm() polled, returned first by the next poll()
    mlx5::Completion held_completion_{};
};

}  // namespace rdmachan::verbs
