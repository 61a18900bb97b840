// The same posts and polls run by the g++ build (host_cases_gxx.cpp) and by the host side of
// the nvcc build (host_cases_nvcc.cu) of the header-only mlx5 data path; each writes every byte
// the data path produced (send ring, BlueFlame buffer, doorbell records, receive ring, decoded
// completions) to a file, and compare_host_cases.sh compares the two byte for byte.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tests/mlx5/data_path_fixture.hpp"
#include "transport/mlx5/receive_queue.hpp"

namespace host_cases {

namespace mlx5 = rdmachan::mlx5;
using data_path_test::CompletionSide;
using data_path_test::kBatch;
using data_path_test::Resolver;
using data_path_test::SendSide;

inline void write_bytes(std::FILE* out, const char* what, const void* bytes, std::size_t size) {
    std::fprintf(out, "%s %zu\n", what, size);
    std::fwrite(bytes, 1, size, out);
    std::fputc('\n', out);
}

// Field by field: the struct has padding, whose bytes nothing defines.
inline void write_completion(std::FILE* out, const mlx5::Completion& c) {
    std::fprintf(out, "completion %llx %d %d %u %d %u %u %u %u %u %u %u %u %u %u %u\n",
                 static_cast<unsigned long long>(c.wr_id), static_cast<int>(c.status), static_cast<int>(c.opcode),
                 c.flags, c.is_receive, c.vendor_error, c.syndrome, c.sl, c.dlid_path_bits, c.byte_len, c.qp_num,
                 c.immediate, c.invalidated_rkey, c.src_qp, c.slid, c.pkey_index);
}

// Every opcode and flag the encoder knows, with 0 to 4 SGEs and inline data; posted one at a
// time (BlueFlame) and in batches (one doorbell), around the ring several times.
inline std::vector<mlx5::SendWorkRequest> send_requests(const mlx5::ScatterGatherElement* elements,
                                                        const mlx5::ScatterGatherElement* inline_elements) {
    using Op = mlx5::SendOpcode;
    const Op opcodes[] = {Op::rdma_write, Op::rdma_write_with_immediate, Op::send, Op::send_with_immediate,
                          Op::send_with_invalidate, Op::rdma_read, Op::atomic_compare_and_swap,
                          Op::atomic_fetch_and_add};
    const std::uint32_t flag_sets[] = {0, mlx5::kSendSignaled, mlx5::kSendSolicited | mlx5::kSendSignaled,
                                       mlx5::kSendFence};
    std::vector<mlx5::SendWorkRequest> requests;
    for (const Op opcode : opcodes) {
        const bool atomic = opcode == Op::atomic_compare_and_swap || opcode == Op::atomic_fetch_and_add;
        for (std::uint32_t count = atomic ? 1 : 0; count <= (atomic ? 1u : 4u); ++count) {
            for (const std::uint32_t flags : flag_sets) {
                mlx5::SendWorkRequest request;
                request.wr_id = 0x1000 + requests.size();
                request.opcode = opcode;
                request.flags = flags;
                request.sg_list = elements;
                request.num_sge = count;
                request.remote_addr = 0x0102030405060708ull + requests.size() * 64;
                request.rkey = 0x00c0ffee + static_cast<std::uint32_t>(requests.size());
                request.immediate = 0xdeadbe00 + static_cast<std::uint32_t>(requests.size());
                request.compare_add = 0x1111222233334444ull;
                request.swap = 0x5555666677778888ull;
                requests.push_back(request);
            }
        }
    }
    for (std::uint32_t count = 1; count <= 3; ++count) {
        mlx5::SendWorkRequest request;
        request.wr_id = 0x2000 + count;
        request.opcode = count == 2 ? Op::send : Op::rdma_write;
        request.flags = mlx5::kSendInline | mlx5::kSendSignaled;
        request.sg_list = inline_elements;
        request.num_sge = count;
        request.remote_addr = 0x7f0000001000ull;
        request.rkey = 0x42;
        requests.push_back(request);
    }
    return requests;
}

inline void run(std::FILE* out) {
    // Send queue: each request alone, then in batches of kBatch, over about three ring passes.
    {
        std::uint8_t payload[256];
        for (std::size_t i = 0; i < sizeof payload; ++i) payload[i] = static_cast<std::uint8_t>(i * 7 + 3);
        const mlx5::ScatterGatherElement elements[4] = {
            {0x10000, 4096, 0x77}, {0x20000, 100, 0x78}, {0x30000, 1, 0x79}, {0x40000, 65536, 0x7a}};
        const mlx5::ScatterGatherElement inline_elements[3] = {
            {reinterpret_cast<std::uint64_t>(payload), 60, 0},
            {reinterpret_cast<std::uint64_t>(payload + 60), 13, 0},
            {reinterpret_cast<std::uint64_t>(payload + 100), 100, 0}};
        const std::vector<mlx5::SendWorkRequest> requests = send_requests(elements, inline_elements);
        SendSide send;
        for (int pass = 0; pass < 3; ++pass) {
            for (const mlx5::SendWorkRequest& request : requests) {
                std::uint32_t posted = 0;
                const mlx5::PostResult result = send.queue.post(&request, 1, &posted);
                std::fprintf(out, "post %d %u\n", static_cast<int>(result), posted);
                send.complete_all();
            }
            write_bytes(out, "blueflame", send.blueflame.data(), send.blueflame.size());
            for (std::size_t first = 0; first + kBatch <= requests.size(); first += kBatch) {
                std::uint32_t posted = 0;
                const mlx5::PostResult result = send.queue.post(&requests[first], kBatch, &posted);
                std::fprintf(out, "batch %d %u\n", static_cast<int>(result), posted);
                send.complete_all();
            }
            write_bytes(out, "send ring", send.ring.data(), send.ring.size());
            write_bytes(out, "send doorbell record", send.doorbell_record, sizeof send.doorbell_record);
        }
    }
    // Receive queue: 0 to 4 SGEs per WQE (terminated when short), over two ring passes.
    {
        constexpr std::uint32_t kCount = 64, kStride = 64;
        std::vector<std::uint8_t> ring(kCount * kStride, 0xa5);
        std::vector<std::uint64_t> wr_ids(kCount);
        std::uint32_t doorbell_record[2] = {};
        mlx5::ReceiveQueue queue({ring.data(), kCount, kStride, doorbell_record}, wr_ids.data(), {});
        const mlx5::ScatterGatherElement elements[4] = {
            {0x50000, 512, 0x11}, {0x60000, 8, 0x12}, {0x70000, 4096, 0x13}, {0x80000, 2, 0x14}};
        for (std::uint32_t i = 0; i < 2 * kCount; ++i) {
            const mlx5::ReceiveWorkRequest request{0x3000 + i, elements, i % 5};
            std::uint32_t posted = 0;
            const mlx5::PostResult result = queue.post(&request, 1, &posted);
            std::fprintf(out, "receive %d %u\n", static_cast<int>(result), posted);
            if (i % kCount == kCount - 1) {
                write_bytes(out, "receive ring", ring.data(), ring.size());
                write_bytes(out, "receive doorbell record", doorbell_record, sizeof doorbell_record);
                for (std::uint32_t j = 0; j < kCount; ++j)
                    std::fprintf(out, "received wr_id %llx\n",
                                 static_cast<unsigned long long>(queue.complete(static_cast<std::uint16_t>(j))));
            }
        }
    }
    // Completion queue: requester CQEs decoded one and sixteen at a time, then an empty poll,
    // then arms.
    {
        CompletionSide side;
        mlx5::Completion completions[kBatch];
        for (std::uint32_t round = 0; round < 4; ++round) {
            side.produce(round, CompletionSide::kCqeCount / 2);
            for (std::uint32_t done = 0; done < CompletionSide::kCqeCount / 2;) {
                const std::uint32_t want = round % 2 == 0 ? 1 : kBatch;
                const std::uint32_t got = side.queue.poll(completions, want, Resolver{&side.target});
                std::fprintf(out, "poll %u\n", got);
                if (got == 0) break;
                for (std::uint32_t i = 0; i < got; ++i) write_completion(out, completions[i]);
                done += got;
            }
        }
        std::fprintf(out, "empty poll %u\n", side.queue.poll(completions, kBatch, Resolver{&side.target}));
        write_bytes(out, "cq doorbell record", side.doorbell_record, sizeof side.doorbell_record);
        // Arms of both kinds between events, past the sequence number's wrap, with and without
        // a completion waiting.
        for (std::uint32_t arm = 0; arm < 12; ++arm) {
            if (arm % 3 == 2) side.produce(4 + arm, 1);
            side.queue.arm(arm % 2 == 1);
            std::fprintf(out, "arm sequence %u waiting %d\n", side.queue.arm_sequence(),
                         side.queue.completion_waiting());
            write_bytes(out, "cq doorbell record", side.doorbell_record,
                        sizeof side.doorbell_record);
            write_bytes(out, "cq doorbell register", side.uar + 0x20, 8);
            if (side.queue.completion_waiting()) {
                std::fprintf(out, "poll %u\n",
                             side.queue.poll(completions, kBatch, Resolver{&side.target}));
                write_completion(out, completions[0]);
            }
            side.queue.event_received();
        }
    }
}

}  // namespace host_cases
