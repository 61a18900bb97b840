// Memory layouts through the public API: a strided column and a list of slices
// registered as zero-based regions, used as the local and the remote side of write, read, send
// and receive at the three levels (blocking, scoped, pending) and in batches, the remote side
// published as JSON; and the errors, each naming its field. Runs on the software device.
#include <doctest/doctest.h>

#include <cstring>
#include <initializer_list>
#include <utility>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/error.hpp"

using rdmachan::Access;
using rdmachan::Channel;
using rdmachan::ChannelBuilder;
using rdmachan::MemoryLayout;
using rdmachan::MemoryRegion;
using rdmachan::RemoteMemoryRegion;

namespace {

struct ConnectedPair {
    Channel a;
    Channel b;
};

ConnectedPair connect_pair() {
    ChannelBuilder builder = ChannelBuilder().deadline(std::chrono::seconds(5));
    rdmachan::PreparedChannel first = ChannelBuilder(builder.settings()).device("soft").build();
    rdmachan::PreparedChannel second = ChannelBuilder(builder.settings()).device("soft").build();
    const nlohmann::json first_endpoint = first.endpoint();
    const nlohmann::json second_endpoint = second.endpoint();
    Channel a = std::move(first).handshake(second_endpoint.get<rdmachan::ChannelEndpoint>());
    Channel b = std::move(second).handshake(first_endpoint.get<rdmachan::ChannelEndpoint>());
    return {std::move(a), std::move(b)};
}

constexpr std::uint32_t kRows = 32;
constexpr std::uint32_t kColumns = 16;  // 8-byte elements: rows of 128 bytes

std::uint64_t element(std::uint32_t row, std::uint32_t column, std::uint32_t seed) {
    return std::uint64_t{seed} << 32 | row << 16 | column;
}

}  // namespace

TEST_CASE("a remote strided column: one read gathers it, one write scatters it, at three levels") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint64_t> matrix(kRows * kColumns);
    for (std::uint32_t r = 0; r < kRows; ++r)
        for (std::uint32_t c = 0; c < kColumns; ++c) matrix[r * kColumns + c] = element(r, c, 7);
    MemoryRegion matrix_region = pair.b.register_memory(matrix.data(), matrix.size() * 8);
    const MemoryLayout column = MemoryLayout::strided(matrix_region, 5 * 8, 8, kColumns * 8, kRows);
    CHECK(column.length() == kRows * 8);
    MemoryRegion column_region = pair.b.register_layout(column);
    CHECK(column_region.zero_based());
    // Published like any remote region: JSON with addr 0, the layout's length and its key.
    const nlohmann::json published = column_region.remote();
    CHECK(published.at("addr") == 0);
    CHECK(published.at("length") == kRows * 8);
    const RemoteMemoryRegion remote = published.get<RemoteMemoryRegion>();

    std::vector<std::uint64_t> gathered(kRows, 0);
    MemoryRegion gathered_region = pair.a.register_memory(gathered.data(), gathered.size() * 8);
    // Blocking.
    REQUIRE(pair.a.read(gathered_region.all(), remote).ok());
    for (std::uint32_t r = 0; r < kRows; ++r) CHECK(gathered[r] == element(r, 5, 7));
    // Pending: write a new column.
    std::vector<std::uint64_t> fresh(kRows);
    for (std::uint32_t r = 0; r < kRows; ++r) fresh[r] = element(r, 5, 9);
    MemoryRegion fresh_region = pair.a.register_memory(fresh.data(), fresh.size() * 8);
    REQUIRE(pair.a.post_write(fresh_region.all(), remote).wait().ok());
    for (std::uint32_t r = 0; r < kRows; ++r) {
        CHECK(matrix[r * kColumns + 5] == element(r, 5, 9));
        CHECK(matrix[r * kColumns + 4] == element(r, 4, 7));  // neighbours untouched
        CHECK(matrix[r * kColumns + 6] == element(r, 6, 7));
    }
    // Scoped: read back half the column from its middle.
    std::fill(gathered.begin(), gathered.end(), 0);
    pair.a.scope([&](rdmachan::Scope& scope) {
        rdmachan::ScopedWork work = scope.post_read(gathered_region.slice(0, 16 * 8), remote.slice(8 * 8, 16 * 8));
        REQUIRE(work.wait().ok());
    });
    for (std::uint32_t r = 0; r < 16; ++r) CHECK(gathered[r] == element(r + 8, 5, 9));
}

