// The engine's post and poll paths allocate nothing (docs/ARCHITECTURE.md): posts and polls
// through Channel and MultiChannel (RC and DC) on the software device, under the allocation
// counter (tests/mlx5/allocation_counter.hpp: the test thread's operator new and malloc family,
// the library's included; the device's own thread is not counted). Each path runs once before
// counting, so one-time set-up (a lazily grown table, the first log line) is not mistaken for a
// per-operation cost.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <chrono>
#include <optional>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"
#include "rdmachan/work_batch.hpp"
#include "tests/mlx5/allocation_counter.hpp"

using namespace rdmachan;
using allocation_test::AllocationCounter;

namespace {

constexpr int kRounds = 1000;
constexpr std::uint32_t kBatch = 16;

struct Pair {
    Channel a;
    Channel b;
};

Pair connect_pair() {
    const ChannelBuilder builder = ChannelBuilder().device("soft").deadline(std::chrono::seconds(5));
    PreparedChannel first = ChannelBuilder(builder.settings()).build();
    PreparedChannel second = ChannelBuilder(builder.settings()).build();
    const ChannelEndpoint first_endpoint = first.endpoint();
    const ChannelEndpoint second_endpoint = second.endpoint();
    return {std::move(first).handshake(second_endpoint), std::move(second).handshake(first_endpoint)};
}

std::vector<MultiChannel> make_world(MultiChannelMode mode) {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
        prepared.push_back(MultiChannelBuilder(ChannelBuilder().device("soft").deadline(std::chrono::seconds(5)))
                               .rank(rank)
                               .world_size(2)
                               .mode(mode)
                               .build());
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    std::vector<MultiChannel> world;
    for (std::uint32_t rank = 0; rank < 2; ++rank) world.push_back(std::move(prepared[rank]).handshake(table));
    return world;
}

// Runs `body` once uncounted, then kRounds times counted; returns the allocations and adds
// every result that was not ok to `failures`.
template <typename Body>
std::uint64_t allocations_of(Body body, int& failures) {
    failures += !body();
    AllocationCounter counter;
    for (int round = 0; round < kRounds; ++round) failures += !body();
    return counter.count();
}

// Polls a handle until its completion is there: PendingWork::poll, the delivery that
// scripts/instruction_counts.sh counts. False if it did not come within 5 s.
bool poll_until_done(PendingWork work) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (std::chrono::steady_clock::now() < until) {
        if (std::optional<WorkResult> result = work.poll()) return result->ok() && !work.pending();
    }
    return false;
}

}  // namespace

TEST_CASE("the counter sees an allocation made inside the library (so that a zero below means something)") {
    Pair pair = connect_pair();
    std::uint64_t counted = 0;
    {
        AllocationCounter counter;
        const std::string peer = pair.a.peer();  // built by the library, longer than SSO
        allocation_test::escape(const_cast<char*>(peer.data()));
        counted = counter.count();
    }
    CHECK(counted >= 1);
}

TEST_CASE("Channel: post_write + wait, write, a 16-write WorkBatch posted and executed allocate nothing") {
    Pair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(kBatch * 256), b_memory(kBatch * 256);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    const RemoteMemoryRegion remote = b_region.remote();
    WorkBatch batch(kBatch);
    for (std::uint32_t i = 0; i < kBatch; ++i) batch.write(a_region.slice(i * 256, 256), remote.slice(i * 256, 256));
    int failures = 0;

    CHECK(allocations_of([&] { return pair.a.post_write(a_region.slice(0, 64), remote.slice(0, 64)).wait().ok(); },
                         failures) == 0);
    CHECK(allocations_of([&] { return pair.a.write(a_region.slice(0, 64), remote.slice(64, 64)).ok(); }, failures) == 0);
    CHECK(allocations_of([&] { return pair.a.post_batch(batch).wait().ok(); }, failures) == 0);
    CHECK(allocations_of([&] { return pair.a.execute(batch).ok(); }, failures) == 0);
    CHECK(allocations_of([&] { return pair.a.read(a_region.slice(0, 64), remote.slice(128, 64)).ok(); }, failures) ==
          0);
    // The handles' poll (the inlined post and completion paths that scripts/instruction_counts.sh
    // counts), 4 KiB as counted.
    std::vector<std::uint8_t> big_a(kBatch * 4096), big_b(kBatch * 4096);
    MemoryRegion big_a_region = pair.a.register_memory(big_a.data(), big_a.size());
    MemoryRegion big_b_region = pair.b.register_memory(big_b.data(), big_b.size());
    WorkBatch big_batch(kBatch);
    for (std::uint32_t i = 0; i < kBatch; ++i)
        big_batch.write(big_a_region.slice(i * 4096, 4096), big_b_region.remote(i * 4096, 4096));
    CHECK(allocations_of([&] { return poll_until_done(pair.a.post_write(big_a_region.slice(0, 4096), big_b_region.remote(0, 4096))); },
                         failures) == 0);
    CHECK(allocations_of([&] { return poll_until_done(pair.a.post_batch(big_batch)); }, failures) == 0);
    CHECK(failures == 0);
    CHECK(pair.a.counters().operations >= 7 * (kRounds + 1));
}

void check_multi_channel(MultiChannelMode mode) {
    std::vector<MultiChannel> world = make_world(mode);
    std::vector<std::uint8_t> memory0(kBatch * 256), memory1(kBatch * 256);
    MemoryRegion region0 = world[0].register_memory(memory0.data(), memory0.size());
    MemoryRegion region1 = world[1].register_memory(memory1.data(), memory1.size());
    const RemoteMemoryRegion remote = region1.remote();
    WorkBatch batch(kBatch);
    for (std::uint32_t i = 0; i < kBatch; ++i) batch.write(region0.slice(i * 256, 256), remote.slice(i * 256, 256));
    int failures = 0;

    CHECK(allocations_of([&] { return world[0].post_write(1, region0.slice(0, 64), remote.slice(0, 64)).wait().ok(); },
                         failures) == 0);
    CHECK(allocations_of([&] { return world[0].write(1, region0.slice(0, 64), remote.slice(64, 64)).ok(); },
                         failures) == 0);
    CHECK(allocations_of([&] { return world[0].post_batch(1, batch).wait().ok(); }, failures) == 0);
    CHECK(allocations_of([&] { return world[0].execute(1, batch).ok(); }, failures) == 0);
    CHECK(failures == 0);
}

TEST_CASE("MultiChannel RC: post_write + wait, write, a 16-write WorkBatch posted and executed allocate nothing") {
    check_multi_channel(MultiChannelMode::reliable_connected);
}

TEST_CASE("MultiChannel DC: post_write + wait, write, a 16-write WorkBatch posted and executed allocate nothing") {
    check_multi_channel(MultiChannelMode::dynamically_connected);
}
