// Counts heap allocations made by the calling thread: every global operator new (plain, array,
// aligned, nothrow) and every malloc, calloc, realloc and aligned allocation in the process —
// including the library's, which is a shared object — are replaced here and counted while an
// AllocationCounter is alive on the thread that makes them. Other threads (the software
// device's) are not counted. Include in exactly one file of a test executable: it defines the
// replacements. Under AddressSanitizer or ThreadSanitizer, whose runtimes own the allocator,
// nothing is replaced: the sanitizer's allocation hook counts instead.
#pragma once

#include "tests/sanitizer_build.hpp"

#if defined(RDMACHAN_SANITIZER_RUNTIME)
#define RDMACHAN_ALLOCATION_HOOK 1
// From the sanitizer runtime (sanitizer/allocator_interface.h, not installed with GCC here).
extern "C" int __sanitizer_install_malloc_and_free_hooks(void (*malloc_hook)(const volatile void*, __SIZE_TYPE__),
                                                         void (*free_hook)(const volatile void*));
#endif

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <new>

extern "C" {
void* __libc_malloc(std::size_t size);
void* __libc_calloc(std::size_t count, std::size_t size);
void* __libc_realloc(void* pointer, std::size_t size);
void* __libc_memalign(std::size_t alignment, std::size_t size);
void __libc_free(void* pointer);
}

namespace allocation_test {

inline thread_local bool counting = false;
inline thread_local std::uint64_t allocations = 0;

inline void note_allocation() {
    if (counting) ++allocations;
}

// Counts the calling thread's allocations between construction and count().
class AllocationCounter {
  public:
    AllocationCounter() {
        allocations = 0;
        counting = true;
    }
    ~AllocationCounter() { counting = false; }
    std::uint64_t count() const { return allocations; }
};

// The compiler may drop an allocation whose pointer goes nowhere; this makes it go somewhere.
inline void escape(void* pointer) {
    asm volatile("" : : "r"(pointer) : "memory");
}

}  // namespace allocation_test

#ifdef RDMACHAN_ALLOCATION_HOOK
namespace allocation_test {
inline void on_allocation(const volatile void*, std::size_t) { note_allocation(); }
inline void on_free(const volatile void*) {}
inline const int hook_installed = __sanitizer_install_malloc_and_free_hooks(on_allocation, on_free);
}  // namespace allocation_test
#else
extern "C" {
void* malloc(std::size_t size) {
    allocation_test::note_allocation();
    return __libc_malloc(size);
}
void* calloc(std::size_t count, std::size_t size) {
    allocation_test::note_allocation();
    return __libc_calloc(count, size);
}
void* realloc(void* pointer, std::size_t size) {
    allocation_test::note_allocation();
    return __libc_realloc(pointer, size);
}
void* aligned_alloc(std::size_t alignment, std::size_t size) {
    allocation_test::note_allocation();
    return __libc_memalign(alignment, size);
}
int posix_memalign(void** out, std::size_t alignment, std::size_t size) {
    allocation_test::note_allocation();
    *out = __libc_memalign(alignment, size);
    return *out != nullptr ? 0 : 12;  // ENOMEM
}
void free(void* pointer) {
    __libc_free(pointer);
}
}

// operator new takes its memory from the real malloc, so one allocation counts once.
void* operator new(std::size_t size) {
    allocation_test::note_allocation();
    if (void* pointer = __libc_malloc(size == 0 ? 1 : size)) return pointer;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
    return operator new(size);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    allocation_test::note_allocation();
    return __libc_malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
    return operator new(size, tag);
}
void* operator new(std::size_t size, std::align_val_t alignment) {
    allocation_test::note_allocation();
    if (void* pointer = __libc_memalign(static_cast<std::size_t>(alignment), size == 0 ? 1 : size)) return pointer;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size, std::align_val_t alignment) {
    return operator new(size, alignment);
}
// Out of line: inlined into a caller, GCC would see free() meet operator new and warn.
__attribute__((noinline)) void operator delete(void* pointer) noexcept {
    __libc_free(pointer);
}
__attribute__((noinline)) void operator delete[](void* pointer) noexcept {
    __libc_free(pointer);
}
__attribute__((noinline)) void operator delete(void* pointer, std::size_t) noexcept {
    __libc_free(pointer);
}
__attribute__((noinline)) void operator delete[](void* pointer, std::size_t) noexcept {
    __libc_free(pointer);
}
__attribute__((noinline)) void operator delete(void* pointer, std::align_val_t) noexcept {
    __libc_free(pointer);
}
__attribute__((noinline)) void operator delete[](void* pointer, std::align_val_t) noexcept {
    __libc_free(pointer);
}
__attribute__((noinline)) void operator delete(void* pointer, std::size_t, std::align_val_t) noexcept {
    __libc_free(pointer);
}
__attribute__((noinline)) void operator delete[](void* pointer, std::size_t, std::align_val_t) noexcept {
    __libc_free(pointer);
}
#endif
