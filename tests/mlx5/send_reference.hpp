// Test helpers shared by the send-queue tests: a ring in plain memory with guard bytes and
// poison, and a reference WQE built from rdma-core's own mlx5dv.h helpers (mlx5dv_set_ctrl_seg,
// mlx5dv_set_data_seg) and segment structs, which share no code with the SendQueue encoder.
#pragma once

#include <infiniband/mlx5dv.h>

#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "transport/mlx5/send_queue.hpp"

namespace send_test {

namespace mlx5 = rdmachan::mlx5;

inline constexpr std::uint8_t kRingPoison = 0xa5;
inline constexpr std::uint8_t kGuard = 0xee;
inline constexpr std::uint8_t kRegisterPoison = 0x5a;
inline constexpr std::size_t kGuardBytes = 128;
inline constexpr std::uint32_t kQpn = 0xabcde;

struct Ring {
    Ring(std::uint32_t wqe_count, std::uint32_t start, const mlx5::SendQueueConfig& config,
         std::uint32_t blueflame_size = 256)
        : memory(kGuardBytes * 2 + wqe_count * 64, kGuard),
          registers(1024, kRegisterPoison),
          wr_ids(wqe_count, 0),
          wqe_ends(wqe_count, 0) {
        std::memset(memory.data() + kGuardBytes, kRingPoison, wqe_count * 64);
        ring.buffer = memory.data() + kGuardBytes;
        ring.wqe_count = wqe_count;
        ring.qpn = kQpn;
        ring.doorbell_record = doorbell_record;
        ring.blueflame_register = registers.data();
        ring.blueflame_size = blueflame_size;
        queue = mlx5::SendQueue(ring, {wr_ids.data(), wqe_ends.data(), start, start}, config);
    }
    std::size_t ring_bytes() const { return ring.wqe_count * 64; }
    // The ring bytes from WQEBB `index` on, in ring order (wrapping), `count` of them.
    std::vector<std::uint8_t> linear(std::uint32_t index, std::size_t count) const {
        std::vector<std::uint8_t> out(count);
        for (std::size_t i = 0; i < count; ++i)
            out[i] = ring.buffer[((index & (ring.wqe_count - 1)) * 64 + i) % ring_bytes()];
        return out;
    }
    bool guards_intact() const {
        for (std::size_t i = 0; i < kGuardBytes; ++i) {
            if (memory[i] != kGuard || memory[memory.size() - 1 - i] != kGuard) return false;
        }
        return true;
    }

