// MultiChannel in one process (three ranks on one software device): set-up checks, peer
// indexes checked before posting, scatter/gather with loopback, several shares per peer,
// scopes that throw and manual scopes.
#include <doctest/doctest.h>

#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "rdmachan/multi_channel.hpp"

using namespace rdmachan;

namespace {

struct World {
    std::vector<MultiChannel> ranks;
    std::vector<std::vector<std::uint8_t>> memory;
    std::vector<MemoryRegion> regions;
};

// RDMACHAN_TEST_MODE=dc runs the cases on worlds in DC mode (2 DC initiators per rank); the
// CTest multi_channel_test_dc sets it.
MultiChannelMode test_mode() {
    const char* mode = std::getenv("RDMACHAN_TEST_MODE");
    return mode != nullptr && std::string(mode) == "dc" ? MultiChannelMode::dynamically_connected
                                                        : MultiChannelMode::reliable_connected;
}

World make_world(std::uint32_t size, std::size_t bytes, ChannelBuilder channel = ChannelBuilder().deadline(std::chrono::seconds(5))) {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    World world;
    for (std::uint32_t rank = 0; rank < size; ++rank) {
        prepared.push_back(MultiChannelBuilder(channel).rank(rank).world_size(size).mode(test_mode()).dc_initiators(2).build());
        // Endpoints cross as JSON, as between processes.
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    for (std::uint32_t rank = 0; rank < size; ++rank) {
        world.memory.emplace_back(bytes, 0);
        world.regions.push_back(prepared[rank].register_memory(world.memory[rank].data(), bytes));
        world.ranks.push_back(std::move(prepared[rank]).handshake(table));
        // The mode really is the one asked for: DC holds its initiators plus one target.
        CHECK(world.ranks.back().queue_pair_count() ==
              (test_mode() == MultiChannelMode::dynamically_connected ? 3u : size));
    }
    return world;
}

}  // namespace

TEST_CASE("builder and handshake errors name the setting, the rank and the sizes") {
    CHECK_THROWS_WITH_AS(MultiChannelBuilder().rank(0).build(), doctest::Contains("world_size is not set"), Error);
    CHECK_THROWS_WITH_AS(MultiChannelBuilder().world_size(2).build(), doctest::Contains("rank is not set"), Error);
    CHECK_THROWS_WITH_AS(MultiChannelBuilder().rank(2).world_size(2).build(), doctest::Contains("rank 2 is not below world_size 2"),
                         Error);
    CHECK_THROWS_WITH_AS(MultiChannelBuilder().world_size(0), doctest::Contains("world_size: 0"), Error);
    PreparedMultiChannel prepared = MultiChannelBuilder().rank(1).world_size(2).build();
    CHECK(prepared.endpoints().size() == 2);
    std::vector<std::vector<ChannelEndpoint>> short_table{prepared.endpoints()};
    CHECK_THROWS_WITH_AS(std::move(prepared).handshake(short_table), doctest::Contains("has 1 ranks, the world has 2"), Error);
    PreparedMultiChannel again = MultiChannelBuilder().rank(0).world_size(2).build();
    std::vector<std::vector<ChannelEndpoint>> ragged{again.endpoints(), {again.endpoints()[0]}};
    CHECK_THROWS_WITH_AS(std::move(again).handshake(ragged), doctest::Contains("rank 1 published 1 endpoints"), Error);
}

TEST_CASE("a fixed world of two modes is refused on both sides, naming the rank and what its endpoint lacks") {
    // Scatter-to-CQE off whatever the environment says (DC refuses it): this is about pairing.
    const auto prepare = [](std::uint32_t rank, MultiChannelMode mode) {
        return MultiChannelBuilder(ChannelBuilder().scatter_to_cqe(false)).rank(rank).world_size(2).mode(mode).dc_initiators(2).build();
    };
    PreparedMultiChannel rc = prepare(0, MultiChannelMode::reliable_connected);
    PreparedMultiChannel dc = prepare(1, MultiChannelMode::dynamically_connected);
    const std::vector<Endpoint> table{rc.endpoint(), dc.endpoint()};
    CHECK_THROWS_WITH_AS(std::move(rc).handshake(table),
                         doctest::Contains("(rank 0): rank 1 is in DC mode (endpoint field 'dc' is set), this process in RC mode"),
                         Error);
    CHECK_THROWS_WITH_AS(std::move(dc).handshake(table),
                         doctest::Contains("(rank 1): rank 0 has no DC target (endpoint field 'dc' is empty)"), Error);
    // A DC endpoint without initiators: its receives could not be told to come from it.
    PreparedMultiChannel first = prepare(0, MultiChannelMode::dynamically_connected);
    PreparedMultiChannel second = prepare(1, MultiChannelMode::dynamically_connected);
    std::vector<Endpoint> silent{first.endpoint(), second.endpoint()};
    silent[1].dci.clear();
    CHECK_THROWS_WITH_AS(std::move(first).handshake(silent),
                         doctest::Contains("rank 1 published no DC initiators (endpoint field 'dci' is empty)"), Error);
    // One endpoint per peer exists only in RC.
    CHECK_THROWS_WITH_AS(second.endpoints(), doctest::Contains("a DC multi-channel has one endpoint per process"), Error);
    CHECK(second.endpoint().dc.size() == 1);
    CHECK(second.endpoint().rc.empty());
    CHECK(prepare(1, MultiChannelMode::reliable_connected).endpoint().rc.size() == 2);
}

TEST_CASE("three ranks in one process: all-to-all scatter_write and gather_read, the own rank included") {
    constexpr std::uint32_t kSize = 3;
    constexpr std::uint32_t kSlice = 1024;
    World world = make_world(kSize, 3 * kSize * kSlice);
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        for (std::uint32_t i = 0; i < kSize * kSlice; ++i) world.memory[rank][i] = static_cast<std::uint8_t>(rank * 50 + i);
    }
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        std::vector<PeerTransfer> shares;
        for (std::uint32_t peer = 0; peer < kSize; ++peer) {
            shares.push_back({peer, world.regions[rank].slice(peer * kSlice, kSlice),
                              world.regions[peer].remote((kSize + rank) * kSlice, kSlice)});
        }
        MultiResult result = world.ranks[rank].scatter_write(shares);
        REQUIRE_MESSAGE(result.ok(), result.message());
        CHECK(result.results().size() == kSize);
    }
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        for (std::uint32_t peer = 0; peer < kSize; ++peer) {
            CHECK(std::memcmp(world.memory[rank].data() + (kSize + peer) * kSlice, world.memory[peer].data() + rank * kSlice, kSlice) == 0);
        }
    }
    std::vector<PeerTransfer> reads;
    for (std::uint32_t peer = 0; peer < kSize; ++peer) {
        reads.push_back({peer, world.regions[0].slice((2 * kSize + peer) * kSlice, kSlice), world.regions[peer].remote(0, kSlice)});
    }
    world.ranks[0].scope([&](MultiScope& scope) { CHECK(scope.post_gather_read(reads).wait().ok()); });
    for (std::uint32_t peer = 0; peer < kSize; ++peer) {
        CHECK(std::memcmp(world.memory[0].data() + (2 * kSize + peer) * kSlice, world.memory[peer].data(), kSlice) == 0);
    }
}

