#pragma once

// The software device's copies into and out of registered memory: what a NIC does by DMA.
//
// On hardware, ThreadSanitizer never sees those accesses: the NIC is not a thread. The
// application may poll a word the NIC is writing (MultiChannel's barrier does, with atomic
// loads, as perftest's ib_write_lat polls a byte), and what orders the rest of its accesses
// with the DMA is a completion, which the library synchronises on. The software device's
// progress thread is a thread of the same process, though, so its memcpy showed up in
// ThreadSanitizer builds as racing with those polls (the barrier test: a peer's next count
// landing while this rank read the previous one), and a report naming the reader could not be
// suppressed when the reader's stack was no longer in ThreadSanitizer's history. So in
// ThreadSanitizer builds the copy is made with the thread's memory accesses ignored, as a
// NIC's are; synchronisation (the CQE's release, the doorbell's acquire) is still tracked, and
// the device's own structures (queue pairs, rings, CQEs) are still checked.
// Elsewhere it is plain memcpy.

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "common/thread_sanitizer.hpp"

#if RDMACHAN_THREAD_SANITIZER
// ThreadSanitizer's interface (both GCC's and Clang's runtimes export it).
extern "C" void __tsan_ignore_thread_begin();
extern "C" void __tsan_ignore_thread_end();
#endif

namespace rdmachan::soft {

// While one lives, the calling thread's accesses are the NIC's, unseen by ThreadSanitizer as
// dma_copy's are: for a copy a standard container makes (a vector's insert from application
// memory) that dma_copy cannot stand in for without writing the bytes twice.
class DmaAccess {
  public:
#if RDMACHAN_THREAD_SANITIZER
    DmaAccess() noexcept { __tsan_ignore_thread_begin(); }
    ~DmaAccess() { __tsan_ignore_thread_end(); }
#else
    DmaAccess() noexcept = default;
#endif
    DmaAccess(const DmaAccess&) = delete;
    DmaAccess& operator=(const DmaAccess&) = delete;
};

// Copies `length` bytes; either side may be application memory. The ranges must not overlap.
inline void dma_copy(void* destination, const void* source, std::size_t length) noexcept {
    if (length == 0) return;
    [[maybe_unused]] const DmaAccess access;
    std::memcpy(destination, source, length);
}

}  // namespace rdmachan::soft
