// rdmachan::asio::AsyncMultiChannel: worlds of ranks inside this process (software device), all on
// one io_context.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "tests/asio/asio_test_support.hpp"

using namespace rdmachan;
namespace net = boost::asio;
using rdmachan::asio::AsyncMultiChannel;

namespace {

constexpr std::uint32_t kSlice = 256;

struct AsyncWorld {
    AsyncWorld(net::io_context& io, std::uint32_t size, MultiChannelMode mode = MultiChannelMode::reliable_connected) {
        for (MultiChannel& channel : test::make_world(size, mode)) {
            ranks.push_back(std::make_unique<AsyncMultiChannel>(io, std::move(channel)));
            regions.push_back(ranks.back()->channel().allocate_memory(std::max<std::size_t>(2 * size * kSlice, 4096)));
        }
    }
    std::vector<std::unique_ptr<AsyncMultiChannel>> ranks;
    std::vector<MemoryRegion> regions;
};

std::uint8_t pattern(std::uint32_t from, std::uint32_t to, std::uint32_t index) {
    return static_cast<std::uint8_t>(from * 29 + to * 11 + index);
}

}  // namespace

TEST_CASE("AsyncMultiChannel: every rank scatter_writes to all with its rank as immediate and gather_receives, as coroutines on one io_context") {
    constexpr std::uint32_t kRanks = 4;
    net::io_context io;
    AsyncWorld world(io, kRanks);
    std::uint32_t verified = 0;
    for (std::uint32_t rank = 0; rank < kRanks; ++rank) {
        net::co_spawn(
            io,
            [&, rank]() -> net::awaitable<void> {
                AsyncMultiChannel& channels = *world.ranks[rank];
                std::uint8_t* memory = static_cast<std::uint8_t*>(world.regions[rank].data());
                std::vector<PeerTransfer> receives, writes;
                for (std::uint32_t peer = 0; peer < kRanks; ++peer) {
                    for (std::uint32_t i = 0; i < kSlice; ++i) memory[peer * kSlice + i] = pattern(rank, peer, i);
                    receives.push_back({peer, world.regions[rank].slice(0, 0), {}});
                    writes.push_back({peer, world.regions[rank].slice(peer * kSlice, kSlice),
                                      world.regions[peer].remote((kRanks + rank) * kSlice, kSlice)});
                }
                PendingMultiWork incoming = channels.channel().post_gather_receive(receives);
                const MultiResult written = co_await channels.async_scatter_write(writes, rank, net::use_awaitable);
                REQUIRE(written.ok());
                const MultiResult arrived = co_await channels.async_wait(std::move(incoming), net::use_awaitable);
                REQUIRE(arrived.ok());
                for (const PeerResult& entry : arrived.results()) {
                    const std::uint32_t from = entry.result.completion().immediate.value_or(~0u);
                    CHECK(from == entry.peer);
                    for (std::uint32_t i = 0; i < kSlice; ++i) {
                        if (memory[(kRanks + from) * kSlice + i] != pattern(from, rank, i)) co_return;
                    }
                    ++verified;
                }
            },
            net::detached);
    }
    REQUIRE(test::run_until(io, [&] { return verified == kRanks * kRanks; }));
}

