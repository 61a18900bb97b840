// Whether this test is compiled with AddressSanitizer or ThreadSanitizer, whose runtimes own the
// allocator and make every memory access several times slower.
#pragma once

// GCC says so with __SANITIZE_*__; Clang 14 only through __has_feature.
#if defined(__SANITIZE_ADDRESS__)
#define RDMACHAN_ADDRESS_SANITIZER_RUNTIME 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RDMACHAN_ADDRESS_SANITIZER_RUNTIME 1
#endif
#endif
#if defined(RDMACHAN_ADDRESS_SANITIZER_RUNTIME) || defined(__SANITIZE_THREAD__)
#define RDMACHAN_SANITIZER_RUNTIME 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define RDMACHAN_SANITIZER_RUNTIME 1
#endif
#endif

namespace rdmachan::test {

#if defined(RDMACHAN_SANITIZER_RUNTIME)
inline constexpr bool kSanitizerBuild = true;
#else
inline constexpr bool kSanitizerBuild = false;
#endif

// ThreadSanitizer alone: every memory access is checked, several times slower than the others.
#if defined(__SANITIZE_THREAD__)
inline constexpr bool kThreadSanitizerBuild = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
inline constexpr bool kThreadSanitizerBuild = true;
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif
#else
inline constexpr bool kThreadSanitizerBuild = false;
#endif

// AddressSanitizer alone: its quarantine holds freed memory, so a process's resident size grows.
#if defined(RDMACHAN_ADDRESS_SANITIZER_RUNTIME)
inline constexpr bool kAddressSanitizerBuild = true;
#else
inline constexpr bool kAddressSanitizerBuild = false;
#endif

}  // namespace rdmachan::test
