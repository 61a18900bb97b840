// The segments of an mlx5 send WQE and the helpers that write them, for send_queue.hpp: the
// per-opcode facts, the ctrl, remote-address, atomic and data segments, the DC address vector and
// the BlueFlame block copy. Byte layouts follow mlx5-facts.md §1; each store is checked against
// libmlx5's bytes by mlx5-golden-check. Header-only, usable as CUDA device code.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

// The 48-byte extended address vector of a DC work request: the base vector of the peer's
// address handle (mlx5dv_ah.av on hardware) with the DCT number and DC key filled in, as
// rdma-core's mlx5_send_wr_set_dc_addr does (mlx5-facts.md §1).
RDMACHAN_HOST_DEVICE inline void make_dc_address_vector(
    std::uint8_t (&address_vector)[kAddressVectorSize], const std::uint8_t* base_address_vector,
    std::uint32_t dctn, std::uint64_t dc_key) {
    std::memcpy(address_vector, base_address_vector, kAddressVectorSize);
    store_big64(address_vector + kAvDcKey, dc_key);
    const std::uint32_t dqp_dct = load_big32(address_vector + kAvDqpDct);
    store_big32(address_vector + kAvDqpDct, dqp_dct | kExtendedAddressVector | (dctn & 0xffffff));
}

