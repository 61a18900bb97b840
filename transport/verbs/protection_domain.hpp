// Protection domain and memory region. A MemoryRegion keeps its ProtectionDomain (and so the
// Context) alive; the region's memory itself stays owned by the caller.
#pragma once

#include <infiniband/verbs.h>

#include <cstddef>
#include <cstdint>
#include <memory>

#include "transport/verbs/context.hpp"

namespace rdmachan::verbs {

class ProtectionDomain {
  public:
    static std::shared_ptr<ProtectionDomain> allocate(std::shared_ptr<Context> context);
    ~ProtectionDomain();
    ProtectionDomain(const ProtectionDomain&) = delete;
    ProtectionDomain& operator=(const ProtectionDomain&) = delete;

    ibv_pd* handle() const noexcept { return pd_; }
    const std::shared_ptr<Context>& context() const noexcept { return context_; }

  private:
    ProtectionDomain(std::shared_ptr<Context> context, ibv_pd* pd)
        : context_(std::move(context)), pd_(pd) {}
    std::shared_ptr<Context> context_;
    ibv_pd* pd_;
};

class MemoryRegion {
  public:
    // access: IBV_ACCESS_* bits. Throws VerbsError naming the address, length and access
    // (e.g. EINVAL for remote write without local write, EFAULT for unmapped memory).
    static std::shared_ptr<MemoryRegion> register_memory(std::shared_ptr<ProtectionDomain> pd,
                                                         void* address, std::size_t length,
                                                         unsigned access);
    ~MemoryRegion();
    MemoryRegion(const MemoryRegion&) = delete;
    MemoryRegion& operator=(const MemoryRegion&) = delete;
    // ibv_dereg_mr now; throws VerbsError with its errno (EBUSY: memory windows still bound), the
    // region then staying registered. The accessors below are for before it.
    void deregister();

    ibv_mr* handle() const noexcept { return mr_; }
    std::uint64_t address() const noexcept { return reinterpret_cast<std::uintptr_t>(mr_->addr); }
    std::size_t length() const noexcept { return mr_->length; }
    std::uint32_t lkey() const noexcept { return mr_->lkey; }
    std::uint32_t rkey() const noexcept { return mr_->rkey; }
    unsigned access() const noexcept { return access_; }

  private:
    MemoryRegion(std::shared_ptr<ProtectionDomain> pd, ibv_mr* mr, unsigned access)
        : pd_(std::move(pd)), mr_(mr), access_(access) {}
    std::shared_ptr<ProtectionDomain> pd_;
    ibv_mr* mr_;
    unsigned access_;
};

}  // namespace rdmachan::verbs
