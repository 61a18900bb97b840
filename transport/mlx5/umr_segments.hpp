// The segments of a UMR WQE (mlx5 opcode 0x25) for send_queue.hpp: LOCAL_INV, and the
// configuration of an indirect memory key with a list or an interleaved layout. The values and
// the sizes are the ones libmlx5 writes (rdma-core 44 providers/mlx5/qp.c; every fact with its
// function in transport/mlx5/README.md "UMR WQEs"). Header-only, usable as CUDA device code.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/work_request.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

// The most entries a configure_memory_key WQE takes on a queue with this max_inline_data:
// the translation entries travel inline, so libmlx5 (mlx5_send_wr_set_mkey_layout) bounds
// them by max_inline_data plus the 4-byte inline header, in 16-byte entries, less one for the
// repeat block header of an interleaved layout. The key's own max_entries bounds them too.
RDMACHAN_HOST_DEVICE constexpr std::uint32_t umr_max_entries(bool interleaved,
                                                             std::uint32_t max_inline_data) {
    const std::uint32_t slots = (max_inline_data + kInlineHeaderSize) / kUmrEntrySize;
    if (!interleaved) return slots;
    return slots == 0 ? 0 : slots - 1;
}

// The translation bytes a layout takes in the WQE: its entries (and the repeat block header)
// padded to 64 bytes with zero entries, as umr_sg_list_create / umr_strided_seg_create do.
RDMACHAN_HOST_DEVICE constexpr std::uint32_t umr_translation_bytes(bool interleaved,
                                                                   std::uint32_t num_entries) {
    const std::uint32_t bytes = (num_entries + (interleaved ? 1 : 0)) * kUmrEntrySize;
    return (bytes + kSendWqeBasicBlockSize - 1) / kSendWqeBasicBlockSize * kSendWqeBasicBlockSize;
}

