// Instruction counts of the send data path, for callgrind (not a CTest test):
//   valgrind --tool=callgrind --callgrind-out-file=send.out tests/mlx5/mlx5_send_post_benchmark
//   callgrind_annotate --inclusive=yes send.out | grep -E 'post_one_write|post_batch_of_16'
// Each function runs kRounds times; divide its inclusive count by kRounds (and by 16 for the
// batch). Both post RC RDMA writes with one SGE and a 256-byte BlueFlame buffer, so the single
// post includes the BlueFlame copy and the batch one 8-byte doorbell.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "transport/mlx5/send_queue.hpp"

namespace mlx5 = rdmachan::mlx5;

namespace {

constexpr int kRounds = 1000;
constexpr std::uint32_t kBatch = 16;

__attribute__((noinline)) mlx5::PostResult post_one_write(mlx5::SendQueue& queue,
                                                          const mlx5::SendWorkRequest* request) {
    std::uint32_t posted = 0;
    return queue.post(request, 1, &posted);
}

__attribute__((noinline)) mlx5::PostResult post_batch_of_16(mlx5::SendQueue& queue,
                                                            const mlx5::SendWorkRequest* requests) {
    std::uint32_t posted = 0;
    return queue.post(requests, kBatch, &posted);
}

}  // namespace

int main() {
    constexpr std::uint32_t kWqeCount = 1024;
    std::vector<std::uint8_t> ring(kWqeCount * mlx5::kSendWqeBasicBlockSize);
    std::vector<std::uint8_t> blueflame(512);
    std::vector<std::uint64_t> wr_ids(kWqeCount);
    std::vector<std::uint32_t> wqe_ends(kWqeCount);
    std::uint32_t doorbell_record[2] = {};
    mlx5::SendQueueRing send_ring{ring.data(),     kWqeCount,        0x1234,
                                  doorbell_record, blueflame.data(), 256};
    mlx5::SendQueueConfig config;
    config.max_sge = 4;
    config.max_inline_data = 256;
    mlx5::SendQueue queue(send_ring, {wr_ids.data(), wqe_ends.data(), 0, 0}, config);

    const mlx5::ScatterGatherElement element{0x10000, 4096, 0x77};
    mlx5::SendWorkRequest requests[kBatch];
    for (std::uint32_t i = 0; i < kBatch; ++i) {
        requests[i].wr_id = i;
        requests[i].opcode = mlx5::SendOpcode::rdma_write;
        requests[i].flags = i == kBatch - 1 ? mlx5::kSendSignaled : 0;
        requests[i].sg_list = &element;
        requests[i].num_sge = 1;
        requests[i].remote_addr = 0x7f0000000000ull + i * 4096;
        requests[i].rkey = 0x99;
    }
    int failures = 0;
    for (int round = 0; round < kRounds; ++round) {
        failures += post_one_write(queue, &requests[kBatch - 1]) != mlx5::PostResult::ok;
        // Everything completes at once, as if the CQ had been polled.
        queue.tracking().consumer_index = queue.tracking().producer_index;
    }
    for (int round = 0; round < kRounds; ++round) {
        failures += post_batch_of_16(queue, requests) != mlx5::PostResult::ok;
        queue.tracking().consumer_index = queue.tracking().producer_index;
    }
    if (failures != 0)
        std::fprintf(stderr, "mlx5_send_post_benchmark: %d posts refused\n", failures);
    return failures == 0 ? 0 : 1;
}
