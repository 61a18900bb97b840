// MultiChannel in DC mode, several ranks in one process on the software device: the same
// operations as RC through W DC initiators and one DC target per rank; receives matched to the
// sending rank; a wrong DC key; an initiator error recovered without the other peers noticing;
// and the queue pairs per process, RC against DC.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/multi_channel.hpp"
#include "tests/handshake/rendezvous_support.hpp"

using namespace rdmachan;

namespace {

struct World {
    std::vector<MultiChannel> ranks;
    std::vector<std::vector<std::uint8_t>> memory;
    std::vector<MemoryRegion> regions;
};

ChannelBuilder default_channel() { return ChannelBuilder().deadline(std::chrono::seconds(5)).ack_timeout(14).retry_count(3); }

// tamper: changes the table before the handshake (a wrong key, say).
World make_world(std::uint32_t size, std::size_t bytes, MultiChannelMode mode, std::uint32_t initiators = 2,
                 const std::function<void(std::vector<Endpoint>&)>& tamper = {},
                 const ChannelBuilder& channel = default_channel()) {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    World world;
    for (std::uint32_t rank = 0; rank < size; ++rank) {
        prepared.push_back(MultiChannelBuilder(channel)
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

TEST_CASE("DC: a peer's state is made on first use; peers never contacted cost none and keep their meaning") {
    constexpr std::uint32_t kSize = 6;
    World world = make_world(kSize, 4096, MultiChannelMode::dynamically_connected, 2);
    const World rc = make_world(3, 256, MultiChannelMode::reliable_connected);
    CHECK(rc.ranks[0].peers_contacted() == 3);  // RC: every peer has its queue pair from the build on
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        CHECK(world.ranks[rank].peers_contacted() == 0);
        for (std::uint32_t peer = 0; peer < kSize; ++peer) {
            // Never contacted: healthy, no counters, named as always, and still none made.
            CHECK(world.ranks[rank].healthy(peer));
            CHECK(world.ranks[rank].counters(peer).operations == 0);
            CHECK(world.ranks[rank].peer_name(peer) == "rank " + std::to_string(peer));
        }
        CHECK(world.ranks[rank].healthy_peers().size() == kSize);
        CHECK(world.ranks[rank].peers_contacted() == 0);
    }
    // Rank 4 posts a receive for rank 1 (its first use of rank 1); rank 1 sends (its first use of
    // rank 4). Rank 4 also takes a message from rank 2, which it never posted to: the arrival
    // makes rank 2's state, and the receive posted later finds the message waiting.
    std::memset(world.memory[1].data(), 0x11, 64);
    std::memset(world.memory[2].data(), 0x22, 64);
    PendingWork from_one = world.ranks[4].post_receive(1, world.regions[4].slice(0, 64));
    CHECK(world.ranks[4].peers_contacted() == 1);
    REQUIRE(world.ranks[1].send(4, world.regions[1].slice(0, 64), 7).ok());
    REQUIRE(world.ranks[2].send(4, world.regions[2].slice(0, 64), 9).ok());
    const WorkResult one = from_one.wait();
    REQUIRE(one.ok());
    CHECK(one.completion().immediate == 7);
    CHECK(world.memory[4][0] == 0x11);
    CHECK(world.ranks[4].peers_contacted() == 2);  // rank 1, and rank 2 by its arrival
    const WorkResult two = world.ranks[4].receive(2, world.regions[4].slice(64, 64));
    REQUIRE(two.ok());
    CHECK(two.completion().immediate == 9);
    CHECK(world.memory[4][64] == 0x22);
    CHECK(world.ranks[1].peers_contacted() == 1);
    CHECK(world.ranks[2].peers_contacted() == 1);
    CHECK(world.ranks[0].peers_contacted() == 0);
    CHECK(world.ranks[4].counters(1).operations == 1);
    CHECK(world.ranks[4].counters(2).operations == 1);
    CHECK(world.ranks[4].counters(3).operations == 0);
    // A one-sided first use: rank 0 writes into rank 5 and reads it back.
    std::memset(world.memory[0].data(), 0x5a, 128);
    const RemoteMemoryRegion remote = world.ranks[0].remote_region(5, "buffer").region;
    REQUIRE(world.ranks[0].write(5, world.regions[0].slice(0, 128), remote.slice(1024, 128)).ok());
    REQUIRE(world.ranks[0].read(5, world.regions[0].slice(2048, 128), remote.slice(1024, 128)).ok());
    CHECK(std::memcmp(world.memory[0].data() + 2048, world.memory[0].data(), 128) == 0);
    CHECK(world.memory[5][1024] == 0x5a);
    CHECK(world.ranks[0].peers_contacted() == 1);
    CHECK(world.ranks[5].peers_contacted() == 0);  // a write is the writer's use, not the target's
    CHECK(world.ranks[0].queue_pair_count() == 3);  // 2 initiators + the target, as ever
}

TEST_CASE("DC: a receive outstanding from every peer at once: each peer's first post grows the slot table") {
    // The slots are the initiators' send depth, max_recv_wr, and one per peer contacted: with one
    // initiator of depth 1 and max_recv_wr 1 that is 2 before any peer is used, so receives for
    // all 11 peers posted at once need every peer's share, which its first post adds.
    constexpr std::uint32_t kSize = 12;
    World world = make_world(kSize, kSize * 64, MultiChannelMode::dynamically_connected, 1, {},
                             ChannelBuilder().deadline(std::chrono::seconds(5)).max_send_wr(1).max_recv_wr(1));
    std::vector<PeerTransfer> receives;
    for (std::uint32_t peer = 1; peer < kSize; ++peer) receives.push_back({peer, world.regions[0].slice(peer * 64, 64), {}});
    PendingMultiWork gathered = world.ranks[0].post_gather_receive(receives);
    CHECK(world.ranks[0].peers_contacted() == kSize - 1);
    for (std::uint32_t peer = 1; peer < kSize; ++peer) {
        std::memset(world.memory[peer].data(), static_cast<int>(peer), 64);
        REQUIRE(world.ranks[peer].send(0, world.regions[peer].slice(0, 64)).ok());
    }
    const MultiResult result = gathered.wait();
    REQUIRE_MESSAGE(result.ok(), result.message());
    for (std::uint32_t peer = 1; peer < kSize; ++peer) CHECK(world.memory[0][peer * 64] == peer);
}

TEST_CASE("DC: ranks on their own threads each contact every peer for the first time at once") {
    // Each rank's channel on a thread of its own (as ranks that are threads of one process):
    // every rank posts a receive for each peer and sends to each, so peer states are made by
    // first posts and by arrivals on all threads at the same time. Under TSan (the CI's TSan
    // build runs this folder) that is the check that first use shares nothing unguarded.
    constexpr std::uint32_t kSize = 6;
    constexpr std::uint32_t kBytes = 256;
    World world = make_world(kSize, 2 * kSize * kBytes, MultiChannelMode::dynamically_connected, 2);
    for (std::uint32_t rank = 0; rank < kSize; ++rank)
        for (std::uint32_t i = 0; i < kBytes; ++i) world.memory[rank][i] = static_cast<std::uint8_t>(rank * 41 + i);
    std::vector<std::string> failures(kSize);
    std::vector<std::thread> threads;
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        threads.emplace_back([&, rank] {
            MultiChannel& me = world.ranks[rank];
            std::vector<PeerTransfer> receives;
            std::vector<PeerTransfer> sends;
            for (std::uint32_t peer = 0; peer < kSize; ++peer) {
                if (peer == rank) continue;
                receives.push_back({peer, world.regions[rank].slice((kSize + peer) * kBytes, kBytes), {}});
                sends.push_back({peer, world.regions[rank].slice(0, kBytes), {}});
            }
            PendingMultiWork arrivals = me.post_gather_receive(receives);
            const MultiResult sent = me.scatter_send(sends, rank);
            const MultiResult arrived = arrivals.wait();
            if (!sent.ok()) failures[rank] = "send: " + sent.message();
            if (!arrived.ok()) failures[rank] += " receive: " + arrived.message();
        });
    }
    for (std::thread& thread : threads) thread.join();
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        CHECK_MESSAGE(failures[rank].empty(), "rank ", rank, ": ", failures[rank]);
        CHECK(world.ranks[rank].peers_contacted() == kSize - 1);
        for (std::uint32_t peer = 0; peer < kSize; ++peer) {
            if (peer == rank) continue;
            CHECK(std::memcmp(world.memory[rank].data() + (kSize + peer) * kBytes, world.memory[peer].data(), kBytes) == 0);
        }
    }
}

TEST_CASE("DC through the rendezvous: the ranks connect from the host's one table, nothing per peer made until used") {
    // Ranks as threads of one process, one host: one of them receives the table and its DC
    // directory and publishes them, the others map that copy; each reads a peer's row only when
    // it asks for its regions, and makes a peer's state only when it first uses it.
    constexpr std::uint32_t kSize = 5;
    std::vector<std::string> failures(kSize);
    std::vector<std::thread> threads;
    RendezvousServer server({"127.0.0.1", 0, kSize, "dc-view", "dc-view-token", std::chrono::milliseconds(20000)});
    server.start();
    const std::uint16_t port = server.port();
    for (std::uint32_t rank = 0; rank < kSize; ++rank) {
        threads.emplace_back([&, rank] {
            try {
                PreparedMultiChannel prepared = MultiChannelBuilder(default_channel())
                                                    .rank(rank)
                                                    .world_size(kSize)
                                                    .mode(MultiChannelMode::dynamically_connected)
                                                    .dc_initiators(2)
                                                    .build();
                std::vector<std::uint8_t> memory(4096, static_cast<std::uint8_t>(rank));
                MemoryRegion region = prepared.register_memory(memory.data(), memory.size());
                prepared.publish_region("buffer", region);
                MultiChannel channels = std::move(prepared).connect(
                    test::rendezvous_settings(port, rank, kSize, "dc-view", "dc-view-token", std::chrono::seconds(20)));
                if (channels.peers_contacted() != 0) throw Error("peers made by the handshake");
                const std::uint32_t next = (rank + 1) % kSize;
                const RemoteMemoryRegion remote = channels.remote_region(next, "buffer").region;
                if (!channels.write(next, region.slice(0, 64), remote.slice(1024 + rank * 64, 64)).ok())
                    throw Error("write to the next rank failed");
                if (!channels.barrier().ok()) throw Error("barrier failed");
                const std::uint32_t previous = (rank + kSize - 1) % kSize;
                if (memory[1024 + previous * 64] != previous) throw Error("the previous rank's bytes did not arrive");
                if (channels.peer_session(previous) == 0) throw Error("no session for the previous rank");
            } catch (const std::exception& error) {
                failures[rank] = error.what();
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    CHECK_NOTHROW(server.wait());
    for (std::uint32_t rank = 0; rank < kSize; ++rank) CHECK_MESSAGE(failures[rank].empty(), "rank ", rank, ": ", failures[rank]);
}