namespace detail {

// Per-opcode facts in one byte, a compile-time constant in each case of SendQueue::write's
// switch: bits 4:0 the mlx5 opcode, bits 6:5 how many 16-byte header segments follow ctrl
// (1 = remote address, 2 = remote address + atomic), bit 7 whether ctrl.imm carries the
// request's immediate (or the rkey to invalidate).
inline constexpr std::uint32_t kTraitOpcodeMask = 0x1f;
inline constexpr std::uint32_t kTraitSegmentsShift = 5;
inline constexpr std::uint32_t kTraitImmediate = 1u << 7;

RDMACHAN_HOST_DEVICE constexpr std::uint32_t opcode_traits(SendOpcode opcode) {
    switch (opcode) {
        case SendOpcode::rdma_write:
            return kOpcodeRdmaWrite | 1u << kTraitSegmentsShift;
        case SendOpcode::rdma_write_with_immediate:
            return kOpcodeRdmaWriteImmediate | 1u << kTraitSegmentsShift | kTraitImmediate;
        case SendOpcode::send:
            return kOpcodeSend;
        case SendOpcode::send_with_immediate:
            return kOpcodeSendImmediate | kTraitImmediate;
        case SendOpcode::send_with_invalidate:
            return kOpcodeSendInvalidate | kTraitImmediate;
        case SendOpcode::rdma_read:
            return kOpcodeRdmaRead | 1u << kTraitSegmentsShift;
        case SendOpcode::atomic_compare_and_swap:
            return kOpcodeAtomicCompareAndSwap | 2u << kTraitSegmentsShift;
        case SendOpcode::atomic_fetch_and_add:
            return kOpcodeAtomicFetchAndAdd | 2u << kTraitSegmentsShift;
        case SendOpcode::local_invalidate:
        case SendOpcode::configure_memory_key:
            return 0;  // UMR WQEs are written by SendQueue::write_umr, not from these traits
    }
    return 0;
}

// The request flags that are ctrl.fm_ce_se bits, already where fm_ce_se is in the ctrl bytes
// 8-11 word.
static_assert(kSendSignaled == std::uint32_t{kCtrlCqUpdate} << 24 &&
                  kSendSolicited == std::uint32_t{kCtrlSolicited} << 24 &&
                  kSendFence == std::uint32_t{kCtrlFence} << 24 && (kSendInline & 0xff000000) == 0,
              "the encoder copies these request flags into ctrl bytes 8-11 unchanged");
inline constexpr std::uint32_t kFmCeSeFlags = kSendSignaled | kSendSolicited | kSendFence;

// ctrl: opmod (byte 0) stays 0, the WQE index (bytes 1-2) is the producer index's low 16
// bits, stored over the opcode word; `qpn_ds` is bytes 4-7 as stored; bytes 8-11 are
// `flags_word` (zero above bit 31) and 12-15 the immediate (or the rkey to invalidate), one
// 8-byte store for both.
RDMACHAN_ALWAYS_INLINE void store_control(std::uint8_t* wqe, std::uint32_t producer_index,
                                          std::uint32_t traits, std::uint32_t qpn_ds,
                                          std::uint64_t flags_word,
                                          const SendWorkRequest& request) {
    store_big32(wqe + kCtrlOpmodIndexOpcode, traits & kTraitOpcodeMask);
    store_big16(wqe + kCtrlOpmodIndexOpcode + 1, static_cast<std::uint16_t>(producer_index));
    std::memcpy(wqe + kCtrlQpnDs, &qpn_ds, sizeof qpn_ds);
    if ((traits & kTraitImmediate) != 0)
        flags_word |= static_cast<std::uint64_t>(host_to_big32(request.immediate)) << 32;
    std::memcpy(wqe + kCtrlSignature, &flags_word, sizeof flags_word);
}

// raddr BE64, rkey BE32 and the reserved word zero.
RDMACHAN_ALWAYS_INLINE void store_remote_address(std::uint8_t* segment,
                                                 const SendWorkRequest& request) {
    store_big64(segment, request.remote_addr);
    store_big32(segment + 8, request.rkey);
    store_big32(segment + 12, 0);
}

template <bool kCompareAndSwap>
RDMACHAN_ALWAYS_INLINE void store_atomic(std::uint8_t* segment, const SendWorkRequest& request) {
    if constexpr (kCompareAndSwap) {
        store_big64(segment, request.swap);
        store_big64(segment + 8, request.compare_add);
    } else {
        store_big64(segment, request.compare_add);  // the compare field is unused
    }
}

// An SGE's length (low half) and lkey (high half) in one 8-byte load: they are adjacent in
// ScatterGatherElement as byte_count and lkey are in the data segment.
RDMACHAN_ALWAYS_INLINE std::uint64_t load_length_lkey(const ScatterGatherElement& element) {
    static_assert(offsetof(ScatterGatherElement, lkey) ==
                  offsetof(ScatterGatherElement, length) + 4);
    std::uint64_t length_lkey;
    std::memcpy(
        &length_lkey,
        reinterpret_cast<const unsigned char*>(&element) + offsetof(ScatterGatherElement, length),
        sizeof length_lkey);
    return length_lkey;
}

// The halves swapped into big-endian order (rotate, then byte swap): one store for both.
RDMACHAN_ALWAYS_INLINE void store_data_segment(std::uint8_t* segment, std::uint64_t length_lkey,
                                               std::uint64_t addr) {
    store_big64(segment, length_lkey << 32 | length_lkey >> 32);
    store_big64(segment + 8, addr);
}

RDMACHAN_ALWAYS_INLINE std::uint32_t minimum(std::uint32_t a, std::uint32_t b) {
    return a < b ? a : b;
}

RDMACHAN_ALWAYS_INLINE std::uint8_t* next_segment(std::uint8_t* position, std::uint8_t* buffer,
                                                  std::uint8_t* ring_end) {
    return position == ring_end ? buffer : position;
}

// Eight ordered 64-bit stores, never memcpy: string moves may reorder or merge the writes
// into the write-combining buffer (rdma-core util/mmio.h, mmio_memcpy_x64).
RDMACHAN_ALWAYS_INLINE void copy_blueflame_block(std::uint8_t* destination,
                                                 const std::uint8_t* source) {
#if defined(__CUDACC__)
#pragma unroll
#else
#pragma GCC unroll 8
#endif
    for (std::uint32_t word = 0; word < kSendWqeBasicBlockSize; word += 8) {
        std::uint64_t value;
        std::memcpy(&value, source + word, sizeof value);
        mmio_write64(destination + word, value);
    }
}

}  // namespace detail

}  // namespace rdmachan::mlx5
