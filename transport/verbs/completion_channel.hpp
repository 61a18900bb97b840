// A completion channel (ibv_comp_channel): the descriptor that a CQ created with it makes
// readable when the CQ, armed, gets a completion (the kernel queues one event per arm and the
// descriptor is readable while one is queued). Keeps its Context alive; each CompletionQueue
// created with it keeps it alive in turn, so the CQ is destroyed first (ibv_destroy_comp_channel
// refuses, EBUSY, while a CQ still uses the channel).
#pragma once

#include <infiniband/verbs.h>

#include <memory>

#include "transport/verbs/context.hpp"

namespace rdmachan::verbs {

class CompletionChannel {
  public:
    // A channel whose descriptor is non-blocking, so that ibv_get_cq_event returns at once (EAGAIN)
    // when no event is queued instead of waiting for one. Null, and the reason logged, when the
    // device gives none (the emulated ConnectX) or the process is out of descriptors: the CQ is
    // then created without one and its waits poll.
    static std::shared_ptr<CompletionChannel> try_create(std::shared_ptr<Context> context);
    ~CompletionChannel();
    CompletionChannel(const CompletionChannel&) = delete;
    CompletionChannel& operator=(const CompletionChannel&) = delete;

    ibv_comp_channel* handle() const noexcept { return channel_; }
    int descriptor() const noexcept { return channel_->fd; }

  private:
    CompletionChannel(std::shared_ptr<Context> context, ibv_comp_channel* channel)
        : context_(std::move(context)), channel_(channel) {}
    std::shared_ptr<Context> context_;
    ibv_comp_channel* channel_;
};

}  // namespace rdmachan::verbs
