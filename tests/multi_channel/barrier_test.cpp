// MultiChannel::barrier between forked processes, 1, 2, 3, 5 and 8 ranks: many consecutive
// barriers with skewed arrival (each rank sleeps a random time before each), at the three levels
// in turn. Before each barrier every rank writes its barrier count into its slot of every peer's
// memory; after it, every rank checks that every slot holds at least its own count, so a rank
// that left a barrier before everyone arrived is caught. A rank killed before arriving fails the
// others' barrier within the deadline, naming it. In one process, three ranks' unpolled barriers
// polled in turn: none ends before the last rank posted its own. A barrier posted while every
// operation slot holds an untaken result fails at once, saying so. RDMACHAN_TEST_MODE=dc runs
// every case in DC mode.
#include <doctest/doctest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "rdmachan/multi_channel.hpp"
#include "tests/multi_channel/shared_exchange.hpp"

using namespace rdmachan;

namespace {

constexpr std::chrono::milliseconds kExchangeDeadline{20000};

MultiChannelMode test_mode() {
    const char* mode = std::getenv("RDMACHAN_TEST_MODE");
    return mode != nullptr && std::string(mode) == "dc" ? MultiChannelMode::dynamically_connected
                                                        : MultiChannelMode::reliable_connected;
}

struct Rank {
    MultiChannel channels;
    std::vector<std::uint64_t> counts;  // counts[p]: the barrier count rank p last wrote here
    MemoryRegion region;
    std::vector<RemoteMemoryRegion> remotes;
};

Rank join(multi_test::SharedTable& table, std::uint32_t rank, std::uint32_t world,
          std::chrono::milliseconds deadline) {
    ChannelBuilder channel = ChannelBuilder().max_send_wr(64).max_recv_wr(64).deadline(deadline);
    PreparedMultiChannel prepared =
        MultiChannelBuilder(channel).rank(rank).world_size(world).mode(test_mode()).build();
    std::vector<std::uint64_t> counts(world + 1,
                                      0);  // the last word: the source of this rank's writes
    MemoryRegion region =
        prepared.register_memory(counts.data(), counts.size() * sizeof(std::uint64_t));
    prepared.publish_region("counts", region);
    MultiChannel channels = std::move(prepared).handshake(
        multi_test::exchange_endpoints(table, rank, world, prepared.endpoint(), kExchangeDeadline));
    std::vector<RemoteMemoryRegion> remotes(world);
    for (std::uint32_t peer = 0; peer < world; ++peer)
        remotes[peer] = channels.remote_region(peer, "counts").region;
    multi_test::barrier(table, world, kExchangeDeadline);
    return {std::move(channels), std::move(counts), std::move(region), std::move(remotes)};
}

#define EXPECT(condition, what)                                                                   \
    do {                                                                                          \
        if (!(condition)) {                                                                       \
            std::fprintf(stderr, "rank %u: %s failed (%s:%d)\n", rank, what, __FILE__, __LINE__); \
            return 1;                                                                             \
        }                                                                                         \
    } while (0)

constexpr std::uint64_t kBarriers = 45;  // 15 at each level

// One barrier at the level `index` picks: blocking; unpolled, polled to its end; scoped, waited
// for or (every other time) left for the scope to finish.
BarrierResult barrier_at_level(MultiChannel& channels, std::uint64_t index) {
    switch (index % 3) {
        case 0:
            return channels.barrier();
        case 1: {
            PendingBarrier pending = channels.post_barrier();
            while (true) {
                if (std::optional<BarrierResult> result = pending.poll()) return std::move(*result);
                if (!pending.pending()) return pending.wait();
            }
        }
        default: {
            BarrierResult result;
            channels.scope([&](MultiScope& scope) {
                ScopedBarrier barrier = scope.post_barrier();
                if (index % 2 == 0) result = barrier.wait();
            });
            return result;  // left to the scope: it threw if the barrier failed
        }
    }
}

int skewed_barriers(multi_test::SharedTable& table, std::uint32_t rank, std::uint32_t world) try {
    Rank self = join(table, rank, world, std::chrono::milliseconds(10000));
    EXPECT(self.channels.barrier_rounds() ==
               (world <= 1 ? 0u : static_cast<std::uint32_t>(std::ceil(std::log2(world)))),
           "ceil(log2 N) rounds");
    std::mt19937 random(rank * 7919 + world);
    const LocalSlice source =
        self.region.slice(world * sizeof(std::uint64_t), sizeof(std::uint64_t));
    for (std::uint64_t count = 1; count <= kBarriers; ++count) {
        // Skew: ranks arrive up to 3 ms apart, a different order each time.
        std::this_thread::sleep_for(std::chrono::microseconds(random() % 3000));
        std::memcpy(self.counts.data() + world, &count, sizeof count);
        for (std::uint32_t peer = 0; peer < world; ++peer) {
            const WorkResult written = self.channels.write(
                peer, source,
                self.remotes[peer].slice(rank * sizeof(std::uint64_t), sizeof(std::uint64_t)));
            EXPECT(written.ok(), "count written to every peer");
        }
        const BarrierResult result = barrier_at_level(self.channels, count);
        if (!result.ok())
            std::fprintf(stderr, "rank %u, barrier %llu: %s\n", rank,
                         static_cast<unsigned long long>(count), result.message().c_str());
        EXPECT(result.ok(), "barrier");
        for (std::uint32_t peer = 0; peer < world; ++peer) {
            const std::uint64_t seen =
                std::atomic_ref<std::uint64_t>(self.counts[peer]).load(std::memory_order_acquire);
            if (seen < count) {
                std::fprintf(
                    stderr,
                    "rank %u left barrier %llu before rank %u arrived (its count is %llu)\n", rank,
                    static_cast<unsigned long long>(count), peer,
                    static_cast<unsigned long long>(seen));
                return 1;
            }
        }
    }
    // One barrier at a time, and the scope's rule: an unwaited barrier counts as unpolled.
    PendingBarrier pending = self.channels.post_barrier();
    bool refused = false;
    try {
        (void)self.channels.barrier();
    } catch (const Error& error) {
        refused = std::string(error.what()).find("still in progress") != std::string::npos;
    }
    EXPECT(refused, "a second barrier while one is in progress is refused");
    EXPECT(pending.wait().ok(), "the pending barrier");
    bool counted = false;
    try {
        self.channels.manual_scope([&](MultiScope& scope) { (void)scope.post_barrier(); });
    } catch (const Error& error) {
        counted = std::string(error.what()).find("1 operation(s) were left unpolled") !=
                  std::string::npos;
    }
    EXPECT(counted, "manual_scope counts an unwaited barrier as unpolled");
    EXPECT(self.channels.barrier().ok(), "a barrier after the scope's");
    // The barrier used no receive: a send after it lands in the application's first receive.
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        const PeerCounters counters = self.channels.counters(peer);
        EXPECT(counters.errors == 0 && counters.outstanding == 0, "no errors, nothing outstanding");
    }
    multi_test::barrier(table, world, kExchangeDeadline);
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
    return 2;
}

