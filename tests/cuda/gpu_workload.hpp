// The work a GPU kernel posts through the mlx5 data path in gpu_soft_device_test.cu, written
// once as __host__ __device__ code so that the kernel and the host's replay of it (which checks
// the WQE bytes the kernel wrote) build exactly the same requests, and the host's expected
// memory images follow from the same offsets.
//
// One round posts 26 WQEs on the initiator's queue pair: ten single posts (each eligible for
// BlueFlame) covering every opcode the test exercises (RDMA write from one SGE, three SGEs and
// inline data; write with immediate; send from one SGE, inline, and with immediate from two
// SGEs; RDMA read; fetch-and-add; compare-and-swap), then one post of sixteen writes of which
// only the last asks for a CQE. It also posts four receives on the target, one with two SGEs.
// Rings and CQs are small (gpu_soft_device_test.cu) so that sixteen rounds wrap every one of
// them several times.
#pragma once

#include <cstdint>

#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/work_request.hpp"

namespace gpu_workload {

namespace mlx5 = rdmachan::mlx5;

inline constexpr std::uint32_t kRounds = 16;
inline constexpr std::uint32_t kBufferBytes = 1u << 20;
inline constexpr std::uint32_t kSinglePosts = 10;
inline constexpr std::uint32_t kBatchPosts = 16;
inline constexpr std::uint32_t kRequestsPerRound = kSinglePosts + kBatchPosts;
inline constexpr std::uint32_t kSignaledPerRound = kSinglePosts + 1;
inline constexpr std::uint32_t kReceivesPerRound = 4;
// SGEs of the ten single posts (one each, three for the gathered write, two for the send with
// immediate), then one per batched write.
inline constexpr std::uint32_t kElementsPerRound = 13 + kBatchPosts;

// The initiator's buffer: the source of every round (filled by a GPU kernel), then where the
// RDMA reads land, then the atomics' results.
inline constexpr std::uint32_t kSourceBytesPerRound = 32u << 10;
inline constexpr std::uint32_t kReadDestination = 512u << 10;
inline constexpr std::uint32_t kReadBytes = 4096;
inline constexpr std::uint32_t kAtomicResults = 600u << 10;
// The target's buffer: 48 KiB written per round, then the RDMA reads' source (filled by the
// host), and the two atomic words.
inline constexpr std::uint32_t kTargetBytesPerRound = 48u << 10;
inline constexpr std::uint32_t kReadSource = 768u << 10;
inline constexpr std::uint32_t kFetchAddWord = kBufferBytes - 64;
inline constexpr std::uint32_t kCompareSwapWord = kBufferBytes - 56;
inline constexpr std::uint64_t kFetchAddStart = 1000;

// Offsets inside a round's slice of the target, and of the source.
struct TargetOffsets {
    static constexpr std::uint32_t write = 0;
    static constexpr std::uint32_t gathered_write = 8192;
    static constexpr std::uint32_t inline_write = 16384;
    static constexpr std::uint32_t immediate_write = 20480;
    static constexpr std::uint32_t send_receive = 24576;
    static constexpr std::uint32_t inline_send_receive = 28672;
    static constexpr std::uint32_t scattered_receive_first = 32768;
    static constexpr std::uint32_t scattered_receive_second = 34816;
    static constexpr std::uint32_t batch = 40960;
    static constexpr std::uint32_t unused_receive = 45056;  // the receive a write with immediate consumes
};

struct SourceOffsets {
    static constexpr std::uint32_t write = 0;
    static constexpr std::uint32_t gathered_first = 5000;
    static constexpr std::uint32_t gathered_second = 6000;
    static constexpr std::uint32_t gathered_third = 8000;
    static constexpr std::uint32_t inline_write = 12000;
    static constexpr std::uint32_t immediate_write = 13000;
    static constexpr std::uint32_t send = 16000;
    static constexpr std::uint32_t inline_send = 18000;
    static constexpr std::uint32_t immediate_send_first = 19000;
    static constexpr std::uint32_t immediate_send_second = 20000;
    static constexpr std::uint32_t batch = 24000;
};

struct Lengths {
    static constexpr std::uint32_t write = 4096;
    static constexpr std::uint32_t gathered_first = 100;
    static constexpr std::uint32_t gathered_second = 1000;
    static constexpr std::uint32_t gathered_third = 3000;
    static constexpr std::uint32_t inline_write = 64;
    static constexpr std::uint32_t immediate_write = 2048;
    static constexpr std::uint32_t send = 1500;
    static constexpr std::uint32_t send_receive = 2048;
    static constexpr std::uint32_t inline_send = 100;
    static constexpr std::uint32_t inline_send_receive = 256;
    static constexpr std::uint32_t immediate_send_first = 300;
    static constexpr std::uint32_t immediate_send_second = 700;
    static constexpr std::uint32_t scattered_receive = 512;  // each of the two SGEs
    static constexpr std::uint32_t batch = 256;
    static constexpr std::uint32_t unused_receive = 64;
};

// Where the two buffers are, in the address space both the GPU and the device use.
struct Buffers {
    std::uint64_t initiator = 0;
    std::uint32_t initiator_lkey = 0;
    std::uint64_t target = 0;
    std::uint32_t target_lkey = 0;
    std::uint32_t target_rkey = 0;
};

RDMACHAN_HOST_DEVICE inline std::uint8_t source_byte(std::uint32_t offset) {
    return static_cast<std::uint8_t>(((offset * 0x9E3779B1u) >> 24) ^ (offset >> 12));
}

RDMACHAN_HOST_DEVICE inline std::uint8_t read_source_byte(std::uint32_t offset) {
    return static_cast<std::uint8_t>(((offset * 0x85EBCA6Bu) >> 23) + 1);
}

RDMACHAN_HOST_DEVICE inline std::uint64_t wr_id(std::uint32_t round, std::uint32_t index) {
    return (std::uint64_t{round} << 32) | (0xA000u + index);
}

RDMACHAN_HOST_DEVICE inline std::uint64_t receive_wr_id(std::uint32_t round, std::uint32_t index) {
    return (std::uint64_t{round} << 32) | (0xB000u + index);
}

RDMACHAN_HOST_DEVICE inline std::uint32_t write_immediate(std::uint32_t round) { return 0xC0DE0000u + round; }
RDMACHAN_HOST_DEVICE inline std::uint32_t send_immediate(std::uint32_t round) { return 0xBEEF0000u + round; }

// Fills `requests` (kRequestsPerRound) and the SGEs they point at (kElementsPerRound).
RDMACHAN_HOST_DEVICE inline void round_requests(const Buffers& buffers, std::uint32_t round, mlx5::SendWorkRequest* requests,
                                                mlx5::ScatterGatherElement* elements) {
    const std::uint64_t source = buffers.initiator + std::uint64_t{round} * kSourceBytesPerRound;
    const std::uint64_t target = buffers.target + std::uint64_t{round} * kTargetBytesPerRound;
    const std::uint32_t lkey = buffers.initiator_lkey;
    std::uint32_t used = 0;
    auto element = [&](std::uint64_t address, std::uint32_t length) {
        elements[used] = {address, length, lkey};
        return &elements[used++];
    };
    for (std::uint32_t i = 0; i < kRequestsPerRound; ++i) requests[i] = mlx5::SendWorkRequest{};
    auto request = [&](std::uint32_t index, mlx5::SendOpcode opcode, std::uint32_t flags) -> mlx5::SendWorkRequest& {
        mlx5::SendWorkRequest& r = requests[index];
        r.wr_id = wr_id(round, index);
        r.opcode = opcode;
        r.flags = flags;
        r.rkey = buffers.target_rkey;
        return r;
    };
    constexpr std::uint32_t signaled = mlx5::kSendSignaled;

    auto& write = request(0, mlx5::SendOpcode::rdma_write, signaled);
    write.sg_list = element(source + SourceOffsets::write, Lengths::write);
    write.num_sge = 1;
    write.remote_addr = target + TargetOffsets::write;

    auto& gathered = request(1, mlx5::SendOpcode::rdma_write, signaled);
    gathered.sg_list = element(source + SourceOffsets::gathered_first, Lengths::gathered_first);
    element(source + SourceOffsets::gathered_second, Lengths::gathered_second);
    element(source + SourceOffsets::gathered_third, Lengths::gathered_third);
    gathered.num_sge = 3;
    gathered.remote_addr = target + TargetOffsets::gathered_write;

    auto& inline_write = request(2, mlx5::SendOpcode::rdma_write, signaled | mlx5::kSendInline);
    inline_write.sg_list = element(source + SourceOffsets::inline_write, Lengths::inline_write);
    inline_write.num_sge = 1;
    inline_write.remote_addr = target + TargetOffsets::inline_write;

    auto& immediate_write = request(3, mlx5::SendOpcode::rdma_write_with_immediate, signaled);
    immediate_write.sg_list = element(source + SourceOffsets::immediate_write, Lengths::immediate_write);
    immediate_write.num_sge = 1;
    immediate_write.remote_addr = target + TargetOffsets::immediate_write;
    immediate_write.immediate = write_immediate(round);

    auto& send = request(4, mlx5::SendOpcode::send, signaled);
    send.sg_list = element(source + SourceOffsets::send, Lengths::send);
    send.num_sge = 1;

    auto& inline_send = request(5, mlx5::SendOpcode::send, signaled | mlx5::kSendInline | mlx5::kSendSolicited);
    inline_send.sg_list = element(source + SourceOffsets::inline_send, Lengths::inline_send);
    inline_send.num_sge = 1;

    auto& immediate_send = request(6, mlx5::SendOpcode::send_with_immediate, signaled);
    immediate_send.sg_list = element(source + SourceOffsets::immediate_send_first, Lengths::immediate_send_first);
    element(source + SourceOffsets::immediate_send_second, Lengths::immediate_send_second);
    immediate_send.num_sge = 2;
    immediate_send.immediate = send_immediate(round);

    auto& read = request(7, mlx5::SendOpcode::rdma_read, signaled);
    read.sg_list = element(buffers.initiator + kReadDestination + std::uint64_t{round} * kReadBytes, kReadBytes);
    read.num_sge = 1;
    read.remote_addr = buffers.target + kReadSource + std::uint64_t{round} * kReadBytes;

    auto& fetch_add = request(8, mlx5::SendOpcode::atomic_fetch_and_add, signaled);
    fetch_add.sg_list = element(buffers.initiator + kAtomicResults + std::uint64_t{round} * 16, 8);
    fetch_add.num_sge = 1;
    fetch_add.remote_addr = buffers.target + kFetchAddWord;
    fetch_add.compare_add = round + 1;

    auto& compare_swap = request(9, mlx5::SendOpcode::atomic_compare_and_swap, signaled);
    compare_swap.sg_list = element(buffers.initiator + kAtomicResults + std::uint64_t{round} * 16 + 8, 8);
    compare_swap.num_sge = 1;
    compare_swap.remote_addr = buffers.target + kCompareSwapWord;
    compare_swap.compare_add = round;
    compare_swap.swap = round + 1;

    for (std::uint32_t i = 0; i < kBatchPosts; ++i) {
        const bool last = i + 1 == kBatchPosts;
        auto& batched = request(kSinglePosts + i, mlx5::SendOpcode::rdma_write, last ? signaled : 0);
        batched.sg_list = element(source + SourceOffsets::batch + i * Lengths::batch, Lengths::batch);
        batched.num_sge = 1;
        batched.remote_addr = target + TargetOffsets::batch + i * Lengths::batch;
    }
}

// The four receives the target posts for a round, in the order the round's requests consume them:
// the write with immediate, the send, the inline send, the send with immediate (two SGEs).
RDMACHAN_HOST_DEVICE inline void round_receives(const Buffers& buffers, std::uint32_t round, mlx5::ReceiveWorkRequest* requests,
                                                mlx5::ScatterGatherElement* elements) {
    const std::uint64_t target = buffers.target + std::uint64_t{round} * kTargetBytesPerRound;
    const std::uint32_t lkey = buffers.target_lkey;
    elements[0] = {target + TargetOffsets::unused_receive, Lengths::unused_receive, lkey};
    elements[1] = {target + TargetOffsets::send_receive, Lengths::send_receive, lkey};
    elements[2] = {target + TargetOffsets::inline_send_receive, Lengths::inline_send_receive, lkey};
    elements[3] = {target + TargetOffsets::scattered_receive_first, Lengths::scattered_receive, lkey};
    elements[4] = {target + TargetOffsets::scattered_receive_second, Lengths::scattered_receive, lkey};
    requests[0] = {receive_wr_id(round, 0), &elements[0], 1};
    requests[1] = {receive_wr_id(round, 1), &elements[1], 1};
    requests[2] = {receive_wr_id(round, 2), &elements[2], 1};
    requests[3] = {receive_wr_id(round, 3), &elements[3], 2};
}

}  // namespace gpu_workload
