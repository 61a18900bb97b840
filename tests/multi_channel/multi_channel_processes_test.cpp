// MultiChannel between forked processes: 2, 4 and 16 ranks run every operation at every level
// (all-to-all scatter_write verified byte for byte, gather_read, scatter_send and receives with
// immediates from every peer, multicast to a subset, atomics), and a rank killed mid-scatter
// fails only its own operations, within the deadline, named. On the host the ranks use the
// software device; inside the soft-RoCE VM (tests/vm) even ranks use rxe0 and odd ranks rxe1,
// so the traffic crosses the veth pair through the verbs provider.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "rdmachan/multi_channel.hpp"
#include "tests/multi_channel/shared_exchange.hpp"

using namespace rdmachan;

namespace {

constexpr std::chrono::milliseconds kExchangeDeadline{20000};
constexpr std::uint32_t kSlice = 4096;

std::uint8_t pattern(std::uint32_t from, std::uint32_t to, std::uint32_t index) {
    return static_cast<std::uint8_t>(from * 31 + to * 7 + index * 13 + 1);
}

// The layout of every rank's buffer: [outgoing: world slices][incoming: world slices][read back: world slices][counter]
struct Layout {
    std::uint32_t world;
    std::size_t outgoing(std::uint32_t peer) const { return static_cast<std::size_t>(peer) * kSlice; }
    std::size_t incoming(std::uint32_t peer) const { return static_cast<std::size_t>(world + peer) * kSlice; }
    std::size_t read_back(std::uint32_t peer) const { return static_cast<std::size_t>(2 * world + peer) * kSlice; }
    std::size_t counter() const { return static_cast<std::size_t>(3 * world) * kSlice; }
    std::size_t size() const { return counter() + 64; }
};

struct Rank {
    MultiChannel channels;
    std::vector<std::uint8_t> memory;
    MemoryRegion region;
    std::vector<RemoteMemoryRegion> remotes;  // by rank
};

// Build, publish, read everyone's endpoints and regions, connect, meet.
std::string device_for_rank(std::uint32_t rank) {
    const char* first = std::getenv("RDMACHAN_RXE_DEVICE");
    const char* second = std::getenv("RDMACHAN_RXE_PEER_DEVICE");
    if (first == nullptr || second == nullptr || *first == '\0' || *second == '\0') return "auto";
    return rank % 2 == 0 ? first : second;
}

// RDMACHAN_TEST_MODE=dc runs every case in DC mode (4 DC initiators per rank); the CTest
// multi_channel_processes_dc_test sets it.
MultiChannelMode test_mode() {
    const char* mode = std::getenv("RDMACHAN_TEST_MODE");
    return mode != nullptr && std::string(mode) == "dc" ? MultiChannelMode::dynamically_connected
                                                        : MultiChannelMode::reliable_connected;
}

// Every case runs with the channel's default transport timeout (8 tries of 537 ms) and default
// deadline (10 s): no case here tests either, and shorter ones made the cases depend on the
// scheduler. The 16-rank DC case failed under the soak when a DCT's device thread ran 700 ms
// late, past 4 tries of 67 ms; the killed-rank case had those 4 tries for every peer, not only
// for the dead one, and a survivor stopped for 1 s failed the others' shares to it.
// initiators: DC initiators per rank in DC mode (1: every peer shares the one initiator).
Rank join(multi_test::SharedTable& table, std::uint32_t rank, std::uint32_t world, std::uint32_t initiators = 4) {
    ChannelBuilder channel = ChannelBuilder().device(device_for_rank(rank)).max_send_wr(64).max_recv_wr(64);
    PreparedMultiChannel prepared =
        MultiChannelBuilder(channel).rank(rank).world_size(world).mode(test_mode()).dc_initiators(initiators).build();
    const Layout layout{world};
    std::vector<std::uint8_t> memory(layout.size(), 0);
    MemoryRegion region = prepared.register_memory(memory.data(), memory.size());
    prepared.publish_region("buffer", region);
    MultiChannel channels = std::move(prepared).handshake(
        multi_test::exchange_endpoints(table, rank, world, prepared.endpoint(), kExchangeDeadline));
    std::vector<RemoteMemoryRegion> remotes(world);
    for (std::uint32_t peer = 0; peer < world; ++peer) remotes[peer] = channels.remote_region(peer, "buffer").region;
    multi_test::barrier(table, world, kExchangeDeadline);
    return {std::move(channels), std::move(memory), std::move(region), std::move(remotes)};
}

#define EXPECT(condition, what)                                                              \
    do {                                                                                     \
        if (!(condition)) {                                                                  \
            std::fprintf(stderr, "rank %u: %s failed (%s:%d)\n", rank, what, __FILE__, __LINE__); \
            return 1;                                                                        \
        }                                                                                    \
    } while (0)

int every_operation(multi_test::SharedTable& table, std::uint32_t rank, std::uint32_t world) try {
    Rank self = join(table, rank, world);
    const Layout layout{world};
    std::uint8_t* bytes = self.memory.data();
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        for (std::uint32_t i = 0; i < kSlice; ++i) bytes[layout.outgoing(peer) + i] = pattern(rank, peer, i);
    }

