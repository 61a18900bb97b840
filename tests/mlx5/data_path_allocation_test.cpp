// The post and poll paths must not allocate: every global operator new and every
// malloc-family call of the test thread is counted while the paths run (allocation_counter.hpp).
// The counter proves it counts before it is trusted.
#include <doctest/doctest.h>

#include <cstdlib>
#include <new>
#include <vector>

#include "tests/mlx5/allocation_counter.hpp"
#include "tests/mlx5/data_path_fixture.hpp"

namespace mlx5 = rdmachan::mlx5;
using namespace data_path_test;

using allocation_test::AllocationCounter;
using allocation_test::escape;

TEST_CASE(
    "the allocation counter sees operator new and malloc (so that a zero below means something)") {
    {
        AllocationCounter counter;
        std::vector<int> values(100);
        escape(values.data());
        CHECK(counter.count() == 1);
    }
    {
        AllocationCounter counter;
        void* pointer = std::malloc(64);
        escape(pointer);
        std::free(pointer);
        CHECK(counter.count() == 1);
    }
    {
        AllocationCounter counter;
        CHECK(counter.count() == 0);
    }
}

TEST_CASE("posting 100,000 RDMA writes, one per call and 16 per call, allocates nothing") {
    SendSide send;
    std::uint64_t refused = 0;
    std::uint64_t counted = 0;
    {
        AllocationCounter counter;
        for (int i = 0; i < 100000; ++i) {
            refused +=
                send.queue.post(&send.requests[kBatch - 1], 1, nullptr) != mlx5::PostResult::ok;
            send.complete_all();
        }
        for (int i = 0; i < 100000 / static_cast<int>(kBatch); ++i) {
            refused += send.queue.post(send.requests, kBatch, nullptr) != mlx5::PostResult::ok;
            send.complete_all();
        }
        counted = counter.count();
    }
    CHECK(refused == 0);
    CHECK(send.queue.tracking().producer_index == 200000);
    CHECK(counted == 0);
}

TEST_CASE(
    "polling 100,000 completions, one per call and 16 per call, and an empty CQ allocates "
    "nothing") {
    CompletionSide side;
    mlx5::Completion completions[kBatch];
    std::uint64_t wrong = 0;
    std::uint64_t counted = 0;
    std::uint32_t round = 0;
    for (std::uint32_t per_call : {1u, kBatch}) {
        for (std::uint32_t done = 0; done < 100000; done += 1000, ++round) {
            side.produce(round,
                         1000);  // 1000 is a multiple of 8 but not of 16: the last call is short
            for (std::uint32_t i = 0; i < 1000; i += per_call) {
                std::uint32_t polled;
                {
                    AllocationCounter counter;
                    polled = side.queue.poll(completions, per_call, Resolver{&side.target});
                    counted += counter.count();
                }
                const std::uint32_t expected_count = per_call < 1000 - i ? per_call : 1000 - i;
                wrong += polled != expected_count ||
                         !CompletionSide::expected(completions, polled, round, i);
            }
        }
    }
    {
        AllocationCounter counter;
        for (int i = 0; i < 1000; ++i)
            wrong += side.queue.poll(completions, kBatch, Resolver{&side.target}) != 0;
        counted += counter.count();
    }
    CHECK(wrong == 0);
    CHECK(side.queue.consumer_index() == 200000);
    CHECK(counted == 0);
}