// Receives posted before barriers keep their messages: each rank posts a receive from its
// successor, runs barriers, then the successor sends; the receive gets exactly that message.
int receives_untouched(multi_test::SharedTable& table, std::uint32_t rank,
                       std::uint32_t world) try {
    Rank self = join(table, rank, world, std::chrono::milliseconds(10000));
    const std::uint32_t next = (rank + 1) % world;
    const std::uint32_t previous = (rank + world - 1) % world;
    const LocalSlice into = self.region.slice(0, sizeof(std::uint64_t));
    PendingWork receive = self.channels.post_receive(next, into);
    for (int barrier = 0; barrier < 5; ++barrier) EXPECT(self.channels.barrier().ok(), "barrier");
    EXPECT(!receive.poll().has_value(), "no barrier message landed in the application's receive");
    EXPECT(self.channels.barrier().ok(), "barrier: everyone looked before anyone sends");
    EXPECT(self.channels.send(previous, self.region.slice(world * sizeof(std::uint64_t), 8), 4242)
               .ok(),
           "send");
    const WorkResult received = receive.wait();
    EXPECT(received.ok() && received.completion().immediate.value_or(0) == 4242,
           "the receive got the application's message");
    EXPECT(self.channels.barrier().ok(), "final barrier");
    // A returned barrier does not say the peers took their last write's completion (its ACK may
    // still be on the way from this rank's device): stay until every rank returned.
    multi_test::barrier(table, world, kExchangeDeadline);
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
    return 2;
}

