// Scatter-to-CQE: where the data a CQE carries goes. A QP created with scatter-to-CQE (mlx5dv's
// default) gets small payloads in the CQE itself instead of in memory: a received send's bytes
// (responder) and a small RDMA read's or an atomic's response (requester, RC only). The CQE's
// format bits (op_own bits 3:2) say where they are: 1, the first 32 bytes of the mlx5_cqe64; 2,
// the 64 bytes before it, which only a 128-byte CQE has (cq.c handle_responder; the requester
// side as rdma-core 45184d2c8 reads it, fixing v44's byte offset for 128-byte CQEs). Software
// copies them to the buffers the consumed WQE's data segments name, read back from the ring, as
// libmlx5 does (qp.c mlx5_copy_to_recv_wqe, mlx5_copy_to_send_wqe; srq.c mlx5_copy_to_recv_srq).
// Header-only, no exceptions, allocation or locks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

// Where a CQE of `format` (1 or 2) keeps its data; `cqe64` is the mlx5_cqe64. nullptr for a
// 64-byte data format in a 64-byte CQE, which has no room for it.
RDMACHAN_HOST_DEVICE inline const std::uint8_t* inline_scatter_data(const std::uint8_t* cqe64,
                                                                    std::uint32_t format,
                                                                    std::uint32_t cqe_size) {
    if (format == kCqeFormatInlineScatter32) return cqe64;
    return cqe_size >= 2 * kCqeSize64 ? cqe64 - kCqeSize64 : nullptr;
}

// Copies up to `size` bytes from `data` into the buffers of `count` data segments, each taking
// at most its byte count, and advances both. An invalid-lkey segment ends a receive WQE's list
// shorter than the WQE: the bytes past it are no buffer of this WQE's (libmlx5 reads on into
// whatever an earlier post left there; a NIC never sends more than the WQE holds, it reports a
// length error instead).
RDMACHAN_HOST_DEVICE inline void scatter_to_segments(const std::uint8_t* segment,
                                                     std::uint32_t count, const std::uint8_t*& data,
                                                     std::uint32_t& size) {
    for (std::uint32_t i = 0; i < count && size != 0; ++i, segment += kDataSegmentSize) {
        if (load_big32(segment + 4) == kInvalidLkey) break;
        const std::uint32_t length = load_big32(segment);
        const std::uint32_t copy = size < length ? size : length;
        std::memcpy(reinterpret_cast<void*>(static_cast<std::uintptr_t>(load_big64(segment + 8))),
                    data, copy);
        data += copy;
        size -= copy;
    }
}

// A receive WQE's scatter list (`segments`, `count` of them) gets `size` bytes from `data`;
// false when they do not fit (a local length error, as libmlx5 reports it).
RDMACHAN_HOST_DEVICE inline bool scatter_to_receive(const std::uint8_t* segments,
                                                    std::uint32_t count, const std::uint8_t* data,
                                                    std::uint32_t size) {
    scatter_to_segments(segments, count, data, size);
    return size == 0;
}

// What an inline requester CQE did with its data.
enum class SendScatterResult : std::uint8_t {
    placed,
    too_long,      // more bytes than the WQE's data segments hold: local length error
    wrong_opcode,  // not a read or an atomic: libmlx5 reports a remote invalid request
};

// A read's or an atomic's response data goes to the data segments of the send WQE that starts at
// WQEBB `first_wqebb` of the ring (`wqebb_count` WQEBBs of 64 bytes at `ring`), RC layout: after
// the ctrl and remote-address segments, and the atomic segment for an atomic. The segments are
// as many as the ctrl's ds says and continue at the ring start past its end.
RDMACHAN_HOST_DEVICE inline SendScatterResult scatter_to_send(const std::uint8_t* ring,
                                                              std::uint32_t wqebb_count,
                                                              std::uint32_t first_wqebb,
                                                              const std::uint8_t* data,
                                                              std::uint32_t size) {
    const std::uint8_t* const ctrl =
        ring + static_cast<std::size_t>(first_wqebb & (wqebb_count - 1)) * kSendWqeBasicBlockSize;
    const std::uint8_t* const end =
        ring + static_cast<std::size_t>(wqebb_count) * kSendWqeBasicBlockSize;
    std::uint32_t offset = kControlSegmentSize + kRemoteAddressSegmentSize;
    switch (ctrl[3]) {
        case kOpcodeRdmaRead:
            break;
        case kOpcodeAtomicCompareAndSwap:
        case kOpcodeAtomicFetchAndAdd:
            offset += kAtomicSegmentSize;
            break;
        default:
            return SendScatterResult::wrong_opcode;
    }
    const std::uint32_t ds = load_big32(ctrl + 4) & 0x3f;
    std::uint32_t count = ds > offset / kSegmentUnit ? ds - offset / kSegmentUnit : 0;
    const std::uint8_t* segments = ctrl + offset;
    const std::uint32_t before_end =
        static_cast<std::uint32_t>((end - segments) / kDataSegmentSize);
    if (count > before_end) {
        scatter_to_segments(segments, before_end, data, size);
        count -= before_end;
        segments = ring;
    }
    scatter_to_segments(segments, count, data, size);
    return size == 0 ? SendScatterResult::placed : SendScatterResult::too_long;
}

}  // namespace rdmachan::mlx5
