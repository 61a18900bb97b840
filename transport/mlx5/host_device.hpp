// The mlx5 data-path core is header-only and free of exceptions, allocation and STL
// containers so that the same code can post and poll from a CUDA kernel (as RDMaxcel does).
#pragma once

#if defined(__CUDACC__)
#define RDMACHAN_HOST_DEVICE __host__ __device__
#else
#define RDMACHAN_HOST_DEVICE
#endif

#define RDMACHAN_ALWAYS_INLINE RDMACHAN_HOST_DEVICE inline __attribute__((always_inline))

#if defined(__GNUC__)
#define RDMACHAN_LIKELY(x) __builtin_expect(!!(x), 1)
#define RDMACHAN_UNLIKELY(x) __builtin_expect(!!(x), 0)
#else
#define RDMACHAN_LIKELY(x) (x)
#define RDMACHAN_UNLIKELY(x) (x)
#endif

// Rare paths stay out of line so that the hot loop around them keeps its registers.
#if defined(__CUDACC__)
#define RDMACHAN_COLD RDMACHAN_HOST_DEVICE __noinline__
#else
#define RDMACHAN_COLD RDMACHAN_HOST_DEVICE __attribute__((noinline, cold))
#endif

// Out of line but not cold: keeps a caller's fast exit free of the callee's register saves.
#if defined(__CUDACC__)
#define RDMACHAN_NOINLINE RDMACHAN_HOST_DEVICE __noinline__
#else
#define RDMACHAN_NOINLINE RDMACHAN_HOST_DEVICE __attribute__((noinline))
#endif