TEST_CASE("more shares for one peer than its send budget: split into batches, all delivered") {
    World world = make_world(2, 64 * 1024, ChannelBuilder().max_send_wr(8).deadline(std::chrono::seconds(5)));
    for (std::uint32_t i = 0; i < 32 * 1024; ++i) world.memory[0][i] = static_cast<std::uint8_t>(i * 7);
    std::vector<PeerTransfer> shares;
    for (std::uint32_t piece = 0; piece < 20; ++piece) {
        shares.push_back({1, world.regions[0].slice(piece * 1024, 1024), world.regions[1].remote(32 * 1024 + piece * 1024, 1024)});
    }
    MultiResult result = world.ranks[0].scatter_write(shares);
    REQUIRE(result.ok());
    CHECK(result.results().size() == 3);  // 8 + 8 + 4 under three doorbells
    CHECK(std::memcmp(world.memory[1].data() + 32 * 1024, world.memory[0].data(), 20 * 1024) == 0);
    CHECK(world.ranks[0].counters(1).operations == 20);
    CHECK(world.ranks[0].counters(1).bytes == 20 * 1024);
}

TEST_CASE("a peer out of range is rejected before anything is posted") {
    World world = make_world(2, 4096);
    std::vector<PeerTransfer> shares{{1, world.regions[0].slice(0, 64), world.regions[1].remote(0, 64)},
                                     {2, world.regions[0].slice(0, 64), world.regions[1].remote(0, 64)}};
    CHECK_THROWS_WITH_AS(world.ranks[0].scatter_write(shares), doctest::Contains("peer 2 is out of range (world size 2)"), Error);
    CHECK(world.ranks[0].counters(1).operations == 0);
    CHECK(world.ranks[0].counters(1).outstanding == 0);
    const std::uint32_t peers[] = {0, 5};
    CHECK_THROWS_WITH_AS(world.ranks[0].multicast_send(peers, world.regions[0].slice(0, 8)), doctest::Contains("peer 5"), Error);
    CHECK(world.ranks[0].counters(0).operations == 0);
    CHECK_THROWS_WITH_AS(world.ranks[0].write(9, world.regions[0].slice(0, 8), world.regions[1].remote(0, 8)),
                         doctest::Contains("MultiChannel::post_write: peer 9"), Error);
    std::vector<PeerTransfer> misfit{{1, world.regions[0].slice(0, 128), world.regions[1].remote(0, 64)}};
    CHECK_THROWS_WITH_AS(world.ranks[0].gather_read(misfit), doctest::Contains("share 0 (rank 1)"), Error);
}

TEST_CASE("scopes: a throwing body still drains, manual_scope reports unpolled work") {
    World world = make_world(2, 4096);
    std::vector<PeerTransfer> shares{{0, world.regions[0].slice(0, 64), world.regions[0].remote(1024, 64)},
                                     {1, world.regions[0].slice(0, 64), world.regions[1].remote(1024, 64)}};
    world.memory[0][0] = 42;
    CHECK_THROWS_WITH_AS(world.ranks[0].scope([&](MultiScope& scope) {
        scope.post_scatter_write(shares);
        throw std::runtime_error("body failed");
    }),
                         doctest::Contains("body failed"), std::runtime_error);
    CHECK(world.memory[1][1024] == 42);
    CHECK(world.ranks[0].counters(1).outstanding == 0);
    CHECK_THROWS_WITH_AS(world.ranks[0].manual_scope([&](MultiScope& scope) { scope.post_scatter_write(shares); }),
                         doctest::Contains("2 operation(s) were left unpolled"), Error);
    CHECK(world.ranks[0].healthy_peers().size() == 2);
}
