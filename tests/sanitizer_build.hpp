// Whether this test is compiled with AddressSanitizer or ThreadSanitizer, whose runtimes own the
// allocator and make every memory access several times slower.
#pragma once

#include "common/thread_sanitizer.hpp"

// GCC says so with __SANITIZE_ADDRESS__; Clang 14 only through __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define RDMACHAN_ADDRESS_SANITIZER_RUNTIME 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RDMACHAN_ADDRESS_SANITIZER_RUNTIME 1
#endif
#endif
#if defined(RDMACHAN_ADDRESS_SANITIZER_RUNTIME) || RDMACHAN_THREAD_SANITIZER
#define RDMACHAN_SANITIZER_RUNTIME 1
#endif

namespace rdmachan::test {

#if defined(RDMACHAN_SANITIZER_RUNTIME)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// ThreadSanitizer alone: every memory access is checked, several times slower than the others.
inline constexpr bool kThreadSanitizerBuild = detail::kThreadSanitizerBuild;

// AddressSanitizer alone: its quarantine holds freed memory, so a process's resident size grows.
#if defined(RDMACHAN_ADDRESS_SANITIZER_RUNTIME)
inline constexpr bool kAddressSanitizerBuild = true;
#else
inline constexpr bool kAddressSanitizerBuild = false;
#endif

}  // namespace rdmachan::test
