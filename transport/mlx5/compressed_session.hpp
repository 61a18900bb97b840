// Compressed CQE sessions, in the layout a CQ created through mlx5dv with
// MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE gets (the enhanced layout a DEVX-created CQ may ask
// for instead, with per-entry validity counts, is not decoded here). rdma-core's libmlx5 creates
// such CQs but never decodes them: its poll reads format 3 as inline scatter. The facts come
// from the Linux driver (drivers/net/ethernet/mellanox/mlx5/core/en_rx.c:
// mlx5e_decompress_cqes_start, _cont, mlx5e_cqes_update_owner), DPDK's mlx5 PMD (mlx5_rx.c,
// its zip state) and, for a requester session, UCX (ib_mlx5.c,
// uct_ib_mlx5_iface_cqe_unzip_fill_unique):
// - The title is a CQE in format 3 (op_own bits 3:2) whose owner bit is software's. Its byte_cnt
//   is the number N of CQEs the session stands for; its other fields are what they share.
// - The session occupies N consecutive ring entries from the title's, one per CQE: the consumer
//   index advances by N.
// - Mini CQEs are 8 bytes, eight to an entry, filling the whole mlx5_cqe64 (its op_own byte
//   too): mini CQEs 0-7 are in the entry after the title, mini CQEs 8k to 8k+7 (k >= 1) in the
//   session's entry 8k. The other entries hold nothing the NIC wrote on this pass.
// - A mini CQE: bytes 0-3 as the CQ's format says (the RX hash result; the checksum and stride
//   index; for a requester title, the WQE counter BE16 and the WQE opcode), bytes 4-7 byte_cnt
//   BE32. None of bytes 0-3 but the requester's reaches an ibv_wc.
// - A responder CQE's wqe_counter is the title's plus its position in the session (each one
//   took the receive queue's next WQE); a requester CQE's comes from its mini CQE.
// - Only the title's owner bit says the session is there (the NIC writes it last). The entries
//   after it keep whatever op_own they held, which may read as software's on a later pass, so
//   software rewrites each entry it consumes (en_rx.c writes the pass's owner bit; here the
//   invalid opcode, as DPDK does and rdma-core's initial fill).
// Header-only, no exceptions, allocation or locks.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

inline constexpr std::uint32_t kMiniCqeSize = 8;
inline constexpr std::uint32_t kMiniCqesPerEntry = kCqeSize64 / kMiniCqeSize;
inline constexpr std::uint32_t kMiniCqeByteCount = 4;
inline constexpr std::uint32_t kMiniCqeWqeCounter = 0;  // requester: BE16
inline constexpr std::uint32_t kMiniCqeWqeOpcode = 2;   // requester
inline constexpr std::uint8_t kCqeFormatMask = 0x0c;    // op_own bits 3:2

// A session being consumed: the title, the array of mini CQEs in use (both copied out of the
// ring, whose entries are rewritten as they are consumed), and how far the consumer got.
struct CompressedSession {
    std::uint8_t title[kCqeSize64] = {};
    std::uint8_t minis[kCqeSize64] = {};
    std::uint32_t size = 0;          // N, the CQEs the session stands for
    std::uint32_t position = 0;      // the next CQE's, 0 to N - 1
    std::uint32_t loaded_array = 0;  // which array `minis` holds (mini CQEs 8k to 8k + 7)

    RDMACHAN_HOST_DEVICE bool active() const { return position < size; }

    // The title's CQE count, if it can start a session on a ring of `cqe_count` entries: at least
    // two (the first array is in the title's next entry, inside the session) and no more than
    // the ring holds. 0 if not.
    RDMACHAN_HOST_DEVICE static std::uint32_t size_of(const std::uint8_t* title,
                                                      std::uint32_t cqe_count) {
        const std::uint32_t size = load_big32(title + kCqeByteCount);
        return size >= 2 && size <= cqe_count ? size : 0;
    }

    // The CQE at `position` as the NIC would have written it uncompressed, into `cqe`: the title
    // with the mini CQE's byte count and the WQE it completed, in format 0.
    RDMACHAN_HOST_DEVICE void expand(std::uint8_t* cqe) const {
        std::memcpy(cqe, title, kCqeSize64);
        const std::uint8_t* const mini = minis + (position % kMiniCqesPerEntry) * kMiniCqeSize;
        std::memcpy(cqe + kCqeByteCount, mini + kMiniCqeByteCount, 4);
        const std::uint8_t op_own = title[kCqeOpOwn];
        if ((op_own >> 4) == kCqeRequester) {
            std::memcpy(cqe + kCqeWqeCounter, mini + kMiniCqeWqeCounter, 2);
            cqe[kCqeSopDropQpn] = mini[kMiniCqeWqeOpcode];
        } else {
            store_big16(cqe + kCqeWqeCounter,
                        static_cast<std::uint16_t>(load_big16(title + kCqeWqeCounter) + position));
        }
        cqe[kCqeOpOwn] = static_cast<std::uint8_t>(op_own & 0xf0);
    }
};

}  // namespace rdmachan::mlx5