    // Scoped: all-to-all scatter_write of per-peer slices (one doorbell per peer).
    std::vector<PeerTransfer> shares;
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        shares.push_back({peer, self.region.slice(layout.outgoing(peer), kSlice), self.remotes[peer].slice(layout.incoming(rank), kSlice)});
    }
    bool scatter_ok = false;
    self.channels.scope([&](MultiScope& scope) { scatter_ok = scope.post_scatter_write(shares).wait().ok(); });
    EXPECT(scatter_ok, "scoped scatter_write");
    multi_test::barrier(table, world, kExchangeDeadline);
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        for (std::uint32_t i = 0; i < kSlice; ++i) {
            EXPECT(bytes[layout.incoming(peer) + i] == pattern(peer, rank, i), "all-to-all bytes");
        }
    }

    // Unpolled: gather_read each peer's outgoing slice for this rank.
    std::vector<PeerTransfer> reads;
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        reads.push_back({peer, self.region.slice(layout.read_back(peer), kSlice), self.remotes[peer].slice(layout.outgoing(rank), kSlice)});
    }
    PendingMultiWork gathered = self.channels.post_gather_read(reads);
    EXPECT(gathered.wait().ok(), "unpolled gather_read");
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        EXPECT(std::memcmp(bytes + layout.read_back(peer), bytes + layout.incoming(peer), kSlice) == 0, "gather_read bytes");
    }
    multi_test::barrier(table, world, kExchangeDeadline);

    // Receives with immediates from every peer: receives posted first, then each rank sends to
    // every peer with an immediate naming both ends.
    std::vector<PeerTransfer> receives;
    for (std::uint32_t peer = 0; peer < world; ++peer) receives.push_back({peer, self.region.slice(layout.read_back(peer), kSlice), {}});
    PendingMultiWork incoming = self.channels.post_gather_receive(receives);
    multi_test::barrier(table, world, kExchangeDeadline);
    bool sends_ok = true;
    self.channels.scope([&](MultiScope& scope) {
        std::vector<ScopedWork> sends;
        for (std::uint32_t peer = 0; peer < world; ++peer) {
            sends.push_back(scope.post_send(peer, self.region.slice(layout.outgoing(peer), 256), rank * 1000 + peer));
        }
        for (ScopedWork& send : sends) {
            const WorkResult result = send.wait();
            if (!result.ok()) std::fprintf(stderr, "rank %u: %s\n", rank, result.error().message().c_str());
            sends_ok = sends_ok && result.ok();
        }
    });
    EXPECT(sends_ok, "scoped sends with immediate");
    MultiResult received = incoming.wait();
    EXPECT(received.ok(), "gather_receive");
    for (const PeerResult& entry : received.results()) {
        EXPECT(entry.result.completion().immediate.value_or(~0u) == entry.peer * 1000 + rank, "immediate names sender and receiver");
        EXPECT(entry.result.completion().bytes == 256, "received byte count");
        EXPECT(bytes[layout.read_back(entry.peer)] == pattern(entry.peer, rank, 0), "received bytes");
    }

    // Blocking multicast from rank 0 to the odd ranks; blocking scatter_send back from them.
    multi_test::barrier(table, world, kExchangeDeadline);
    std::vector<std::uint32_t> odd;
    for (std::uint32_t peer = 1; peer < world; peer += 2) odd.push_back(peer);
    if (rank == 0) {
        std::memcpy(bytes + layout.outgoing(0), "control message", 16);
        EXPECT(self.channels.multicast_send(odd, self.region.slice(layout.outgoing(0), 16), 77).ok(), "multicast_send");
        std::vector<PeerTransfer> replies;
        for (std::uint32_t peer : odd) replies.push_back({peer, self.region.slice(layout.incoming(peer), 64), {}});
        MultiResult answers = self.channels.gather_receive(replies);
        EXPECT(answers.ok(), "blocking gather_receive of replies");
        for (std::uint32_t peer : odd) EXPECT(bytes[layout.incoming(peer)] == static_cast<std::uint8_t>(peer), "reply byte");
    } else if (rank % 2 == 1) {
        WorkResult control = self.channels.receive(0, self.region.slice(layout.read_back(0), 64));
        EXPECT(control.ok() && control.completion().immediate.value_or(0) == 77, "multicast received");
        EXPECT(std::memcmp(bytes + layout.read_back(0), "control message", 16) == 0, "multicast bytes");
        bytes[layout.outgoing(1)] = static_cast<std::uint8_t>(rank);
        const PeerTransfer reply{0, self.region.slice(layout.outgoing(1), 64), {}};
        EXPECT(self.channels.scatter_send(std::span<const PeerTransfer>(&reply, 1)).ok(), "blocking scatter_send reply");
    }

    // Per-peer blocking write and read, unpolled scatter_send, scoped multicast: rank r writes
    // its rank into every peer's counter-adjacent byte, reads it back, then tells everyone.
    multi_test::barrier(table, world, kExchangeDeadline);
    {
        const std::size_t mark = layout.counter() + 32;
        bytes[layout.outgoing(0)] = static_cast<std::uint8_t>(rank + 1);
        const std::uint32_t next = (rank + 1) % world;
        EXPECT(self.channels.write(next, self.region.slice(layout.outgoing(0), 1), self.remotes[next].slice(mark, 1)).ok(),
               "per-peer blocking write");
        EXPECT(self.channels.read(next, self.region.slice(layout.counter() + 40, 1), self.remotes[next].slice(mark, 1)).ok(),
               "per-peer blocking read");
        EXPECT(bytes[layout.counter() + 40] == static_cast<std::uint8_t>(rank + 1), "read back what was written");
        std::vector<PeerTransfer> receives;
        for (std::uint32_t peer = 0; peer < world; ++peer) receives.push_back({peer, self.region.slice(layout.read_back(peer), 64), {}});
        bool received_ok = false;
        self.channels.scope([&](MultiScope& scope) {
            ScopedMultiWork incoming = scope.post_gather_receive(receives);
            multi_test::barrier(table, world, kExchangeDeadline);
            if (rank % 2 == 0) {
                std::vector<PeerTransfer> sends;
                for (std::uint32_t peer = 0; peer < world; ++peer) sends.push_back({peer, self.region.slice(layout.outgoing(0), 8), {}});
                PendingMultiWork sent = self.channels.post_scatter_send(sends, 300 + rank);
                if (!sent.wait().ok()) return;
            } else {
                std::vector<std::uint32_t> everyone;
                for (std::uint32_t peer = 0; peer < world; ++peer) everyone.push_back(peer);
                if (!scope.post_multicast_send(everyone, self.region.slice(layout.outgoing(0), 8), 300 + rank).wait().ok()) return;
            }
            const MultiResult got = incoming.wait();
            received_ok = got.ok();
            for (const PeerResult& entry : got.results()) {
                received_ok = received_ok && entry.result.completion().immediate.value_or(0) == 300 + entry.peer;
            }
        });
        EXPECT(received_ok, "unpolled scatter_send and scoped multicast to everyone");
    }

    // Blocking atomics: everyone adds its rank + 1 to rank 0's counter.
    multi_test::barrier(table, world, kExchangeDeadline);
    const std::uint32_t result_offset = static_cast<std::uint32_t>(layout.counter() + 8);
    EXPECT(self.channels.fetch_and_add(0, self.region.slice(result_offset, 8), self.remotes[0].slice(layout.counter(), 8), rank + 1).ok(),
           "fetch_and_add");
    multi_test::barrier(table, world, kExchangeDeadline);
    if (rank == 0) {
        std::uint64_t total = 0;
        std::memcpy(&total, bytes + layout.counter(), 8);
        EXPECT(total == static_cast<std::uint64_t>(world) * (world + 1) / 2, "atomic total");
    }
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        const PeerCounters counters = self.channels.counters(peer);
        EXPECT(counters.errors == 0 && counters.outstanding == 0 && counters.operations >= 3, "per-peer counters");
    }
    EXPECT(self.channels.healthy_peers().size() == world, "every peer healthy");
    multi_test::barrier(table, world, kExchangeDeadline);
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
    return 2;
}


