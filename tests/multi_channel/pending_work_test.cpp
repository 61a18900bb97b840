// The handles' non-blocking ends, on channels inside this process (software device):
// PendingMultiWork::poll, which takes every share's result once all have completed, and
// PendingWork::flush / PendingMultiWork::flush, which end work without waiting for it.
#include <doctest/doctest.h>

#include <chrono>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"

using namespace rdmachan;

namespace {

constexpr auto kDeadline = std::chrono::seconds(10);

std::vector<MultiChannel> make_world(std::uint32_t size) {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    for (std::uint32_t rank = 0; rank < size; ++rank) {
        prepared.push_back(MultiChannelBuilder(ChannelBuilder().device("soft").deadline(kDeadline)).rank(rank).world_size(size).build());
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    std::vector<MultiChannel> world;
    for (std::uint32_t rank = 0; rank < size; ++rank) world.push_back(std::move(prepared[rank]).handshake(table));
    return world;
}

// Polls until the result is there (at most 5 s).
std::optional<MultiResult> poll_until_done(PendingMultiWork& work) {
    std::optional<MultiResult> result;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!result.has_value() && std::chrono::steady_clock::now() < until) result = work.poll();
    return result;
}

}  // namespace

TEST_CASE("PendingMultiWork::poll: nothing until every share completed, then all results once; wait() goes on from a partial poll") {
    std::vector<MultiChannel> world = make_world(3);
    std::vector<MemoryRegion> regions;
    for (MultiChannel& channel : world) regions.push_back(channel.allocate_memory(4096));
    const std::vector<PeerTransfer> receives = {{1, regions[0].slice(0, 64), {}}, {2, regions[0].slice(64, 64), {}}};
    PendingMultiWork incoming = world[0].post_gather_receive(receives);
    CHECK(incoming.peers() == std::vector<std::uint32_t>{1, 2});
    CHECK_FALSE(incoming.poll().has_value());

    REQUIRE(world[1].send(0, regions[1].slice(0, 10)).ok());
    for (int i = 0; i < 100; ++i) CHECK_FALSE(incoming.poll().has_value());  // rank 2's share is missing
    REQUIRE(world[2].send(0, regions[2].slice(0, 20)).ok());
    const std::optional<MultiResult> all = poll_until_done(incoming);
    REQUIRE(all.has_value());
    REQUIRE(all->ok());
    REQUIRE(all->results().size() == 2);
    CHECK(all->results()[0].peer == 1);
    CHECK(all->results()[0].result.completion().bytes == 10);
    CHECK(all->results()[1].peer == 2);
    CHECK(all->results()[1].result.completion().bytes == 20);
    CHECK_FALSE(incoming.poll().has_value());  // taken once
    CHECK(incoming.size() == 0);

    PendingMultiWork again = world[0].post_gather_receive(receives);
    REQUIRE(world[2].send(0, regions[2].slice(0, 30)).ok());
    for (int i = 0; i < 1000; ++i) (void)again.poll();  // takes rank 2's share, keeps it
    REQUIRE(world[1].send(0, regions[1].slice(0, 40)).ok());
    const MultiResult waited = again.wait();
    REQUIRE(waited.ok());
    REQUIRE(waited.results().size() == 2);
    CHECK(waited.results()[0].result.completion().bytes == 40);
    CHECK(waited.results()[1].result.completion().bytes == 30);
}

TEST_CASE("PendingWork::flush: a completion that is there is taken; work that is not fails the queue pair at once, not at the deadline") {
    const ChannelSettings settings = ChannelBuilder().device("soft").deadline(kDeadline).settings();
    PreparedChannel first = ChannelBuilder(settings).build();
    PreparedChannel second = ChannelBuilder(settings).build();
    const ChannelEndpoint first_endpoint = first.endpoint();
    Channel a = std::move(first).handshake(second.endpoint());
    Channel b = std::move(second).handshake(first_endpoint);
    MemoryRegion a_region = a.allocate_memory(4096);
    MemoryRegion b_region = b.allocate_memory(4096);

    PendingWork written = a.post_write(a_region.slice(0, 64), b_region.remote(0, 64));
    REQUIRE(a.write(a_region.slice(64, 64), b_region.remote(64, 64)).ok());  // the first has landed too
    const WorkResult taken = written.flush();
    CHECK(taken.ok());
    CHECK_FALSE(written.pending());
    CHECK(a.healthy());

    PendingWork received = b.post_receive(b_region.slice(0, 64));  // nothing will come
    const auto before = std::chrono::steady_clock::now();
    const WorkResult flushed = received.flush();
    CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(2));
    REQUIRE_FALSE(flushed.ok());
    CHECK(flushed.error().operation == Operation::receive);
    CHECK(flushed.error().peer == b.peer());
    CHECK_FALSE(flushed.error().deadline_expired);
    CHECK_FALSE(b.healthy());
    CHECK_THROWS_AS(received.flush(), Error);  // once only
}

TEST_CASE("PendingMultiWork::flush: shares poll() took keep their results; the rest fail only their own peer") {
    std::vector<MultiChannel> world = make_world(3);
    std::vector<MemoryRegion> regions;
    for (MultiChannel& channel : world) regions.push_back(channel.allocate_memory(4096));
    const std::vector<PeerTransfer> receives = {{1, regions[0].slice(0, 64), {}}, {2, regions[0].slice(64, 64), {}}};
    PendingMultiWork incoming = world[0].post_gather_receive(receives);
    REQUIRE(world[1].send(0, regions[1].slice(0, 10)).ok());
    for (int i = 0; i < 1000; ++i) (void)incoming.poll();  // takes rank 1's share
    const MultiResult result = incoming.flush();
    REQUIRE(result.results().size() == 2);
    CHECK(result.results()[0].result.ok());
    CHECK(result.results()[0].result.completion().bytes == 10);
    CHECK(result.failed_peers() == std::vector<std::uint32_t>{2});
    CHECK(world[0].healthy(1));
    CHECK_FALSE(world[0].healthy(2));
}
