// Memory regions of the software device: registration of caller memory or of the shared arena
// (checked as a ConnectX's driver checks it, pinning accounted as the kernel does), and
// deregistration that waits out a peer's zero-hop access.
#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <random>
#include <string>

#include "common/logger.hpp"
#include "transport/memory_lock.hpp"
#include "transport/soft/object_creation.hpp"

namespace rdmachan::soft {
namespace {

// Bytes pinned by every software device's registrations in this process, the figure the
// kernel checks against RLIMIT_MEMLOCK.
std::atomic<std::uint64_t> process_pinned_bytes{0};

std::string hex_address(const void* address) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", address);
    return text;
}

}  // namespace

std::shared_ptr<MemoryRegion> Device::register_memory(
    const std::shared_ptr<ProtectionDomain>& domain, void* addr, std::size_t length,
    std::uint32_t access_flags) {
    return register_range("register_memory", domain, addr, length, access_flags, 0);
}

std::shared_ptr<MemoryRegion> Device::allocate_memory(
    const std::shared_ptr<ProtectionDomain>& domain, std::size_t length,
    std::uint32_t access_flags) {
    if (domain == nullptr || domain->device().get() != this)
        creation::fail("allocate_memory: the protection domain belongs to another device");
    if (length == 0) creation::fail("allocate_memory: length is 0");
    SharedArena& arena = core_->arena;
    const std::optional<std::uint64_t> offset = arena.allocate(length);
    if (!offset) return nullptr;
    {
        std::lock_guard lock(core_->mutex);
        creation::publish_ring_memory(*core_);
    }
    try {
        return register_range("allocate_memory", domain, arena.base() + *offset, length,
                              access_flags, *offset + 1);
    } catch (...) {
        arena.release(*offset, length);
        throw;
    }
}

std::string Device::arena_refusal() const {
    if (const char* why = core_->arena.why_not(); why != nullptr) return why;
    return "its reservation of " + std::to_string(kArenaReserveBytes >> 30) +
           " GiB has no room for it";
}

std::shared_ptr<MemoryRegion> Device::register_range(
    const char* call, const std::shared_ptr<ProtectionDomain>& domain, void* addr,
    std::size_t length, std::uint32_t access_flags, std::uint64_t arena_offset) {
    const std::string name = call;
    if (domain == nullptr || domain->device().get() != this)
        creation::fail(name + ": the protection domain belongs to another device");
    if (addr == nullptr) creation::fail(name + ": addr is null");
    if (length == 0) creation::fail(name + ": length is 0");
    if ((access_flags & ~(kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic)) != 0) {
        creation::fail(name + ": unknown access flags 0x" + std::to_string(access_flags));
    }
    // As verbs requires: remote write or atomic access needs local write access too.
    if ((access_flags & (kRemoteWrite | kRemoteAtomic)) != 0 && (access_flags & kLocalWrite) == 0) {
        creation::fail(name +
                       ": remote write/atomic access requires local write access (access flags " +
                       std::to_string(access_flags) + ")");
    }
    // Pinning is accounted per process, in whole pages, as the kernel does for ibv_reg_mr.
    const std::uint64_t pinned = transport::pinned_bytes(addr, length);
    const transport::MemoryLockLimit limit = transport::memory_lock_limit();
    if (!limit.exempt && limit.bytes) {
        std::uint64_t held = process_pinned_bytes.load();
        do {
            if (held + pinned > *limit.bytes) {
                creation::fail(name + ": " + std::to_string(length) + " bytes at " +
                               hex_address(addr) + " pin " + std::to_string(pinned) + " bytes, " +
                               std::to_string(held) +
                               " already pinned by this process; that exceeds the limit: " +
                               transport::describe(limit) +
                               " (a ConnectX's driver refuses it with ENOMEM too)");
            }
        } while (!process_pinned_bytes.compare_exchange_weak(held, held + pinned));
    } else {
        process_pinned_bytes.fetch_add(pinned);
    }
    std::lock_guard lock(core_->mutex);
    // The low byte is a per-registration tag, so a stale key of a freed region is not accepted
    // by the region that reuses its index.
    static thread_local std::mt19937 random(std::random_device{}());
    const std::uint32_t key = (core_->translation.allocate_key_index() << 8) | (random() & 0xff);
    core_->translation.add_region(key, MemoryRegionState{
        domain->handle(), reinterpret_cast<std::uint64_t>(addr), length, access_flags});
    core_->published_table.publish_region(key, domain->handle(),
                                          reinterpret_cast<std::uint64_t>(addr), length,
                                          access_flags, arena_offset);
    return std::shared_ptr<MemoryRegion>(
        new MemoryRegion(domain, reinterpret_cast<std::uint64_t>(addr), length, key, arena_offset));
}

