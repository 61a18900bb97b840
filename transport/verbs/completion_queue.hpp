// A verbs completion queue and its generic poll: ibv_poll_cq into a stack array, translated
// to the project's Completion values. Keeps its Context alive.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <span>

#include "transport/mlx5/completion.hpp"
#include "transport/verbs/context.hpp"

namespace rdmachan::verbs {

class CompletionQueue {
  public:
    // Throws VerbsError naming the device and the requested depth.
    static std::shared_ptr<CompletionQueue> create(std::shared_ptr<Context> context,
                                                   std::uint32_t depth);
    // Takes ownership of a CQ created elsewhere (e.g. mlx5dv_create_cq); keep_alive holds
    // whatever else the CQ depends on (a parent domain) until after ibv_destroy_cq.
    static std::shared_ptr<CompletionQueue> adopt(std::shared_ptr<Context> context, ibv_cq* cq,
                                                  std::shared_ptr<const void> keep_alive = nullptr);
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

  private:
    CompletionQueue(std::shared_ptr<Context> context, ibv_cq* cq,
                    std::shared_ptr<const void> keep_alive)
        : context_(std::move(context)), keep_alive_(std::move(keep_alive)), cq_(cq) {}
    std::shared_ptr<Context> context_;
    std::shared_ptr<const void> keep_alive_;
    ibv_cq* cq_;
};

}  // namespace rdmachan::verbs
