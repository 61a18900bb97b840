// A send queue and a completion queue over rings in plain memory, for the instruction-count
// benchmark and the allocation test: RC RDMA writes with one SGE and a 256-byte BlueFlame
// buffer, and requester CQEs written the way a ConnectX writes them (body first, then op_own
// with the pass's owner bit), so the poller decodes real entries.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/send_queue.hpp"

namespace data_path_test {

namespace mlx5 = rdmachan::mlx5;

inline constexpr std::uint32_t kBatch = 16;
inline constexpr std::uint32_t kQpn = 0x1234;

struct SendSide {
    static constexpr std::uint32_t kWqeCount = 1024;

    SendSide()
        : ring(kWqeCount * mlx5::kSendWqeBasicBlockSize),
          blueflame(512),
          wr_ids(kWqeCount),
          wqe_ends(kWqeCount) {
        const mlx5::SendQueueRing send_ring{ring.data(),     kWqeCount,        kQpn,
                                            doorbell_record, blueflame.data(), 256};
        mlx5::SendQueueConfig config;
        config.max_sge = 4;
        config.max_inline_data = 256;
        queue = mlx5::SendQueue(send_ring, {wr_ids.data(), wqe_ends.data(), 0, 0}, config);
        for (std::uint32_t i = 0; i < kBatch; ++i) {
            requests[i].wr_id = i;
            requests[i].opcode = mlx5::SendOpcode::rdma_write;
            requests[i].flags = i == kBatch - 1 ? mlx5::kSendSignaled : 0;
            requests[i].sg_list = &element;
            requests[i].num_sge = 1;
            requests[i].remote_addr = 0x7f0000000000ull + i * 4096;
            requests[i].rkey = 0x99;
        }
    }

    // Everything posted so far completes, as if the CQ had been polled.
    void complete_all() { queue.tracking().consumer_index = queue.tracking().producer_index; }

    std::vector<std::uint8_t> ring;
    std::vector<std::uint8_t> blueflame;
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    std::uint32_t doorbell_record[2] = {};
    mlx5::ScatterGatherElement element{0x10000, 4096, 0x77};
    mlx5::SendWorkRequest requests[kBatch];
    mlx5::SendQueue queue;
};

struct CompletionSide {
    static constexpr std::uint32_t kCqeCount = 1024;
    static constexpr std::uint32_t kSendWqeCount = 1024;

    CompletionSide()
        : buffer(kCqeCount * mlx5::kCqeSize64), wr_ids(kSendWqeCount), wqe_ends(kSendWqeCount) {
        // As rdma-core initialises a CQ: every entry invalid, owned by hardware.
        for (std::uint32_t i = 0; i < kCqeCount; ++i)
            buffer[i * mlx5::kCqeSize64 + mlx5::kCqeOpOwn] = mlx5::kCqeInvalid << 4;
        queue = mlx5::CompletionQueue(
            {buffer.data(), kCqeCount, mlx5::kCqeSize64, 0x55, doorbell_record, uar});
        tracking = {wr_ids.data(), wqe_ends.data(), 0, 0};
        target.send = &tracking;
        target.send_wqe_count = kSendWqeCount;
    }

    // The wr_id the send queue recorded for the WQE at `index` in `round`; unique per CQE.
    static std::uint64_t wr_id_for(std::uint32_t round, std::uint32_t index) {
        return static_cast<std::uint64_t>(round) << 32 | (index * 2654435761u);
    }

    // The send queue's bookkeeping for `count` one-WQEBB signaled writes, and their CQEs: a
    // requester CQE naming each WQE by its wqe_counter, written body first, op_own last.
    void produce(std::uint32_t round, std::uint32_t count) {
        for (std::uint32_t i = 0; i < count; ++i) {
            const std::uint32_t wqe_index = producer_ & (kSendWqeCount - 1);
            wr_ids[wqe_index] = wr_id_for(round, i);
            wqe_ends[wqe_index] = producer_ + 1;
            std::uint8_t* cqe = buffer.data() + (producer_ & (kCqeCount - 1)) * mlx5::kCqeSize64;
            std::memset(cqe, 0, mlx5::kCqeOpOwn);
            mlx5::store_big32(cqe + mlx5::kCqeByteCount, 4096);
            mlx5::store_big32(cqe + mlx5::kCqeSopDropQpn,
                              static_cast<std::uint32_t>(mlx5::kOpcodeRdmaWrite) << 24 | kQpn);
            mlx5::store_big16(cqe + mlx5::kCqeWqeCounter, static_cast<std::uint16_t>(producer_));
            const std::uint8_t owner = (producer_ / kCqeCount) & 1;
            mlx5::store_release8(cqe + mlx5::kCqeOpOwn,
                                 static_cast<std::uint8_t>(mlx5::kCqeRequester << 4 | owner));
            ++producer_;
        }
    }

    // Whether `completions` are the successful RDMA writes produce(round, ...) made, from `first`
    // on.
    static bool expected(const mlx5::Completion* completions, std::uint32_t count,
                         std::uint32_t round, std::uint32_t first) {
        for (std::uint32_t i = 0; i < count; ++i) {
            const mlx5::Completion& completion = completions[i];
            if (completion.wr_id != wr_id_for(round, first + i) ||
                completion.status != mlx5::CompletionStatus::success ||
                completion.opcode != mlx5::CompletionOpcode::rdma_write ||
                completion.qp_num != kQpn || completion.is_receive)
                return false;
        }
        return true;
    }

    std::vector<std::uint8_t> buffer;
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    std::uint32_t doorbell_record[2] = {};
    alignas(64) std::uint8_t uar[64] = {};  // the UAR page up to the CQ doorbell register
    mlx5::SendQueueTracking tracking;
    mlx5::CompletionTarget target;
    mlx5::CompletionQueue queue;

  private:
    std::uint32_t producer_ = 0;
};

// The resolver channel code passes: one known QP (host and device: the nvcc host cases use it).
struct Resolver {
    mlx5::CompletionTarget* target;
    RDMACHAN_HOST_DEVICE mlx5::CompletionTarget* operator()(std::uint32_t qpn, std::uint32_t) const {
        return qpn == kQpn ? target : nullptr;
    }
};

}  // namespace data_path_test
