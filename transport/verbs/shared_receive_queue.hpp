// Shared receive queue and address handle: small verbs objects, each keeping its protection
// domain alive.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <span>

#include "transport/mlx5/work_request.hpp"
#include "transport/verbs/protection_domain.hpp"

namespace rdmachan::verbs {

class SharedReceiveQueue {
  public:
    static std::shared_ptr<SharedReceiveQueue> create(std::shared_ptr<ProtectionDomain> pd,
                                                      std::uint32_t max_wr, std::uint32_t max_sge);
    ~SharedReceiveQueue();
    SharedReceiveQueue(const SharedReceiveQueue&) = delete;
    SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;

    ibv_srq* handle() const noexcept { return srq_; }
    const std::shared_ptr<ProtectionDomain>& protection_domain() const noexcept { return pd_; }
    // What the provider actually granted (at least what was asked).
    std::uint32_t max_wr() const noexcept { return max_wr_; }
    std::uint32_t max_sge() const noexcept { return max_sge_; }

    // Data path, same contract as QueuePair::post_receive.
    mlx5::PostResult post_receive(std::span<const mlx5::ReceiveWorkRequest> requests,
                                  std::uint32_t* posted) noexcept;

  private:
    SharedReceiveQueue(std::shared_ptr<ProtectionDomain> pd, ibv_srq* srq, std::uint32_t max_wr,
                       std::uint32_t max_sge)
        : pd_(std::move(pd)), srq_(srq), max_wr_(max_wr), max_sge_(max_sge) {}
    std::shared_ptr<ProtectionDomain> pd_;
    ibv_srq* srq_;
    std::uint32_t max_wr_;
    std::uint32_t max_sge_;
};

class AddressHandle {
  public:
    static std::shared_ptr<AddressHandle> create(std::shared_ptr<ProtectionDomain> pd,
                                                 const ibv_ah_attr& attributes);
    ~AddressHandle();
    AddressHandle(const AddressHandle&) = delete;
    AddressHandle& operator=(const AddressHandle&) = delete;

    ibv_ah* handle() const noexcept { return ah_; }

  private:
    AddressHandle(std::shared_ptr<ProtectionDomain> pd, ibv_ah* ah) : pd_(std::move(pd)), ah_(ah) {}
    std::shared_ptr<ProtectionDomain> pd_;
    ibv_ah* ah_;
};

}  // namespace rdmachan::verbs