TEST_CASE("AsyncMultiChannel: per-peer operations, multicast_send into gather_receive, gather_read, and a callback per operation") {
    net::io_context io;
    AsyncWorld world(io, 3);
    AsyncMultiChannel& zero = *world.ranks[0];
    int completed = 0;
    auto expect_ok = [&](boost::system::error_code error, WorkResult result) {
        CHECK_FALSE(error);
        CHECK(result.ok());
        ++completed;
    };
    auto expect_all_ok = [&](boost::system::error_code error, MultiResult result) {
        CHECK_FALSE(error);
        CHECK(result.ok());
        ++completed;
    };
    std::memset(world.regions[0].data(), 0x33, 64);
    zero.async_write(1, world.regions[0].slice(0, 64), world.regions[1].remote(0, 64), expect_ok);
    zero.async_read(2, world.regions[0].slice(64, 64), world.regions[2].remote(0, 64), expect_ok);
    zero.async_fetch_and_add(1, world.regions[0].slice(128, 8), world.regions[1].remote(512, 8), 5, expect_ok);
    zero.async_compare_and_swap(2, world.regions[0].slice(136, 8), world.regions[2].remote(512, 8), 0, 9, expect_ok);
    REQUIRE(test::run_until(io, [&] { return completed == 4; }));
    CHECK(static_cast<std::uint8_t*>(world.regions[1].data())[63] == 0x33);
    CHECK(*reinterpret_cast<std::uint64_t*>(world.regions[1].slice(512, 8).bytes()) == 5);
    CHECK(*reinterpret_cast<std::uint64_t*>(world.regions[2].slice(512, 8).bytes()) == 9);

    // Rank 0 multicasts to 1 and 2, which receive asynchronously too.
    world.ranks[1]->async_receive(0, world.regions[1].slice(1024, 64), expect_ok);
    world.ranks[2]->async_gather_receive(std::vector<PeerTransfer>{{0, world.regions[2].slice(1024, 64), {}}}, expect_all_ok);
    const std::uint32_t peers[] = {1, 2};
    zero.async_multicast_send(peers, world.regions[0].slice(0, 16), 77u, expect_all_ok);
    REQUIRE(test::run_until(io, [&] { return completed == 7; }));

    // gather_read from both, and an empty gather (nothing posted) completes as wait() would.
    const std::vector<PeerTransfer> reads = {{1, world.regions[0].slice(2048, 64), world.regions[1].remote(0, 64)},
                                            {2, world.regions[0].slice(2112, 64), world.regions[2].remote(0, 64)}};
    zero.async_gather_read(reads, expect_all_ok);
    zero.async_gather_read(std::span<const PeerTransfer>(), expect_all_ok);
    REQUIRE(test::run_until(io, [&] { return completed == 9; }));
    CHECK(static_cast<std::uint8_t*>(world.regions[0].data())[2048 + 63] == 0x33);
}

TEST_CASE("AsyncMultiChannel: cancel() of a pending gather_receive gives a cancelled result per share, naming each peer") {
    net::io_context io;
    AsyncWorld world(io, 3);
    std::optional<MultiResult> result;
    boost::system::error_code error;
    const std::vector<PeerTransfer> receives = {{1, world.regions[0].slice(0, 64), {}}, {2, world.regions[0].slice(64, 64), {}}};
    world.ranks[0]->async_gather_receive(receives, [&](boost::system::error_code e, MultiResult r) {
        error = e;
        result.emplace(std::move(r));
    });
    io.run_for(std::chrono::milliseconds(10));
    world.ranks[0]->cancel();
    io.restart();
    io.run();
    REQUIRE(result.has_value());
    CHECK(error == net::error::operation_aborted);
    CHECK_FALSE(result->ok());
    CHECK(result->failed_peers() == std::vector<std::uint32_t>{1, 2});
    CHECK(result->results()[0].result.error().cancelled);
    CHECK(result->results()[1].result.error().peer == world.ranks[0]->channel().peer_name(2));
}

TEST_CASE("AsyncMultiChannel in DC mode: a send into an asynchronous receive, both ways") {
    net::io_context io;
    AsyncWorld world(io, 2, MultiChannelMode::dynamically_connected);
    int completed = 0;
    auto expect_ok = [&](boost::system::error_code error, WorkResult result) {
        CHECK_FALSE(error);
        CHECK(result.ok());
        ++completed;
    };
    world.ranks[1]->async_receive(0, world.regions[1].slice(0, 64), expect_ok);
    world.ranks[0]->async_receive(1, world.regions[0].slice(0, 64), expect_ok);
    world.ranks[0]->async_send(1, world.regions[0].slice(64, 32), expect_ok);
    world.ranks[1]->async_send(0, world.regions[1].slice(64, 32), expect_ok);
    REQUIRE(test::run_until(io, [&] { return completed == 4; }));
}
