// MultiChannel in DC mode, several ranks in one process on the software device: the same
// operations as RC through W DC initiators and one DC target per rank; receives matched to the
// sending rank; a wrong DC key; an initiator error recovered without the other peers noticing;
// and the queue pairs per process, RC against DC.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <vector>

#include "rdmachan/multi_channel.hpp"

using namespace rdmachan;

namespace {

struct World {
    std::vector<MultiChannel> ranks;
    std::vector<std::vector<std::uint8_t>> memory;
    std::vector<MemoryRegion> regions;
};

// tamper: changes the table before the handshake (a wrong key, say).
World make_world(std::uint32_t size, std::size_t bytes, MultiChannelMode mode, std::uint32_t initiators = 2,
                 const std::function<void(std::vector<Endpoint>&)>& tamper = {}) {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    World world;
    for (std::uint32_t rank = 0; rank < size; ++rank) {
        prepared.push_back(MultiChannelBuilder(ChannelBuilder().deadline(std::chrono::seconds(5)).ack_timeout(14).retry_count(3))
                               .rank(rank)
                               .world_size(size)
                               .mode(mode)
                               .dc_initiators(initiators)
                               .build());
        world.memory.emplace_back(bytes, 0);
        world.regions.push_back(prepared.back().register_memory(world.memory.back().data(), bytes));
        prepared.back().publish_region("buffer", world.regions.back());
        // Endpoints cross as JSON, as between processes.
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    if (tamper) tamper(table);
    for (std::uint32_t rank = 0; rank < size; ++rank) world.ranks.push_back(std::move(prepared[rank]).handshake(table));
    return world;
}

}  // namespace

TEST_CASE("DC: an endpoint is O(1) per process and the DCT number is published from RTR on") {
    PreparedMultiChannel prepared =
        MultiChannelBuilder().rank(0).world_size(64).mode(MultiChannelMode::dynamically_connected).dc_initiators(4).build();
    const Endpoint endpoint = prepared.endpoint();
    CHECK(endpoint.rc.empty());
    REQUIRE(endpoint.dc.size() == 1);
    CHECK(endpoint.dc[0].dctn != 0);
    CHECK(endpoint.dci.size() == 4);
    const std::string json = nlohmann::json(endpoint).dump();
    CHECK(nlohmann::json::parse(json).get<Endpoint>() == endpoint);
    CHECK_THROWS_WITH_AS(prepared.endpoints(), doctest::Contains("use endpoint()"), Error);
}

TEST_CASE("DC: all-to-all scatter_write with immediates, receives matched to each sender, gather_read") {
    constexpr std::uint32_t kSize = 4;
    constexpr std::uint32_t kSlice = 2048;
    World world = make_world(kSize, 3 * kSize * kSlice + 64, MultiChannelMode::dynamically_connected, 2);
    for (std::uint32_t rank = 0; rank < kSize; ++rank)
        for (std::uint32_t i = 0; i < kSize * kSlice; ++i) world.memory[rank][i] = static_cast<std::uint8_t>(rank * 37 + i);
    std::vector<PendingMultiWork> notices;
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        std::vector<PeerTransfer> receives;
        for (std::uint32_t peer = 0; peer < kSize; ++peer) receives.push_back({peer, world.regions[rank].slice(0, 0), {}});
        notices.push_back(world.ranks[rank].post_gather_receive(receives));
    }
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        std::vector<PeerTransfer> shares;
        for (std::uint32_t peer = 0; peer < kSize; ++peer) {
            shares.push_back({peer, world.regions[rank].slice(peer * kSlice, kSlice),
                              world.ranks[rank].remote_region(peer, "buffer").region.slice((kSize + rank) * kSlice, kSlice)});
        }
        const MultiResult result = world.ranks[rank].scatter_write(shares, 100 + rank);
        REQUIRE_MESSAGE(result.ok(), result.message());
    }
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        const MultiResult arrived = notices[rank].wait();
        REQUIRE_MESSAGE(arrived.ok(), arrived.message());
        for (const PeerResult& entry : arrived.results()) CHECK(entry.result.completion().immediate == 100 + entry.peer);
        for (std::uint32_t peer = 0; peer < kSize; ++peer) {
            CHECK(std::memcmp(world.memory[rank].data() + (kSize + peer) * kSlice, world.memory[peer].data() + rank * kSlice,
                              kSlice) == 0);
        }
    }
    std::vector<PeerTransfer> reads;
    for (std::uint32_t peer = 0; peer < kSize; ++peer)
        reads.push_back({peer, world.regions[0].slice((2 * kSize + peer) * kSlice, kSlice), world.ranks[0].remote_region(peer, "buffer").region.slice(0, kSlice)});
    world.ranks[0].scope([&](MultiScope& scope) { CHECK(scope.post_gather_read(reads).wait().ok()); });
    for (std::uint32_t peer = 0; peer < kSize; ++peer)
        CHECK(std::memcmp(world.memory[0].data() + (2 * kSize + peer) * kSlice, world.memory[peer].data(), kSlice) == 0);
}

