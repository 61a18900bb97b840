// The device's arena of peer-mappable memory (shared_arena.hpp says why it exists and why its
// file only grows). Control path only: it locks, and makes system calls.
#include "transport/soft/shared_arena.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <iterator>

namespace rdmachan::soft {

SharedArena::~SharedArena() {
    if (base() != nullptr) ::munmap(base(), kArenaReserveBytes);
    if (descriptor_ >= 0) ::close(descriptor_);
}

bool SharedArena::create() {
    if (base() != nullptr) return true;
    if (failed_) return false;
    failed_ = true;  // until it worked: a failure is not retried on every allocation
    descriptor_ = ::memfd_create("rdmachan-soft-arena", MFD_CLOEXEC);
    if (descriptor_ < 0) {
        why_not_ = "memfd_create failed";
        return false;
    }
    // The whole reservation at once, over a file of size 0: pages exist only where the file
    // has grown, and MAP_NORESERVE keeps the reservation out of the commit charge.
    void* mapped = ::mmap(nullptr, kArenaReserveBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, descriptor_, 0);
    if (mapped == MAP_FAILED) {
        why_not_ = "mmap of the arena's reservation failed";
        ::close(descriptor_);
        descriptor_ = -1;
        return false;
    }
    // Not inherited by a forked child, as registered memory is not once libibverbs' fork support
    // is on (ibv_fork_init marks it MADV_DONTFORK): a child writing what it took for its own copy
    // would otherwise write this process's buffers, the mapping being shared.
    ::madvise(mapped, kArenaReserveBytes, MADV_DONTFORK);
    base_.store(static_cast<std::uint8_t*>(mapped), std::memory_order_release);
    failed_ = false;
    return true;
}

std::optional<std::uint64_t> SharedArena::allocate(std::uint64_t length) {
    if (length == 0 || length > kArenaReserveBytes) return std::nullopt;
    const std::uint64_t rounded = (length + kArenaAlignment - 1) & ~(kArenaAlignment - 1);
    std::lock_guard lock(mutex_);
    if (!create()) return std::nullopt;
    // First fit among the freed ranges.
    for (auto range = free_.begin(); range != free_.end(); ++range) {
        if (range->second < rounded) continue;
        const std::uint64_t offset = range->first;
        const std::uint64_t left = range->second - rounded;
        free_.erase(range);
        if (left != 0) free_.emplace(offset + rounded, left);
        return offset;
    }
    // Grow the file: from the last free range if it reaches the end, else from the end.
    const std::uint64_t size = file_size();
    std::uint64_t offset = size;
    if (!free_.empty()) {
        const auto last = std::prev(free_.end());
        if (last->first + last->second == size) offset = last->first;
    }
    if (offset + rounded > kArenaReserveBytes) return std::nullopt;
    if (::ftruncate(descriptor_, static_cast<off_t>(offset + rounded)) != 0) return std::nullopt;
    if (offset != size) free_.erase(offset);
    file_size_.store(offset + rounded, std::memory_order_release);
    return offset;
}

void SharedArena::release(std::uint64_t offset, std::uint64_t length) {
    const std::uint64_t rounded = (length + kArenaAlignment - 1) & ~(kArenaAlignment - 1);
    std::lock_guard lock(mutex_);
    if (base() == nullptr || rounded == 0) return;
    // The pages go back to the kernel, and the range reads as zeros when it is handed out again.
    (void)::fallocate(descriptor_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
                      static_cast<off_t>(rounded));
    auto [range, inserted] = free_.emplace(offset, rounded);
    if (!inserted) return;  // released twice: a caller's bug; keep the map consistent
    // Merge with the neighbours so that large allocations find room again.
    if (const auto next = std::next(range); next != free_.end() && range->first + range->second == next->first) {
        range->second += next->second;
        free_.erase(next);
    }
    if (range != free_.begin()) {
        const auto previous = std::prev(range);
        if (previous->first + previous->second == range->first) {
            previous->second += range->second;
            free_.erase(range);
        }
    }
}

}  // namespace rdmachan::soft