constexpr std::chrono::milliseconds kShortDeadline{3000};
constexpr std::uint32_t kVictim = 2;

int killed_before_arriving(multi_test::SharedTable& table, std::uint32_t rank,
                           std::uint32_t world) try {
    Rank self = join(table, rank, world, kShortDeadline);
    EXPECT(self.channels.barrier().ok(), "a barrier with everyone");
    // The victim dies only once every rank returned from that barrier: killed the moment its own
    // returned, it could take with it the ACK of a peer's last write, failing that peer's barrier.
    multi_test::barrier(table, world, kExchangeDeadline);
    if (rank == kVictim) raise(SIGKILL);
    const auto started = std::chrono::steady_clock::now();
    const BarrierResult result = self.channels.barrier();
    const auto took = std::chrono::steady_clock::now() - started;
    std::fprintf(
        stderr, "rank %u after %lld ms: %s\n", rank,
        static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(took).count()),
        result.message().c_str());
    EXPECT(!result.ok(), "the barrier fails");
    const std::vector<std::uint32_t> failed = result.failed_peers();
    EXPECT(std::find(failed.begin(), failed.end(), kVictim) != failed.end(),
           "the error names the killed rank");
    EXPECT(result.message().find("rank " + std::to_string(kVictim)) != std::string::npos,
           "the message names it");
    if (test_mode() == MultiChannelMode::reliable_connected)
        EXPECT(failed.size() == 1, "only the killed rank is named");
    // The deadline, then a tenth of it for reading the peers' progress, and some slack.
    EXPECT(took < kShortDeadline + kShortDeadline / 10 + std::chrono::milliseconds(700),
           "fails within the deadline");
    // Survivors stay until all have read each other's progress.
    multi_test::barrier(table, world - 1, kExchangeDeadline);
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
    return 2;
}


}  // namespace

TEST_CASE("skewed barriers at three levels: nobody leaves early") {
    for (std::uint32_t world : {1u, 2u, 3u, 5u, 8u}) {
        CAPTURE(world);
        CHECK(multi_test::run_ranks(world, skewed_barriers) == 0);
    }
}

TEST_CASE("barriers take none of the application's receives") {
    CHECK(multi_test::run_ranks(3, receives_untouched) == 0);
}

TEST_CASE("a rank killed before arriving fails the others' barrier within the deadline, named") {
    CHECK(multi_test::run_ranks(5, killed_before_arriving) == 1);  // the victim itself dies by SIGKILL
}

TEST_CASE("library names are reserved") {
    PreparedMultiChannel prepared =
        MultiChannelBuilder().rank(0).world_size(1).mode(test_mode()).build();
    std::vector<std::uint8_t> memory(64);
    MemoryRegion region = prepared.register_memory(memory.data(), memory.size());
    CHECK_THROWS_WITH_AS(prepared.publish_region("rdmachan.barrier", region),
                         doctest::Contains("library's"), Error);
    CHECK(prepared.endpoint().regions.count(kBarrierRegionName) == 1);
}