TEST_CASE("DC: sends from several ranks arrive in order per sender, each in the receive for that sender") {
    constexpr std::uint32_t kSize = 3;
    World world = make_world(kSize, 64 * 1024, MultiChannelMode::dynamically_connected, 1);
    // Rank 0 posts its receives per sender first; ranks 1 and 2 each send 5 numbered messages.
    std::vector<PendingWork> receives;
    for (std::uint32_t message = 0; message < 5; ++message)
        for (std::uint32_t sender : {1u, 2u})
            receives.push_back(world.ranks[0].post_receive(sender, world.regions[0].slice((message * 2 + sender) * 64, 64)));
    for (std::uint32_t message = 0; message < 5; ++message) {
        for (std::uint32_t sender : {2u, 1u}) {
            std::memset(world.memory[sender].data(), static_cast<int>(sender * 16 + message), 48);
            REQUIRE(world.ranks[sender].send(0, world.regions[sender].slice(0, 48), message).ok());
        }
    }
    std::size_t index = 0;
    for (std::uint32_t message = 0; message < 5; ++message) {
        for (std::uint32_t sender : {1u, 2u}) {
            const WorkResult result = receives[index++].wait();
            REQUIRE(result.ok());
            CHECK(result.completion().bytes == 48);
            CHECK(result.completion().immediate == message);
            CHECK(world.memory[0][(message * 2 + sender) * 64] == sender * 16 + message);
        }
    }
    CHECK(world.ranks[0].counters(1).operations == 5);
    CHECK(world.ranks[0].counters(2).operations == 5);
}

TEST_CASE("DC: a wrong key fails only the operations to that rank, whose memory stays untouched") {
    World world = make_world(3, 4096, MultiChannelMode::dynamically_connected, 2, [](std::vector<Endpoint>& table) {
        table[2].dc[0].dc_key ^= 0xff00000000000000ull;  // everyone gets rank 2's key wrong
    });
    std::memset(world.memory[0].data(), 0x5a, 64);
    const MultiResult result = world.ranks[0].scatter_write(std::vector<PeerTransfer>{
        {1, world.regions[0].slice(0, 64), world.ranks[0].remote_region(1, "buffer").region.slice(1024, 64)},
        {2, world.regions[0].slice(0, 64), world.ranks[0].remote_region(2, "buffer").region.slice(1024, 64)}});
    CAPTURE(result.message());
    REQUIRE(result.failed_peers() == std::vector<std::uint32_t>{2});
    CHECK(result.message().find("rank 2") != std::string::npos);
    CHECK(world.memory[1][1024] == 0x5a);
    CHECK(world.memory[2][1024] == 0);
    CHECK_FALSE(world.ranks[0].healthy(2));
    CHECK(world.ranks[0].healthy(1));
    // The initiator that carried the failure is recovered: rank 1 keeps being served.
    for (int round = 0; round < 20; ++round) {
        const WorkResult again =
            world.ranks[0].write(1, world.regions[0].slice(0, 64), world.ranks[0].remote_region(1, "buffer").region.slice(2048, 64));
        REQUIRE_MESSAGE(again.ok(), again.error().message());
    }
    CHECK(world.memory[1][2048] == 0x5a);
}