namespace detail {

// Checks a layout against what the key and the WQE hold; on success sets the translation
// bytes and the key's length (the sum of the list's lengths, or of the interleaved byte
// counts times repeat_count). An interleaved entry's byte count and stride (byte count plus
// skip) are 16-bit fields: libmlx5 truncates larger values silently, we refuse them.
RDMACHAN_HOST_DEVICE inline PostResult check_layout(const MemoryKeyLayout& layout,
                                                    std::uint32_t max_inline_data,
                                                    std::uint32_t* translation_bytes,
                                                    std::uint64_t* length) {
    const bool interleaved = layout.interleaved != nullptr;
    if (!interleaved && layout.list == nullptr && layout.num_entries != 0)
        return PostResult::invalid_request;
    const std::uint32_t wqe_limit = umr_max_entries(interleaved, max_inline_data);
    const std::uint32_t limit = wqe_limit < layout.max_entries ? wqe_limit : layout.max_entries;
    if (layout.num_entries > limit) return PostResult::too_many_entries;
    std::uint64_t total = 0;
    for (std::uint32_t i = 0; i < layout.num_entries; ++i) {
        if (interleaved) {
            const InterleavedEntry& entry = layout.interleaved[i];
            if (entry.bytes_count > 0xffff ||
                std::uint64_t{entry.bytes_count} + entry.bytes_skip > 0xffff)
                return PostResult::invalid_request;
            total += entry.bytes_count;
        } else {
            total += layout.list[i].length;
        }
    }
    *length = interleaved ? total * layout.repeat_count : total;
    *translation_bytes = umr_translation_bytes(interleaved, layout.num_entries);
    return PostResult::ok;
}

// LOCAL_INV as ibv_post_send writes it (set_bind_wr with an empty type-2 bind): UMR control
// flags TRNSLATION_OFFSET | INLINE | CHECK_QPN, mask FREE | MKEY | QPN, no translation
// entries; mkey context "free" with qpn_mkey 0xffffff00. libmlx5 leaves the rest of the mkey
// context as it was in the ring; we zero it so that no stale byte reaches the NIC.
RDMACHAN_HOST_DEVICE inline void store_local_invalidate(std::uint8_t* umr_control,
                                                        std::uint8_t* mkey_context) {
    std::memset(umr_control, 0, kUmrControlSegmentSize);
    umr_control[kUmrFlags] = kUmrFlagTranslationOffset | kUmrFlagInline | kUmrFlagCheckQpn;
    store_big64(umr_control + kUmrMkeyMask, kUmrMaskFree | kUmrMaskMkey | kUmrMaskQpn);
    std::memset(mkey_context, 0, kMkeyContextSegmentSize);
    mkey_context[kMkeyFree] = kMkeyFreeFlag;
    store_big32(mkey_context + kMkeyQpnMkey, 0xffffff00u);
}

// A key configuration as mlx5dv_wr_mr_list / mlx5dv_wr_mr_interleaved write it
// (mlx5_send_wr_mkey_configure, then the access-flags and layout setters): UMR control flags
// INLINE, klm_octowords the padded translation size in 16-byte units, mask FREE | MKEY | all
// four access bits | LEN; mkey context zeroed, then access flags, qpn_mkey 0xffffff00 with the
// key's tag byte, and the length. start_addr stays 0: the key is zero-based.
RDMACHAN_HOST_DEVICE inline void store_configure(std::uint8_t* umr_control,
                                                 std::uint8_t* mkey_context,
                                                 const MemoryKeyLayout& layout,
                                                 std::uint32_t translation_bytes,
                                                 std::uint64_t length) {
    std::memset(umr_control, 0, kUmrControlSegmentSize);
    umr_control[kUmrFlags] = kUmrFlagInline;
    store_big16(umr_control + kUmrKlmOctowords,
                static_cast<std::uint16_t>(translation_bytes / kSegmentUnit));
    store_big64(umr_control + kUmrMkeyMask,
                kUmrMaskFree | kUmrMaskMkey | kUmrMaskAccessLocalWrite | kUmrMaskAccessRemoteRead |
                    kUmrMaskAccessRemoteWrite | kUmrMaskAccessAtomic | kUmrMaskLength);
    std::memset(mkey_context, 0, kMkeyContextSegmentSize);
    mkey_context[kMkeyAccessFlags] = layout.access;
    store_big32(mkey_context + kMkeyQpnMkey, 0xffffff00u | (layout.mkey & 0xff));
    store_big64(mkey_context + kMkeyLength, length);
}

// The translation entries from `position`, each 16 bytes, continuing at `buffer` when one
// reaches `ring_end`; then zero entries up to `translation_bytes`. List: data segments
// (byte_count, lkey, addr). Interleaved: the repeat block header (the pattern's byte count,
// op 0x400, repeat_count, num_ent), then per entry stride, byte_count, memkey, va.
RDMACHAN_HOST_DEVICE inline void store_translation(std::uint8_t* position, std::uint8_t* buffer,
                                                   std::uint8_t* ring_end,
                                                   const MemoryKeyLayout& layout,
                                                   std::uint32_t translation_bytes) {
    std::uint32_t written = 0;
    auto advance = [&] {
        position += kUmrEntrySize;
        if (position == ring_end) position = buffer;
        written += kUmrEntrySize;
    };
    if (layout.interleaved != nullptr) {
        std::uint32_t pattern_bytes = 0;
        for (std::uint32_t i = 0; i < layout.num_entries; ++i)
            pattern_bytes += layout.interleaved[i].bytes_count;
        store_big32(position, pattern_bytes);
        store_big32(position + 4, kRepeatBlockOp);
        store_big32(position + 8, layout.repeat_count);
        store_big16(position + 12, 0);
        store_big16(position + 14, static_cast<std::uint16_t>(layout.num_entries));
        advance();
        for (std::uint32_t i = 0; i < layout.num_entries; ++i) {
            const InterleavedEntry& entry = layout.interleaved[i];
            store_big16(position, static_cast<std::uint16_t>(entry.bytes_count + entry.bytes_skip));
            store_big16(position + 2, static_cast<std::uint16_t>(entry.bytes_count));
            store_big32(position + 4, entry.lkey);
            store_big64(position + 8, entry.addr);
            advance();
        }
    } else {
        for (std::uint32_t i = 0; i < layout.num_entries; ++i) {
            const ScatterGatherElement& element = layout.list[i];
            store_big32(position, element.length);
            store_big32(position + 4, element.lkey);
            store_big64(position + 8, element.addr);
            advance();
        }
    }
    while (written < translation_bytes) {
        std::memset(position, 0, kUmrEntrySize);
        advance();
    }
}

}  // namespace detail

}  // namespace rdmachan::mlx5