    std::vector<std::uint8_t> memory;
    std::vector<std::uint8_t> registers;
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    std::uint32_t doorbell_record[2] = {0x11111111, 0x22222222};
    mlx5::SendQueueRing ring;
    mlx5::SendQueue queue;
};

// A WQE as libmlx5 lays it out, built with mlx5dv.h; `mask` marks the bytes that are defined
// (inline padding is not written by either encoder).
struct Expected {
    std::vector<std::uint8_t> bytes;
    std::vector<bool> mask;
    std::uint32_t ds = 0;
};

template <typename Segment>
Segment* append(Expected& expected) {
    const std::size_t offset = expected.bytes.size();
    expected.bytes.resize(offset + sizeof(Segment), 0);
    expected.mask.resize(offset + sizeof(Segment), true);
    return reinterpret_cast<Segment*>(expected.bytes.data() + offset);
}

inline Expected reference(const mlx5::SendWorkRequest& request, std::uint32_t producer_index,
                          bool signal_all, const std::uint8_t* address_vector,
                          std::uint32_t qpn = kQpn) {
    Expected expected;
    // Room for the largest WQE up front: besides sparing reallocations, this keeps GCC 12 at -O3
    // from warning (-Warray-bounds, a false positive) about the growth of an empty vector.
    constexpr std::size_t largest_wqe = 1024;
    expected.bytes.reserve(largest_wqe);
    expected.mask.reserve(largest_wqe);
    append<mlx5_wqe_ctrl_seg>(expected);
    if (address_vector != nullptr)
        std::memcpy(append<mlx5_wqe_av>(expected), address_vector, sizeof(mlx5_wqe_av));
    std::uint8_t opcode = 0;
    std::uint32_t immediate = 0;
    bool remote = false;
    switch (request.opcode) {
        case mlx5::SendOpcode::rdma_write:
            opcode = MLX5_OPCODE_RDMA_WRITE;
            remote = true;
            break;
        case mlx5::SendOpcode::rdma_write_with_immediate:
            opcode = MLX5_OPCODE_RDMA_WRITE_IMM;
            remote = true;
            immediate = htobe32(request.immediate);
            break;
        case mlx5::SendOpcode::send:
            opcode = MLX5_OPCODE_SEND;
            break;
        case mlx5::SendOpcode::send_with_immediate:
            opcode = MLX5_OPCODE_SEND_IMM;
            immediate = htobe32(request.immediate);
            break;
        case mlx5::SendOpcode::send_with_invalidate:
            opcode = MLX5_OPCODE_SEND_INVAL;
            immediate = htobe32(request.immediate);
            break;
        case mlx5::SendOpcode::rdma_read:
            opcode = MLX5_OPCODE_RDMA_READ;
            remote = true;
            break;
        case mlx5::SendOpcode::atomic_compare_and_swap:
            opcode = MLX5_OPCODE_ATOMIC_CS;
            remote = true;
            break;
        case mlx5::SendOpcode::atomic_fetch_and_add:
            opcode = MLX5_OPCODE_ATOMIC_FA;
            remote = true;
            break;
        case mlx5::SendOpcode::local_invalidate:
        case mlx5::SendOpcode::configure_memory_key:
            // UMR WQEs have their own hand-derived checks (umr_test.cpp); the random
            // requests this reference serves never carry them.
            opcode = MLX5_OPCODE_UMR;
            break;
    }
    if (remote) {
        mlx5_wqe_raddr_seg* raddr = append<mlx5_wqe_raddr_seg>(expected);
        raddr->raddr = htobe64(request.remote_addr);
        raddr->rkey = htobe32(request.rkey);
    }
    if (request.opcode == mlx5::SendOpcode::atomic_compare_and_swap) {
        mlx5_wqe_atomic_seg* atomic = append<mlx5_wqe_atomic_seg>(expected);
        atomic->swap_add = htobe64(request.swap);
        atomic->compare = htobe64(request.compare_add);
    } else if (request.opcode == mlx5::SendOpcode::atomic_fetch_and_add) {
        const std::size_t offset = expected.bytes.size();
        append<mlx5_wqe_atomic_seg>(expected)->swap_add = htobe64(request.compare_add);
        for (std::size_t i = 8; i < 16; ++i) expected.mask[offset + i] = false;  // compare: unused
    }
    if ((request.flags & mlx5::kSendInline) != 0) {
        std::uint32_t total = 0;
        for (std::uint32_t i = 0; i < request.num_sge; ++i) total += request.sg_list[i].length;
        if (total != 0) {
            const std::size_t offset = expected.bytes.size();
            const std::uint32_t header = htobe32(total | MLX5_INLINE_SEG);
            expected.bytes.resize(offset + 4);
            std::memcpy(expected.bytes.data() + offset, &header, 4);
            for (std::uint32_t i = 0; i < request.num_sge; ++i) {
                const auto* data = reinterpret_cast<const std::uint8_t*>(request.sg_list[i].addr);
                expected.bytes.insert(expected.bytes.end(), data, data + request.sg_list[i].length);
            }
            expected.mask.resize(expected.bytes.size(), true);
            const std::size_t padded = (expected.bytes.size() + 15) / 16 * 16;
            expected.bytes.resize(padded, 0);
            expected.mask.resize(padded, false);
        }
    } else {
        for (std::uint32_t i = 0; i < request.num_sge; ++i) {
            const mlx5::ScatterGatherElement& element = request.sg_list[i];
            if (element.length == 0) continue;
            mlx5dv_set_data_seg(append<mlx5_wqe_data_seg>(expected), element.length, element.lkey,
                                element.addr);
        }
    }
    expected.ds = static_cast<std::uint32_t>(expected.bytes.size() / 16);
    std::uint8_t fm_ce_se = 0;
    if ((request.flags & mlx5::kSendSignaled) != 0 || signal_all)
        fm_ce_se |= MLX5_WQE_CTRL_CQ_UPDATE;
    if ((request.flags & mlx5::kSendSolicited) != 0) fm_ce_se |= MLX5_WQE_CTRL_SOLICITED;
    if ((request.flags & mlx5::kSendFence) != 0) fm_ce_se |= MLX5_WQE_CTRL_FENCE;
    auto* ctrl = reinterpret_cast<mlx5_wqe_ctrl_seg*>(expected.bytes.data());
    mlx5dv_set_ctrl_seg(ctrl, static_cast<std::uint16_t>(producer_index), opcode, 0, qpn, fm_ce_se,
                        static_cast<std::uint8_t>(expected.ds), 0, immediate);
    ctrl->dci_stream_channel_id = htobe16(request.dci_stream_id);
    return expected;
}

// One shape of request: a name for the failure message and the request itself.
struct Shape {
    std::string name;
    mlx5::SendWorkRequest request;
};

// `inline_singles` provides one element per inline length below; it must not be resized later.
inline std::vector<Shape> shapes(const mlx5::ScatterGatherElement* elements,
                                 const mlx5::ScatterGatherElement* inline_elements,
                                 std::vector<mlx5::ScatterGatherElement>& inline_singles,
                                 const std::uint8_t* payload) {
    std::vector<Shape> out;
    auto make = [&](const std::string& name, mlx5::SendOpcode opcode, std::uint32_t flags,
                    const mlx5::ScatterGatherElement* list, std::uint32_t count) {
        mlx5::SendWorkRequest request;
        request.wr_id = 0x1000 + out.size();
        request.opcode = opcode;
        request.flags = flags;
        request.sg_list = list;
        request.num_sge = count;
        request.remote_addr = 0x0102030405060708ull + out.size();
        request.rkey = 0x00c0ffee;
        request.immediate = 0xdeadbe00 + static_cast<std::uint32_t>(out.size());
        request.compare_add = 0x1111222233334444ull;
        request.swap = 0x5555666677778888ull;
        out.push_back({name, request});
    };
    using Op = mlx5::SendOpcode;
    for (std::uint32_t count = 0; count <= 4; ++count) {
        make("write " + std::to_string(count) + " sge", Op::rdma_write, mlx5::kSendSignaled,
             elements, count);
        make("send " + std::to_string(count) + " sge", Op::send, 0, elements, count);
    }
    make("write, zero-length sge in the middle", Op::rdma_write, mlx5::kSendSignaled, elements + 4,
         3);
    make("write with immediate", Op::rdma_write_with_immediate, mlx5::kSendSolicited, elements, 2);
    make("send with immediate", Op::send_with_immediate, mlx5::kSendFence | mlx5::kSendSignaled,
         elements, 3);
    make("send with invalidate", Op::send_with_invalidate, 0, elements, 1);
    make("read", Op::rdma_read, mlx5::kSendSignaled, elements, 4);
    make("compare and swap", Op::atomic_compare_and_swap, mlx5::kSendSignaled, elements, 1);
    make("fetch and add", Op::atomic_fetch_and_add, mlx5::kSendSignaled, elements, 1);
    // Inline lengths that end on every byte of a segment and cross WQEBBs.
    const std::uint32_t lengths[] = {1, 11, 12, 13, 28, 44, 45, 60, 61, 100, 123, 187, 200};
    inline_singles.assign(std::size(lengths), {});
    for (std::size_t i = 0; i < std::size(lengths); ++i) {
        inline_singles[i] = {reinterpret_cast<std::uint64_t>(payload + 7), lengths[i], 0};
        make("inline write " + std::to_string(lengths[i]), Op::rdma_write,
             mlx5::kSendInline | mlx5::kSendSignaled, &inline_singles[i], 1);
    }
    make("inline send, three pieces", Op::send_with_immediate, mlx5::kSendInline,
         inline_elements + 1, 3);
    make("inline send, empty", Op::send, mlx5::kSendInline, inline_elements + 4, 1);
    return out;
}

}  // namespace send_test