TEST_CASE("DC: a bad rkey puts the shared initiator in error; it is recovered and the other peers go on") {
    World world = make_world(3, 8192, MultiChannelMode::dynamically_connected, 1);  // one initiator: shared by all
    const RemoteMemoryRegion good = world.ranks[0].remote_region(1, "buffer").region;
    RemoteMemoryRegion bad = world.ranks[0].remote_region(2, "buffer").region;
    bad.rkey ^= 0x1000;
    std::memset(world.memory[0].data(), 0x33, 256);
    const WorkResult failed = world.ranks[0].write(2, world.regions[0].slice(0, 64), bad.slice(0, 64));
    REQUIRE_FALSE(failed.ok());
    CHECK(failed.error().message().find("rank 2") != std::string::npos);
    CHECK(world.memory[2][0] == 0);
    for (int round = 0; round < 50; ++round) {
        const WorkResult written = world.ranks[0].write(1, world.regions[0].slice(0, 128), good.slice(512, 128));
        REQUIRE_MESSAGE(written.ok(), written.error().message());
    }
    CHECK(world.memory[1][512] == 0x33);
    CHECK(world.ranks[0].healthy(1));
}

TEST_CASE("DC: a send larger than the target's receive buffers is refused before posting, naming the limit") {
    World world = make_world(2, 2 * kDcMaxSendBytes, MultiChannelMode::dynamically_connected, 1);
    PendingWork receive = world.ranks[1].post_receive(0, world.regions[1].slice(0, kDcMaxSendBytes));
    std::memset(world.memory[0].data(), 0x42, kDcMaxSendBytes + 1);
    const WorkResult refused = world.ranks[0].send(1, world.regions[0].slice(0, kDcMaxSendBytes + 1), 7u);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().message().find("at most 16384 bytes") != std::string::npos);
    CHECK(refused.error().message().find("rank 1") != std::string::npos);
    // Nothing reached the target, the shared initiator is not in error, the peer stays healthy,
    // and a send of exactly the limit arrives whole in the receive that was waiting.
    CHECK(world.ranks[0].healthy(1));
    const WorkResult sent = world.ranks[0].send(1, world.regions[0].slice(0, kDcMaxSendBytes), 8u);
    REQUIRE_MESSAGE(sent.ok(), sent.error().message());
    const WorkResult received = receive.wait();
    REQUIRE_MESSAGE(received.ok(), received.error().message());
    CHECK(received.completion().bytes == kDcMaxSendBytes);
    CHECK(received.completion().immediate == 8u);
    CHECK(world.memory[1][kDcMaxSendBytes - 1] == 0x42);
    // RDMA writes have no such limit.
    const WorkResult written = world.ranks[0].write(1, world.regions[0].slice(0, kDcMaxSendBytes + 1),
                                                    world.ranks[0].remote_region(1, "buffer").region.slice(0, kDcMaxSendBytes + 1));
    CHECK_MESSAGE(written.ok(), written.error().message());
}

TEST_CASE("queue pairs per process: RC one per peer, DC the initiators plus one target") {
    for (std::uint32_t size : {2u, 8u, 16u}) {
        const World rc = make_world(size, 256, MultiChannelMode::reliable_connected);
        const World dc = make_world(size, 256, MultiChannelMode::dynamically_connected, 4);
        std::printf("queue pairs per process for %2u ranks: RC %u (N-1 peers + loopback), DC %u (4 initiators + 1 target)\n",
                    size, rc.ranks[0].queue_pair_count(), dc.ranks[0].queue_pair_count());
        CHECK(rc.ranks[0].queue_pair_count() == size);
        CHECK(dc.ranks[0].queue_pair_count() == 5);
        CHECK(dc.ranks[0].mode() == MultiChannelMode::dynamically_connected);
    }
}