TEST_CASE(
    "three ranks in one process: unpolled barriers advance only when polled, none ends early") {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    for (std::uint32_t rank = 0; rank < 3; ++rank) {
        prepared.push_back(MultiChannelBuilder(ChannelBuilder().deadline(std::chrono::seconds(5)))
                               .rank(rank)
                               .world_size(3)
                               .mode(test_mode())
                               .build());
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    std::vector<MultiChannel> ranks;
    for (std::uint32_t rank = 0; rank < 3; ++rank)
        ranks.push_back(std::move(prepared[rank]).handshake(table));
    for (int barrier = 0; barrier < 20; ++barrier) {
        std::vector<PendingBarrier> pending;
        pending.push_back(ranks[0].post_barrier());
        pending.push_back(ranks[1].post_barrier());
        // Rank 2 has not arrived: nobody may leave, however long they poll.
        for (int poll = 0; poll < 200; ++poll) {
            CHECK_FALSE(pending[0].poll().has_value());
            CHECK_FALSE(pending[1].poll().has_value());
        }
        pending.push_back(ranks[2].post_barrier());
        std::uint32_t left = 3;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
        while (left != 0 && std::chrono::steady_clock::now() < until) {
            for (PendingBarrier& handle : pending) {
                if (!handle.pending()) continue;
                if (std::optional<BarrierResult> result = handle.poll()) {
                    CHECK(result->ok());
                    --left;
                }
            }
        }
        CHECK(left == 0);
    }
}

TEST_CASE("a barrier posted while every operation slot holds an untaken result fails at once, naming why") {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<std::vector<std::uint8_t>> memory(2, std::vector<std::uint8_t>(64, 0x5a));
    std::vector<MemoryRegion> regions;
    std::vector<Endpoint> table;
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
        prepared.push_back(
            MultiChannelBuilder(
                ChannelBuilder().max_send_wr(2).max_recv_wr(2).deadline(std::chrono::seconds(5)))
                .rank(rank)
                .world_size(2)
                .mode(test_mode())
                .build());
        regions.push_back(prepared.back().register_memory(memory[rank].data(), 64));
        prepared.back().publish_region("target", regions.back());
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    std::vector<MultiChannel> ranks;
    for (std::uint32_t rank = 0; rank < 2; ++rank)
        ranks.push_back(std::move(prepared[rank]).handshake(table));
    const RemoteMemoryRegion into = ranks[0].remote_region(1, "target").region;
    // Writes whose handles are kept hold their slots, completed or not: far more than there are
    // slots, so the last ones are refused.
    std::vector<PendingWork> held;
    for (int write = 0; write < 64; ++write)
        held.push_back(ranks[0].post_write(1, regions[0].slice(0, 8), into.slice(0, 8)));
    const auto started = std::chrono::steady_clock::now();
    const BarrierResult result = ranks[0].barrier();
    CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds(2));
    CHECK_FALSE(result.ok());
    CHECK(result.message().find("operation slot") != std::string::npos);
    CHECK(result.message().find("rank 1") != std::string::npos);
    std::size_t landed = 0;
    for (PendingWork& work : held) {
        const WorkResult written = work.wait();
        if (written.ok()) {
            ++landed;
        } else {
            CHECK(std::string(written.error().message()).find("operation slot") != std::string::npos);
        }
    }
    CHECK(landed > 0);
    CHECK(landed < held.size());
}

TEST_CASE("after the ChannelEndpoint handshake a barrier says what it needs") {
    if (test_mode() == MultiChannelMode::dynamically_connected) return;  // DC has no such handshake
    std::vector<PreparedMultiChannel> prepared;
    std::vector<std::vector<ChannelEndpoint>> table;
    for (std::uint32_t rank = 0; rank < 2; ++rank) {
        prepared.push_back(MultiChannelBuilder().rank(rank).world_size(2).build());
        table.push_back(prepared.back().endpoints());
    }
    MultiChannel first = std::move(prepared[0]).handshake(table);
    CHECK_THROWS_WITH_AS((void)first.barrier(),
                         doctest::Contains("barriers need the Endpoint handshake"), Error);
}