int killed_mid_scatter(multi_test::SharedTable& table, std::uint32_t rank, std::uint32_t world) try {
    // In DC mode the victim shares the survivors' single initiator: its failure puts that
    // initiator in error, which must be recovered under the survivors' feet.
    // Under test: the killed rank's operations, and only its, fail, named, within the 10 s below,
    // failed by the transport (on the software device its closed connection), not by the wait's
    // deadline. Not under test: how long the survivors may take, which the transport timeout and
    // the deadline bound for the survivors too, since they hold for every peer of the channel.
    // Both are the defaults there (see join).
    // On a kernel RDMA stack (the soft-RoCE VM) nothing closes the dead peer's connection: the
    // retries fail it, 7 tries of 537 ms. rxe retries without end at retry_count 7, so the verbs
    // provider uses 6 there (transport/provider/verbs_provider.cpp); before that, the VM run of
    // cba15bd saw no completion for 10 s.
    Rank self = join(table, rank, world, 1);
    const Layout layout{world};
    const std::uint32_t victim = world - 1;
    if (rank == victim) raise(SIGKILL);  // gone while the others scatter to it
    std::vector<PeerTransfer> shares;
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        shares.push_back({peer, self.region.slice(layout.outgoing(peer), kSlice), self.remotes[peer].slice(layout.incoming(rank), kSlice)});
    }
    std::uint8_t* bytes = self.memory.data();
    for (std::uint32_t peer = 0; peer < world; ++peer) std::memset(bytes + layout.outgoing(peer), static_cast<int>(rank + 1), kSlice);
    const auto started = std::chrono::steady_clock::now();
    bool victim_failed = false;
    // Bounded by the time under test, not by a number of rounds: the victim dies when it next
    // runs, and until then writes to it succeed; with zero-hop writes 200 rounds took 11 ms, and
    // under load the victim had not run by then (the soak's round 4 at 7a564d6).
    for (int round = 0; !victim_failed && std::chrono::steady_clock::now() - started < std::chrono::seconds(10); ++round) {
        MultiResult result = self.channels.scatter_write(shares);
        for (const PeerResult& share : result.results()) {
            if (share.result.ok()) continue;
            const std::uint32_t peer = share.peer;
            EXPECT(peer == victim, "only the killed rank fails");
            EXPECT(result.message().find("rank " + std::to_string(victim)) != std::string::npos, "the error names the killed rank");
            EXPECT(!share.result.error().deadline_expired, "the transport, not the wait's deadline, fails the killed rank");
            if (!victim_failed) std::fprintf(stderr, "rank %u, round %d: %s\n", rank, round, result.message().c_str());
            victim_failed = true;
        }
    }
    EXPECT(victim_failed, "operations on the killed rank fail");
    EXPECT(std::chrono::steady_clock::now() - started < std::chrono::seconds(10), "failure within the deadline");
    EXPECT(!self.channels.healthy(victim), "the killed rank is reported unhealthy");
    // The survivors still work with each other.
    std::vector<PeerTransfer> survivors(shares.begin(), shares.end() - 1);
    EXPECT(self.channels.scatter_write(survivors).ok(), "survivors' scatter_write");
    multi_test::barrier(table, world - 1, kExchangeDeadline);
    // Every survivor's slice holds exactly its bytes; the killed rank (gone before it wrote)
    // left its slice untouched; nothing else was written.
    for (std::size_t index = 0; index < layout.size(); ++index) {
        std::uint8_t expected = 0;
        if (index < layout.incoming(0)) expected = static_cast<std::uint8_t>(rank + 1);
        for (std::uint32_t peer = 0; peer < victim; ++peer)
            if (index >= layout.incoming(peer) && index < layout.incoming(peer) + kSlice) expected = static_cast<std::uint8_t>(peer + 1);
        if (bytes[index] != expected) {
            std::fprintf(stderr, "rank %u: byte %zu is %u, expected %u\n", rank, index, bytes[index], expected);
            return 1;
        }
    }
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
    return 2;
}

}  // namespace

TEST_CASE("2 ranks: every operation at every level") { CHECK(multi_test::run_ranks(2, every_operation) == 0); }
TEST_CASE("4 ranks: every operation at every level") { CHECK(multi_test::run_ranks(4, every_operation) == 0); }
TEST_CASE("16 ranks: every operation at every level") { CHECK(multi_test::run_ranks(16, every_operation) == 0); }
TEST_CASE("4 ranks, one killed mid-scatter: only its operations fail, named, within the deadline") {
    CHECK(multi_test::run_ranks(4, killed_mid_scatter) == 1);  // the victim itself dies by SIGKILL
}
