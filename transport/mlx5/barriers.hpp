// Memory ordering between the CPU and the NIC (mlx5-facts.md §4, §5; rdma-core
// util/udma_barrier.h). The doorbell record and the CQE owner byte are also accessed with
// release/acquire atomics: on x86 that costs nothing extra, and it lets ThreadSanitizer see
// the hand-off when the "NIC" is the software device's thread in the same process.
#pragma once

#include <cstdint>

#include "transport/mlx5/host_device.hpp"

namespace rdmachan::mlx5 {

// udma_to_device_barrier: WQE stores become visible before the doorbell record store.
RDMACHAN_ALWAYS_INLINE void to_device_barrier() {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#elif defined(__x86_64__) || defined(__i386__)
    asm volatile("" ::: "memory");
#elif defined(__aarch64__)
    asm volatile("dmb oshst" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// mmio_flush_writes / mmio_wc_start: a doorbell record (send or CQ arm) is visible before the
// BlueFlame or doorbell register write, and write-combined register stores are flushed after it.
RDMACHAN_ALWAYS_INLINE void flush_writes() {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#elif defined(__x86_64__) || defined(__i386__)
    asm volatile("sfence" ::: "memory");
#elif defined(__aarch64__)
    asm volatile("dsb st" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

// udma_from_device_barrier: after the owner check, before reading the CQE body.
RDMACHAN_ALWAYS_INLINE void from_device_barrier() {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
#elif defined(__x86_64__) || defined(__i386__)
    asm volatile("lfence" ::: "memory");
#elif defined(__aarch64__)
    asm volatile("dmb oshld" ::: "memory");
#else
    __atomic_thread_fence(__ATOMIC_SEQ_CST);
#endif
}

RDMACHAN_ALWAYS_INLINE void store_release32(std::uint32_t* destination, std::uint32_t value) {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
    *reinterpret_cast<volatile std::uint32_t*>(destination) = value;
#else
    __atomic_store_n(destination, value, __ATOMIC_RELEASE);
#endif
}

RDMACHAN_ALWAYS_INLINE std::uint32_t load_acquire32(const std::uint32_t* source) {
#if defined(__CUDA_ARCH__)
    std::uint32_t value = *reinterpret_cast<const volatile std::uint32_t*>(source);
    __threadfence_system();
    return value;
#else
    return __atomic_load_n(source, __ATOMIC_ACQUIRE);
#endif
}

RDMACHAN_ALWAYS_INLINE void store_release8(std::uint8_t* destination, std::uint8_t value) {
#if defined(__CUDA_ARCH__)
    __threadfence_system();
    *reinterpret_cast<volatile std::uint8_t*>(destination) = value;
#else
    __atomic_store_n(destination, value, __ATOMIC_RELEASE);
#endif
}

RDMACHAN_ALWAYS_INLINE std::uint8_t load_acquire8(const std::uint8_t* source) {
#if defined(__CUDA_ARCH__)
    std::uint8_t value = *reinterpret_cast<const volatile std::uint8_t*>(source);
    __threadfence_system();
    return value;
#else
    return __atomic_load_n(source, __ATOMIC_ACQUIRE);
#endif
}

// One 64-bit store to a device register. Ordered, never merged or split by the compiler.
RDMACHAN_ALWAYS_INLINE void mmio_write64(void* register_address, std::uint64_t value) {
    *reinterpret_cast<volatile std::uint64_t*>(register_address) = value;
}

}  // namespace rdmachan::mlx5