TEST_CASE("a local list layout: send gathers from it, receive scatters into one, small sizes never inline") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(4096), b_memory(4096, 0);
    for (std::size_t i = 0; i < a_memory.size(); ++i) a_memory[i] = static_cast<std::uint8_t>(i * 5 + 1);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    // Header in one place, payload in another: 12 + 0 + 20 bytes (a zero-length slice too).
    MemoryRegion message = pair.a.register_layout(
        MemoryLayout::list({a_region.slice(100, 12), a_region.slice(0, 0), a_region.slice(2000, 20)}), Access::local_write);
    MemoryRegion landing = pair.b.register_layout(MemoryLayout::strided(b_region, 64, 4, 64, 8), Access::local_write);
    CHECK(landing.length() == 32);

    rdmachan::PendingWork receive = pair.b.post_receive(landing.all());
    REQUIRE(pair.a.send(message.all()).ok());  // 32 bytes: below max_inline_data, gathered by the NIC
    const rdmachan::WorkResult received = receive.wait();
    REQUIRE(received.ok());
    std::vector<std::uint8_t> sent(a_memory.begin() + 100, a_memory.begin() + 112);
    sent.insert(sent.end(), a_memory.begin() + 2000, a_memory.begin() + 2020);
    for (std::uint32_t block = 0; block < 8; ++block) {
        CHECK(std::memcmp(b_memory.data() + 64 + block * 64, sent.data() + block * 4, 4) == 0);
        CHECK(b_memory[64 + block * 64 + 4] == 0);
    }
    // A layout as the local side of a write into a plain remote region.
    std::vector<std::uint8_t> target(64, 0);
    MemoryRegion target_region = pair.b.register_memory(target.data(), target.size());
    REQUIRE(pair.a.write(message.slice(8, 16), target_region.remote(0, 16)).ok());
    CHECK(std::memcmp(target.data(), sent.data() + 8, 16) == 0);
}

