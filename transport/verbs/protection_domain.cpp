#include "transport/verbs/protection_domain.hpp"

#include <cstring>
#include <string>

#include <fmt/format.h>

#include <cerrno>

#include "transport/memory_lock.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

std::shared_ptr<ProtectionDomain> ProtectionDomain::allocate(std::shared_ptr<Context> context) {
    errno = 0;
    ibv_pd* pd = ibv_alloc_pd(context->handle());
    if (pd == nullptr)
        throw_from_errno("ibv_alloc_pd", fmt::format("device '{}'", context->name()));
    return std::shared_ptr<ProtectionDomain>(new ProtectionDomain(std::move(context), pd));
}

ProtectionDomain::~ProtectionDomain() {
    ibv_dealloc_pd(pd_);
}

std::shared_ptr<MemoryRegion> MemoryRegion::register_memory(std::shared_ptr<ProtectionDomain> pd,
                                                            void* address, std::size_t length,
                                                            unsigned access) {
    errno = 0;
    ibv_mr* mr = ibv_reg_mr(pd->handle(), address, length, static_cast<int>(access));
    if (mr == nullptr) {
        const int error = errno;
        std::string what = fmt::format("region {} length {} access {:#x} on device '{}'", address,
                                       length, access, pd->context()->name());
        // ENOMEM is nearly always the pinned-memory limit: say which and how much was asked.
        if (error == ENOMEM || error == EPERM)
            what += fmt::format(" (pins {} bytes; {})", transport::pinned_bytes(address, length),
                                transport::describe(transport::memory_lock_limit()));
        errno = error;
        throw_from_errno("ibv_reg_mr", what);
    }
    return std::shared_ptr<MemoryRegion>(new MemoryRegion(std::move(pd), mr, access));
}

void MemoryRegion::deregister() {
    if (mr_ == nullptr) return;
    const void* address = mr_->addr;
    const std::size_t length = mr_->length;
    if (const int error = ibv_dereg_mr(mr_); error != 0) {
        throw VerbsError("ibv_dereg_mr of " + std::to_string(length) + " bytes at " +
                             std::to_string(reinterpret_cast<std::uintptr_t>(address)) + ": " + std::strerror(error) +
                             " (the region stays registered)",
                         error);
    }
    mr_ = nullptr;
}

MemoryRegion::~MemoryRegion() {
    if (mr_ != nullptr) ibv_dereg_mr(mr_);
}

}  // namespace rdmachan::verbs
