// Memory that same-host peers map: what Device::allocate_memory hands out.
//
// A zero-hop write into memory the user registered from the heap must go through
// process_vm_writev, one system call that also pins and unpins the target's pages (about 1 µs and
// a third of memcpy's bandwidth here; transport/soft/README.md). Memory the device allocates
// itself can be shared instead: every device has one arena, a memfd mapped once in the device's
// process, and a peer that already maps the device's published table maps the arena too (same
// pidfd_getfd permission, published_table.hpp). A zero-hop write into an arena region is then a
// memcpy into the peer's mapping, with no system call and no thread of the target involved, as
// UCX's shared-memory transport does with ucp_mem_map's memory.
//
// The arena is a fixed reservation of virtual address space (kArenaReserveBytes), mapped
// MAP_SHARED over the memfd, whose file grows (ftruncate) as allocations need it and never
// shrinks: a peer's mapping of the whole reservation then never reaches past the end of the file
// where a region lies, so it never faults with SIGBUS. A freed range gives its pages back to the
// kernel (fallocate PUNCH_HOLE) and reads as zeros if reused.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>

namespace rdmachan::soft {

// Virtual address space one arena takes, in its device's process and in each peer mapping it.
// Allocations past it are refused here (Device::allocate_memory then returns nullptr and the
// caller registers ordinary memory).
inline constexpr std::uint64_t kArenaReserveBytes = 16ull << 30;
inline constexpr std::uint64_t kArenaAlignment = 4096;

class SharedArena {
public:
    SharedArena() = default;
    ~SharedArena();
    SharedArena(const SharedArena&) = delete;
    SharedArena& operator=(const SharedArena&) = delete;

    // The offset of `length` zeroed bytes (rounded up to whole pages), or nullopt when the arena
    // cannot be made (no memfd: `why_not()` says so) or the reservation is full. Makes the
    // arena on first use, so devices that never allocate pay nothing.
    std::optional<std::uint64_t> allocate(std::uint64_t length);
    // Returns [offset, offset + length) to the arena: its pages go back to the kernel.
    void release(std::uint64_t offset, std::uint64_t length);

    // Valid once an allocation succeeded; base() + offset is the memory in this process.
    std::uint8_t* base() const { return base_.load(std::memory_order_acquire); }
    int descriptor() const { return descriptor_; }
    // The memfd's size: every allocation lies below it.
    std::uint64_t file_size() const { return file_size_.load(std::memory_order_acquire); }
    // Whether [address, address + length) lies in this arena (the data path asks: no lock). Such
    // memory stays mapped until the device closes, so reading it never faults, even after its
    // region was freed (it then reads as zeros).
    bool holds(const void* address, std::uint64_t length) const {
        const auto first = reinterpret_cast<std::uintptr_t>(address);
        const auto start = reinterpret_cast<std::uintptr_t>(base());
        const std::uint64_t size = file_size();
        return start != 0 && first >= start && first - start <= size && length <= size - (first - start);
    }
    // base() + offset for [offset, offset + length), or nullptr when that range does not lie
    // below file_size() (or there is no arena yet).
    std::uint8_t* range(std::uint64_t offset, std::uint64_t length) const {
        std::uint8_t* start = base();
        const std::uint64_t size = file_size();
        return start != nullptr && offset <= size && length <= size - offset ? start + offset : nullptr;
    }
    const char* why_not() const { return why_not_; }

private:
    bool create();
    mutable std::mutex mutex_;
    std::atomic<std::uint8_t*> base_{nullptr};
    int descriptor_ = -1;
    std::atomic<std::uint64_t> file_size_{0};
    std::map<std::uint64_t, std::uint64_t> free_;  // offset -> length, below file_size_, merged
    const char* why_not_ = nullptr;
    bool failed_ = false;
};

}  // namespace rdmachan::soft
