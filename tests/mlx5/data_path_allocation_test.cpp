// The post and poll paths must not allocate (issue 9): every global operator new and, through
// the linker's --wrap, every malloc-family call made by this executable is counted while the
// paths run. The counter proves it counts before it is trusted.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <new>
#include <vector>

#include "tests/mlx5/data_path_fixture.hpp"

namespace mlx5 = rdmachan::mlx5;
using namespace data_path_test;

namespace {

std::atomic<bool> counting{false};
std::atomic<std::uint64_t> allocations{0};

void note_allocation() {
    if (counting.load(std::memory_order_relaxed))
        allocations.fetch_add(1, std::memory_order_relaxed);
}

// Counts allocations made between construction and count().
class AllocationCounter {
  public:
    AllocationCounter() {
        allocations.store(0);
        counting.store(true);
    }
    ~AllocationCounter() { counting.store(false); }
    std::uint64_t count() const { return allocations.load(); }
};

// The compiler may drop an allocation whose pointer goes nowhere; this makes it go somewhere.
void escape(void* pointer) {
    asm volatile("" : : "r"(pointer) : "memory");
}

}  // namespace

// operator new takes its memory from the real malloc, so one allocation counts once.
extern "C" void* __real_malloc(std::size_t size);

void* operator new(std::size_t size) {
    note_allocation();
    if (void* pointer = __real_malloc(size == 0 ? 1 : size)) return pointer;
    throw std::bad_alloc();
}
void* operator new[](std::size_t size) {
    return operator new(size);
}
void* operator new(std::size_t size, const std::nothrow_t&) noexcept {
    note_allocation();
    return __real_malloc(size == 0 ? 1 : size);
}
void* operator new[](std::size_t size, const std::nothrow_t& tag) noexcept {
    return operator new(size, tag);
}
// Out of line: inlined into a caller, GCC would see free() meet operator new and warn.
__attribute__((noinline)) void operator delete(void* pointer) noexcept {
    std::free(pointer);
}
__attribute__((noinline)) void operator delete[](void* pointer) noexcept {
    std::free(pointer);
}
__attribute__((noinline)) void operator delete(void* pointer, std::size_t) noexcept {
    std::free(pointer);
}
__attribute__((noinline)) void operator delete[](void* pointer, std::size_t) noexcept {
    std::free(pointer);
}

// --wrap=malloc and friends (tests/mlx5/CMakeLists.txt) route this executable's calls here.
extern "C" {
void* __real_calloc(std::size_t count, std::size_t size);
void* __real_realloc(void* pointer, std::size_t size);
void* __wrap_malloc(std::size_t size) {
    note_allocation();
    return __real_malloc(size);
}
void* __wrap_calloc(std::size_t count, std::size_t size) {
    note_allocation();
    return __real_calloc(count, size);
}
void* __wrap_realloc(void* pointer, std::size_t size) {
    note_allocation();
    return __real_realloc(pointer, size);
}
}

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
