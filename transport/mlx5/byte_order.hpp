// mlx5 WQEs and CQEs are big-endian. These helpers load and store unaligned big-endian fields
// through memcpy, which compilers turn into a single move plus bswap on x86.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/mlx5/host_device.hpp"

namespace rdmachan::mlx5 {

RDMACHAN_ALWAYS_INLINE std::uint16_t byte_swap16(std::uint16_t value) {
    return static_cast<std::uint16_t>((value >> 8) | (value << 8));
}

RDMACHAN_ALWAYS_INLINE std::uint32_t byte_swap32(std::uint32_t value) {
#if defined(__CUDA_ARCH__)
    return __byte_perm(value, 0, 0x0123);
#else
    return __builtin_bswap32(value);
#endif
}

RDMACHAN_ALWAYS_INLINE std::uint64_t byte_swap64(std::uint64_t value) {
#if defined(__CUDA_ARCH__)
    return (static_cast<std::uint64_t>(byte_swap32(static_cast<std::uint32_t>(value))) << 32) |
           byte_swap32(static_cast<std::uint32_t>(value >> 32));
#else
    return __builtin_bswap64(value);
#endif
}

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the mlx5 data path is written for little-endian hosts");

RDMACHAN_ALWAYS_INLINE std::uint32_t host_to_big32(std::uint32_t value) { return byte_swap32(value); }
RDMACHAN_ALWAYS_INLINE std::uint32_t big_to_host32(std::uint32_t value) { return byte_swap32(value); }
RDMACHAN_ALWAYS_INLINE std::uint64_t host_to_big64(std::uint64_t value) { return byte_swap64(value); }
RDMACHAN_ALWAYS_INLINE std::uint64_t big_to_host64(std::uint64_t value) { return byte_swap64(value); }

RDMACHAN_ALWAYS_INLINE void store_big16(void* destination, std::uint16_t value) {
    value = byte_swap16(value);
    std::memcpy(destination, &value, sizeof value);
}
RDMACHAN_ALWAYS_INLINE void store_big32(void* destination, std::uint32_t value) {
    value = byte_swap32(value);
    std::memcpy(destination, &value, sizeof value);
}
RDMACHAN_ALWAYS_INLINE void store_big64(void* destination, std::uint64_t value) {
    value = byte_swap64(value);
    std::memcpy(destination, &value, sizeof value);
}
RDMACHAN_ALWAYS_INLINE std::uint16_t load_big16(const void* source) {
    std::uint16_t value;
    std::memcpy(&value, source, sizeof value);
    return byte_swap16(value);
}
RDMACHAN_ALWAYS_INLINE std::uint32_t load_big32(const void* source) {
    std::uint32_t value;
    std::memcpy(&value, source, sizeof value);
    return byte_swap32(value);
}
RDMACHAN_ALWAYS_INLINE std::uint64_t load_big64(const void* source) {
    std::uint64_t value;
    std::memcpy(&value, source, sizeof value);
    return byte_swap64(value);
}

}  // namespace rdmachan::mlx5