TEST_CASE("layout errors name the field") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> memory(4096);
    MemoryRegion region = pair.a.register_memory(memory.data(), memory.size());
    CHECK_THROWS_WITH_AS(MemoryLayout::list({}), doctest::Contains("slices is empty"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(MemoryLayout::strided(region, 0, 0, 8, 4), doctest::Contains("block_length = 0"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(MemoryLayout::strided(region, 0, 8, 4, 4), doctest::Contains("stride = 4"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(MemoryLayout::strided(region, 0, 8, 70000, 2), doctest::Contains("stride = 70000"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(MemoryLayout::strided(region, 0, 8, 1024, 5), doctest::Contains("run past the region"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(MemoryLayout::strided(region, 0, 8, 16, 0), doctest::Contains("repeat_count = 0"), rdmachan::Error);
    // More slices than the queue pair's max_inline_data carries in one UMR work request.
    std::vector<rdmachan::LocalSlice> many(64, region.slice(0, 8));
    CHECK_THROWS_WITH_AS(pair.a.register_layout(MemoryLayout::list(many)), doctest::Contains("max_inline_data"),
                         rdmachan::Error);
    MemoryRegion layout = pair.a.register_layout(MemoryLayout::list({region.slice(0, 8)}));
    CHECK_THROWS_WITH_AS(MemoryLayout::list({layout.all()}), doctest::Contains("slices[0] is a slice of a layout"),
                         rdmachan::Error);
    // A remote layout read past its length is refused before posting, by the usual bounds check.
    CHECK_THROWS_AS(layout.remote(0, 16), rdmachan::Error);
    // A layout is deregistered with its last copy only; asking earlier says so and changes nothing.
    CHECK_THROWS_WITH_AS(layout.deregister(), doctest::Contains("a memory layout cannot be deregistered early"), rdmachan::Error);
    CHECK(layout.valid());
}

namespace {

// Byte i of a layout is byte map[i] of its region: a list's slices back to back, a strided
// layout's blocks stride bytes apart (computed from the description, apart from the library).
std::vector<std::uint32_t> list_map(std::initializer_list<std::pair<std::uint32_t, std::uint32_t>> slices) {
    std::vector<std::uint32_t> map;
    for (auto [offset, length] : slices)
        for (std::uint32_t i = 0; i < length; ++i) map.push_back(offset + i);
    return map;
}

std::vector<std::uint32_t> strided_map(std::uint32_t offset, std::uint32_t block, std::uint32_t stride, std::uint32_t repeat) {
    std::vector<std::uint32_t> map;
    for (std::uint32_t r = 0; r < repeat; ++r)
        for (std::uint32_t i = 0; i < block; ++i) map.push_back(offset + r * stride + i);
    return map;
}

// What an operation moves: `length` bytes from layout offset `from_offset` of one buffer to
// `to_offset` of the other, each through its map.
void model_move(std::vector<std::uint8_t>& to, const std::vector<std::uint32_t>& to_map, std::uint32_t to_offset,
                const std::vector<std::uint8_t>& from, const std::vector<std::uint32_t>& from_map, std::uint32_t from_offset,
                std::uint32_t length) {
    for (std::uint32_t i = 0; i < length; ++i) to.at(to_map.at(to_offset + i)) = from.at(from_map.at(from_offset + i));
}

std::size_t differing(const std::vector<std::uint8_t>& actual, const std::vector<std::uint8_t>& expected) {
    std::size_t count = 0;
    for (std::size_t i = 0; i < actual.size(); ++i) count += actual[i] != expected[i];
    return count;
}

}  // namespace

TEST_CASE("a remote list layout and a local strided one: write, read, send, receive and batches at three levels") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(4096), b_memory(4096);
    for (std::size_t i = 0; i < a_memory.size(); ++i) a_memory[i] = static_cast<std::uint8_t>(i * 5 + 1);
    for (std::size_t i = 0; i < b_memory.size(); ++i) b_memory[i] = static_cast<std::uint8_t>(i * 11 + 7);
    std::vector<std::uint8_t> a_expected = a_memory, b_expected = b_memory;
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    // a: 16 blocks of 4 bytes every 12; b: 20 + 0 + 30 + 14 bytes in three places.
    const MemoryRegion local = pair.a.register_layout(MemoryLayout::strided(a_region, 1000, 4, 12, 16));
    const std::vector<std::uint32_t> a_map = strided_map(1000, 4, 12, 16);
    const MemoryRegion list = pair.b.register_layout(
        MemoryLayout::list({b_region.slice(100, 20), b_region.slice(0, 0), b_region.slice(3000, 30), b_region.slice(500, 14)}));
    const std::vector<std::uint32_t> b_map = list_map({{100, 20}, {0, 0}, {3000, 30}, {500, 14}});
    REQUIRE(local.length() == 64);
    REQUIRE(list.length() == 64);
    const RemoteMemoryRegion remote = nlohmann::json(list.remote()).get<RemoteMemoryRegion>();
    // Changes a buffer by the CPU (and its model) so that each step moves bytes not seen before.
    auto touch = [](std::vector<std::uint8_t>& memory, std::vector<std::uint8_t>& expected, std::uint8_t seed) {
        for (std::size_t i = 0; i < memory.size(); ++i) expected[i] = memory[i] = static_cast<std::uint8_t>(memory[i] * 3 + seed);
    };
    auto check = [&] {
        CHECK(differing(a_memory, a_expected) == 0);
        CHECK(differing(b_memory, b_expected) == 0);
    };

    // Write at three levels.
    REQUIRE(pair.a.write(local.all(), remote).ok());
    model_move(b_expected, b_map, 0, a_expected, a_map, 0, 64);
    check();
    touch(a_memory, a_expected, 1);
    REQUIRE(pair.a.post_write(local.slice(4, 40), remote.slice(10, 40)).wait().ok());
    model_move(b_expected, b_map, 10, a_expected, a_map, 4, 40);
    touch(a_memory, a_expected, 2);
    pair.a.scope([&](rdmachan::Scope& scope) { REQUIRE(scope.post_write(local.slice(60, 4), remote.slice(0, 4)).wait().ok()); });
    model_move(b_expected, b_map, 0, a_expected, a_map, 60, 4);
    check();

    // Read at three levels.
    touch(b_memory, b_expected, 3);
    REQUIRE(pair.a.read(local.all(), remote).ok());
    model_move(a_expected, a_map, 0, b_expected, b_map, 0, 64);
    touch(b_memory, b_expected, 4);
    REQUIRE(pair.a.post_read(local.slice(8, 30), remote.slice(33, 30)).wait().ok());
    model_move(a_expected, a_map, 8, b_expected, b_map, 33, 30);
    touch(b_memory, b_expected, 5);
    pair.a.scope([&](rdmachan::Scope& scope) { REQUIRE(scope.post_read(local.slice(1, 62), remote.slice(2, 62)).wait().ok()); });
    model_move(a_expected, a_map, 1, b_expected, b_map, 2, 62);
    check();

    // Batches (16 bytes each way: small enough to go inline if it were contiguous, which a
    // layout's slice is not) at three levels.
    auto batch = [&] {
        return rdmachan::WorkBatch().write(local.slice(0, 16), remote.slice(48, 16)).read(local.slice(16, 16), remote.slice(0, 16));
    };
    auto model_batch = [&] {
        model_move(b_expected, b_map, 48, a_expected, a_map, 0, 16);
        model_move(a_expected, a_map, 16, b_expected, b_map, 0, 16);
    };
    touch(a_memory, a_expected, 6);
    touch(b_memory, b_expected, 7);
    REQUIRE(pair.a.execute(batch()).ok());
    model_batch();
    touch(a_memory, a_expected, 8);
    touch(b_memory, b_expected, 9);
    REQUIRE(pair.a.post_batch(batch()).wait().ok());
    model_batch();
    touch(a_memory, a_expected, 10);
    touch(b_memory, b_expected, 11);
    pair.a.scope([&](rdmachan::Scope& scope) { REQUIRE(scope.post_batch(batch()).wait().ok()); });
    model_batch();
    check();

    // Send from the strided layout into receives through the list layout: pending, then scoped
    // on both sides, then blocking receive.
    touch(a_memory, a_expected, 12);
    rdmachan::PendingWork receive = pair.b.post_receive(list.all());
    REQUIRE(pair.a.post_send(local.all()).wait().ok());
    REQUIRE(receive.wait().ok());
    model_move(b_expected, b_map, 0, a_expected, a_map, 0, 64);
    touch(a_memory, a_expected, 13);
    pair.b.scope([&](rdmachan::Scope& receiving) {
        rdmachan::ScopedWork scoped_receive = receiving.post_receive(list.slice(20, 44));
        pair.a.scope([&](rdmachan::Scope& sending) { REQUIRE(sending.post_send(local.slice(0, 44)).wait().ok()); });
        const rdmachan::WorkResult received = scoped_receive.wait();
        REQUIRE(received.ok());
        CHECK(received.completion().bytes == 44);
    });
    model_move(b_expected, b_map, 20, a_expected, a_map, 0, 44);
    touch(a_memory, a_expected, 14);
    rdmachan::PendingWork sending = pair.a.post_send(local.slice(32, 32));
    REQUIRE(pair.b.receive(list.slice(0, 32)).ok());
    REQUIRE(sending.wait().ok());
    model_move(b_expected, b_map, 0, a_expected, a_map, 32, 32);
    check();
}

TEST_CASE("a layout the device refuses: an error with its reason, and the channel still works") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> memory(4096, 0x5a), target(64, 0);
    // Registered for local access only: a layout over it may not grant remote rights.
    MemoryRegion local_only = pair.a.register_memory(memory.data(), memory.size(), Access::local_write);
    MemoryRegion target_region = pair.b.register_memory(target.data(), target.size());
    CHECK_THROWS_WITH_AS(pair.a.register_layout(MemoryLayout::list({local_only.slice(0, 8)}), Access::remote_all),
                         doctest::Contains("the device refused the layout: local protection error"), rdmachan::Error);
    // The refused UMR took only the layouts' own queue pair to ERR: the peer's still works, and
    // so does the next layout (on a new one).
    REQUIRE(pair.a.write(local_only.slice(0, 16), target_region.remote(0, 16)).ok());
    CHECK(target[15] == 0x5a);
    const MemoryRegion layout = pair.a.register_layout(MemoryLayout::list({local_only.slice(100, 8), local_only.slice(0, 8)}),
                                                       Access::local_write);
    REQUIRE(pair.a.write(layout.all(), target_region.remote(16, 16)).ok());
    CHECK(target[31] == 0x5a);
}
