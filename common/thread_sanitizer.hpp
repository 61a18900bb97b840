// Whether this code is compiled with ThreadSanitizer. The software device's progress thread
// stands in for a NIC, and ThreadSanitizer sees its copies as a thread's accesses and cannot see
// orders that run through another process; so in these builds the device hides its copies
// (transport/soft/dma_copy.hpp) and the ring provider tells ThreadSanitizer of a same-host peer's
// order (transport/provider/mlx5_ring_queues.cpp). The tests shorten runs it makes several times slower.
#pragma once

// GCC says so with __SANITIZE_THREAD__; Clang 14 only through __has_feature. A macro, not only
// the constant, since what it selects includes declarations (ThreadSanitizer's interface).
#if defined(__SANITIZE_THREAD__)
#define RDMACHAN_THREAD_SANITIZER 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMACHAN_THREAD_SANITIZER 1
#endif
#endif
#ifndef RDMACHAN_THREAD_SANITIZER
#define RDMACHAN_THREAD_SANITIZER 0
#endif

namespace rdmachan::detail {

inline constexpr bool kThreadSanitizerBuild = RDMACHAN_THREAD_SANITIZER != 0;

}  // namespace rdmachan::detail