namespace {
// How long deregistration waits for a peer's zero-hop write that checked the key before it was
// withdrawn. A write holds it for one process_vm_writev; only a peer stopped between its check and
// the end of its write (SIGSTOP, a debugger) holds it longer, and one that exited is reclaimed.
constexpr int kDeregistrationDeadlineMs = 2000;
}  // namespace

std::uint32_t MemoryRegion::withdraw(bool restore_when_busy) {
    DeviceCore& core = domain_->device()->core();
    MemoryRegionState state{};
    bool published = false;
    {
        std::lock_guard lock(core.mutex);
        if (const auto removed = core.translation.remove_region(key_)) state = *removed;
        published = core.published_table.unpublish_region(key_);
    }
    // Outside the mutex, so the device goes on while we wait.
    const std::uint32_t holder =
        published ? core.published_table.wait_unused(key_, kDeregistrationDeadlineMs) : 0;
    if (holder != 0 && restore_when_busy) {
        std::lock_guard lock(core.mutex);
        core.translation.add_region(key_, state);
        core.published_table.publish_region(key_, state.protection_domain, state.addr, state.length,
                                            state.access, arena_offset_);
        return holder;
    }
    deregistered_ = true;
    process_pinned_bytes.fetch_sub(
        transport::pinned_bytes(reinterpret_cast<const void*>(addr_), length_));
    return holder;
}

void MemoryRegion::release_memory() {
    if (arena_offset_ != 0) domain_->device()->core().arena.release(arena_offset_ - 1, length_);
    arena_offset_ = 0;
}

void MemoryRegion::deregister() {
    if (deregistered_) return;
    // An arena region's memory stays until the destructor: the caller may still hold it.
    if (const std::uint32_t holder = withdraw(true); holder != 0) {
        throw SoftDeviceError("deregister_memory on " + domain_->device()->name() +
                              ": memory region key " +
                              hex_address(reinterpret_cast<const void*>(std::uintptr_t{key_})) +
                              " is busy: process " + std::to_string(holder) +
                              " (a peer stopped in a zero-hop write of it) still held it " +
                              std::to_string(kDeregistrationDeadlineMs) +
                              " ms after deregistration began; the region stays registered (as "
                              "ibv_dereg_mr's EBUSY): "
                              "try again once that process runs again or has exited");
    }
}

MemoryRegion::~MemoryRegion() {
    if (deregistered_) {  // by deregister(), with no peer holding it: the memory is free to go
        release_memory();
        return;
    }
    // A destructor cannot creation::fail: the key is withdrawn either way (no new access starts),
    // and a peer still holding it is named. deregister() is the call that fails instead.
    if (const std::uint32_t holder = withdraw(false); holder != 0) {
        // An arena region's memory is kept out of the arena then (leaked until the device
        // closes), so that write cannot land in another region that reuses it.
        detail::logger().error(
            "software device {}: memory region key {:#x}: process {} (a peer stopped in a zero-hop "
            "write of it) "
            "still held it {} ms after deregistration began; destroyed anyway, so that process may "
            "still "
            "complete one write into this memory when it runs again (MemoryRegion::deregister() "
            "fails instead)",
            domain_->device()->name(), key_, holder, kDeregistrationDeadlineMs);
    } else {
        release_memory();
    }
}

}  // namespace rdmachan::soft
