// Channel through its public API: every operation at every level, batches, immediates, scopes
// that throw, manual scopes, deadlines, bounds and key errors. On the host it runs on the
// software device; inside the soft-RoCE VM (tests/vm) the same cases run over the generic verbs
// path between rxe0 and rxe1 (the harness sets RDMACHAN_RXE_DEVICE / RDMACHAN_RXE_PEER_DEVICE).
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <optional>
#include <stdexcept>
#include <future>
#include <thread>

#include "rdmachan/channel.hpp"
#include "tests/sanitizer_build.hpp"

using rdmachan::Access;
using rdmachan::Channel;
using rdmachan::ChannelBuilder;
using rdmachan::MemoryRegion;
using rdmachan::RemoteMemoryRegion;
using rdmachan::WorkResult;

namespace {

std::string device_for(const char* variable) {
    const char* value = std::getenv(variable);
    return value != nullptr && *value != '\0' ? value : "auto";
}
// The two sides' devices: two verbs devices in the VM, the software device elsewhere.
std::string first_device() { return device_for("RDMACHAN_RXE_DEVICE"); }
std::string second_device() { return device_for("RDMACHAN_RXE_PEER_DEVICE"); }
bool on_kernel_rdma_stack() { return first_device() != "auto"; }

struct ConnectedPair {
    Channel a;
    Channel b;
};

ConnectedPair connect_pair(ChannelBuilder builder = ChannelBuilder().deadline(std::chrono::seconds(5))) {
    rdmachan::PreparedChannel first = ChannelBuilder(builder.settings()).device(first_device()).build();
    rdmachan::PreparedChannel second = ChannelBuilder(builder.settings()).device(second_device()).build();
    // Endpoints cross as JSON, as they would between processes.
    const nlohmann::json first_endpoint = first.endpoint();
    const nlohmann::json second_endpoint = second.endpoint();
    Channel a = std::move(first).handshake(second_endpoint.get<rdmachan::ChannelEndpoint>());
    Channel b = std::move(second).handshake(first_endpoint.get<rdmachan::ChannelEndpoint>());
    return {std::move(a), std::move(b)};
}

void fill(std::vector<std::uint8_t>& bytes, std::uint8_t seed) {
    for (std::size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<std::uint8_t>(seed + i * 3);
}

}  // namespace

TEST_CASE("blocking: send/receive with immediate, write, write with immediate, read, atomics") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(1 << 16), b_memory(1 << 16);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    const RemoteMemoryRegion b_remote = b_region.remote();

    // send + receive (the receive is posted unpolled first, then waited for)
    fill(a_memory, 1);
    rdmachan::PendingWork receive = pair.b.post_receive(b_region.slice(0, 4096));
    WorkResult sent = pair.a.send(a_region.slice(0, 1000), 0x1234);
    REQUIRE(sent.ok());
    WorkResult received = receive.wait();
    REQUIRE(received.ok());
    CHECK(received.completion().bytes == 1000);
    REQUIRE(received.completion().immediate.has_value());
    CHECK(*received.completion().immediate == 0x1234);
    CHECK(std::memcmp(b_memory.data(), a_memory.data(), 1000) == 0);

    // write, then read it back into another place
    fill(a_memory, 7);
    REQUIRE(pair.a.write(a_region.slice(0, 8192), b_remote.slice(8192, 8192)).ok());
    CHECK(std::memcmp(b_memory.data() + 8192, a_memory.data(), 8192) == 0);
    WorkResult read = pair.a.read(a_region.slice(32768, 8192), b_remote.slice(8192, 8192));
    REQUIRE(read.ok());
    CHECK(read.completion().bytes == 8192);
    CHECK(std::memcmp(a_memory.data() + 32768, a_memory.data(), 8192) == 0);

    // write with immediate consumes a receive on the other side and carries the immediate
    rdmachan::PendingWork notification = pair.b.post_receive(b_region.slice(0, 16));
    REQUIRE(pair.a.write(a_region.slice(0, 64), b_remote.slice(100, 64), 99u).ok());
    WorkResult noticed = notification.wait();
    REQUIRE(noticed.ok());
    CHECK(noticed.completion().immediate.value_or(0) == 99u);
    CHECK(noticed.completion().bytes == 64);

    // atomics on an 8-byte word of b
    std::uint64_t start = 10;
    std::memcpy(b_memory.data() + 40960, &start, 8);
    REQUIRE(pair.a.fetch_and_add(a_region.slice(0, 8), b_remote.slice(40960, 8), 5).ok());
    std::uint64_t value = 0;
    std::memcpy(&value, a_memory.data(), 8);
    CHECK(value == 10);
    REQUIRE(pair.a.compare_and_swap(a_region.slice(0, 8), b_remote.slice(40960, 8), 15, 100).ok());
    std::memcpy(&value, b_memory.data() + 40960, 8);
    CHECK(value == 100);
    CHECK(pair.a.healthy());
    CHECK(pair.b.healthy());
}

TEST_CASE("unpolled handles complete in any order") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(1 << 16), b_memory(1 << 16);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    fill(a_memory, 3);
    std::vector<rdmachan::PendingWork> writes;
    for (std::uint64_t i = 0; i < 16; ++i) writes.push_back(pair.a.post_write(a_region.slice(i * 1024, 1024), b_region.remote(i * 1024, 1024)));
    for (std::size_t i = writes.size(); i-- > 0;) REQUIRE(writes[i].wait().ok());
    CHECK(std::memcmp(a_memory.data(), b_memory.data(), 16 * 1024) == 0);
    CHECK_THROWS_WITH_AS(writes[0].wait(), doctest::Contains("no pending work"), rdmachan::Error);
}

TEST_CASE("handles outlive their channel: they still complete, and the engine goes with the last of them") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(3 * 4096), b_memory(3 * 4096);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    fill(a_memory, 11);
    rdmachan::PendingWork waited;
    rdmachan::PendingWork polled;
    rdmachan::PendingWork dropped;
    {
        // The channel goes first; the handles hold its engine (a plain count, no shared_ptr).
        Channel channel = std::move(pair.a);
        waited = channel.post_write(a_region.slice(0, 4096), b_region.remote(0, 4096));
        polled = channel.post_write(a_region.slice(4096, 4096), b_region.remote(4096, 4096));
        dropped = channel.post_write(a_region.slice(8192, 4096), b_region.remote(8192, 4096));
    }
    std::optional<WorkResult> result;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (!result.has_value() && std::chrono::steady_clock::now() < until) result = polled.poll();
    REQUIRE(result.has_value());
    CHECK(result->ok());
    CHECK_FALSE(polled.pending());
    const WorkResult waited_result = waited.wait();
    CHECK(waited_result.ok());
    CHECK(waited_result.completion().bytes == 4096);
    dropped = rdmachan::PendingWork();  // the last handle waits, then the engine is deleted
    CHECK(std::memcmp(a_memory.data(), b_memory.data(), a_memory.size()) == 0);
}

TEST_CASE("scoped polling: handles in any order, the rest drained at the end") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(1 << 16), b_memory(1 << 16);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    fill(a_memory, 5);
    pair.a.scope([&](rdmachan::Scope& scope) {
        rdmachan::ScopedWork first = scope.post_write(a_region.slice(0, 100), b_region.remote(0, 100));
        rdmachan::ScopedWork second = scope.post_write(a_region.slice(100, 100), b_region.remote(100, 100));
        scope.post_write(a_region.slice(200, 100), b_region.remote(200, 100));  // never waited: drained
        CHECK(second.wait().ok());
        CHECK(first.wait().ok());
        CHECK_THROWS_AS(first.wait(), rdmachan::Error);
    });
    CHECK(std::memcmp(a_memory.data(), b_memory.data(), 300) == 0);
}

TEST_CASE("a scope that throws still drains its work, and the exception comes through") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(4096), b_memory(4096);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    fill(a_memory, 9);
    CHECK_THROWS_WITH_AS(pair.a.scope([&](rdmachan::Scope& scope) {
        scope.post_write(a_region.slice(0, 4096), b_region.remote());
        throw std::runtime_error("user code failed");
    }),
                         "user code failed", std::runtime_error);
    // The write was drained before the exception left the scope: the bytes are there and the
    // channel is still usable.
    CHECK(std::memcmp(a_memory.data(), b_memory.data(), 4096) == 0);
    CHECK(pair.a.write(a_region.slice(0, 8), b_region.remote(0, 8)).ok());
}

TEST_CASE("manual_scope reports work left unpolled") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(4096), b_memory(4096);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    CHECK_THROWS_WITH_AS(pair.a.manual_scope([&](rdmachan::Scope& scope) {
        scope.post_write(a_region.slice(0, 8), b_region.remote(0, 8));
        scope.post_write(a_region.slice(8, 8), b_region.remote(8, 8));
    }),
                         doctest::Contains("2 operation(s)"), rdmachan::Error);
    // Polling everything is fine.
    CHECK_NOTHROW(pair.a.manual_scope([&](rdmachan::Scope& scope) {
        CHECK(scope.post_write(a_region.slice(0, 8), b_region.remote(0, 8)).wait().ok());
    }));
}

TEST_CASE("a deadline that passes moves the QP to ERR and flushes, and the error says so") {
    ConnectedPair pair = connect_pair(ChannelBuilder().deadline(std::chrono::milliseconds(200)));
    std::vector<std::uint8_t> memory(4096);
    MemoryRegion region = pair.a.register_memory(memory.data(), memory.size());
    // Nobody sends: the receive can only complete by being flushed.
    CHECK_THROWS_WITH_AS(pair.a.scope([&](rdmachan::Scope& scope) { scope.post_receive(region.slice(0, 64)); }),
                         doctest::Contains("moved to ERR"), rdmachan::Error);
    CHECK_FALSE(pair.a.healthy());
    // Everything after that fails with a flush error naming the operation and the peer.
    WorkResult after = pair.a.send(region.slice(0, 8));
    REQUIRE_FALSE(after.ok());
    CHECK(after.error().status == 5);
    CHECK(after.error().message().find("send with") != std::string::npos);
    CHECK(after.error().message().find("work request flushed") != std::string::npos);
}

TEST_CASE("a bad rkey: remote access error naming the operation and peer, target unchanged") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> a_memory(4096, 0x77), b_memory(4096, 0);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    RemoteMemoryRegion wrong = b_region.remote();
    wrong.rkey ^= 0x5500;
    WorkResult result = pair.a.write(a_region.slice(0, 4096), wrong);
    REQUIRE_FALSE(result.ok());
    CHECK(result.error().status == 10);
    CHECK(result.error().message().find("RDMA write with") != std::string::npos);
    CHECK(result.error().message().find("remote access error") != std::string::npos);
    CHECK(result.error().message().find(pair.a.peer()) != std::string::npos);
    CHECK(std::all_of(b_memory.begin(), b_memory.end(), [](std::uint8_t byte) { return byte == 0; }));
}

TEST_CASE("deregister(): every copy's keys stop working at once; allocated memory stays until the last copy") {
    auto zero = [](const std::uint8_t* bytes, std::size_t length) {
        return std::all_of(bytes, bytes + length, [](std::uint8_t byte) { return byte == 0; });
    };
    SUBCASE("a peer's write with the old rkey is refused, and the memory is untouched") {
        ConnectedPair pair = connect_pair();
        MemoryRegion source = pair.a.allocate_memory(8192);
        MemoryRegion target = pair.b.allocate_memory(8192);
        MemoryRegion copy = target;
        std::memset(source.data(), 0x3c, 8192);
        const RemoteMemoryRegion remote = target.remote();
        REQUIRE(pair.a.write(source.slice(0, 4096), remote.slice(0, 4096)).ok());

        target.deregister();
        CHECK_FALSE(target.valid());
        CHECK_FALSE(copy.valid());  // every copy
        CHECK_THROWS_WITH_AS(copy.slice(0, 64), doctest::Contains("not registered"), rdmachan::Error);
        CHECK_THROWS_WITH_AS(copy.remote(), doctest::Contains("not registered"), rdmachan::Error);
        CHECK_NOTHROW(copy.deregister());  // once is enough, from any copy
        // The memory is still the region's: what the write brought, and writable here.
        auto* bytes = static_cast<std::uint8_t*>(target.data());
        CHECK(bytes[0] == 0x3c);
        CHECK(bytes[4095] == 0x3c);
        CHECK(zero(bytes + 4096, 4096));
        WorkResult refused = pair.a.write(source.slice(0, 4096), remote.slice(4096, 4096));
        REQUIRE_FALSE(refused.ok());
        CHECK(refused.error().message().find("remote access error") != std::string::npos);
        CHECK(zero(bytes + 4096, 4096));
        bytes[8191] = 1;
    }
    SUBCASE("a local slice taken before fails at the device (a local error)") {
        ConnectedPair pair = connect_pair();
        MemoryRegion local = pair.a.allocate_memory(4096);
        MemoryRegion target = pair.b.allocate_memory(4096);
        const rdmachan::LocalSlice taken_before = local.slice(0, 4096);
        local.deregister();
        WorkResult refused = pair.a.write(taken_before, target.remote());
        REQUIRE_FALSE(refused.ok());
        // A ConnectX, and so the software device, report a local protection error; soft-RoCE (the
        // VM run) checks the key elsewhere and reports a local QP operation error.
        const std::string& message = refused.error().message();
        CHECK((message.find("local protection error") != std::string::npos ||
               (on_kernel_rdma_stack() && message.find("local QP operation error") != std::string::npos)));
        CHECK(zero(static_cast<const std::uint8_t*>(target.data()), 4096));
    }
    SUBCASE("registered memory, then a region never registered") {
        ConnectedPair pair = connect_pair();
        std::vector<std::uint8_t> memory(4096);
        MemoryRegion region = pair.a.register_memory(memory.data(), memory.size());
        region.deregister();
        CHECK_FALSE(region.valid());
        MemoryRegion never;
        CHECK_THROWS_WITH_AS(never.deregister(), doctest::Contains("never registered"), rdmachan::Error);
    }
}

TEST_CASE("slices outside their region are rejected before anything is posted") {
    ConnectedPair pair = connect_pair();
    std::vector<std::uint8_t> memory(4096);
    MemoryRegion region = pair.a.register_memory(memory.data(), memory.size());
    CHECK_THROWS_WITH_AS(region.slice(4000, 100), doctest::Contains("outside the registered region"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(region.remote().slice(1, 4096), doctest::Contains("outside the region"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(pair.a.post_write(region.slice(0, 4096), region.remote(0, 16)), doctest::Contains("do not fit"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(pair.a.fetch_and_add(region.slice(0, 4), region.remote(0, 8), 1), doctest::Contains("not 8"),
                         rdmachan::Error);
}

TEST_CASE("loopback: a channel connected to its own endpoint") {
    rdmachan::PreparedChannel prepared = ChannelBuilder().device(first_device()).build();
    const rdmachan::ChannelEndpoint self = prepared.endpoint();
    Channel channel = std::move(prepared).handshake(self);
    std::vector<std::uint8_t> memory(8192);
    fill(memory, 1);
    MemoryRegion region = channel.register_memory(memory.data(), memory.size());
    REQUIRE(channel.write(region.slice(0, 4096), region.remote(4096, 4096)).ok());
    CHECK(std::memcmp(memory.data(), memory.data() + 4096, 4096) == 0);
}

TEST_CASE("builder settings are range-checked and endpoints are validated by field") {
    CHECK_THROWS_WITH_AS(ChannelBuilder().mtu(1500), doctest::Contains("1500 bytes"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(ChannelBuilder().backoff(1, 1, std::chrono::microseconds(20000)), doctest::Contains("sleep 20000 us"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(ChannelBuilder().retry_count(8), doctest::Contains("retry_count: 8"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(ChannelBuilder().psn(1u << 24), doctest::Contains("psn"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(ChannelBuilder().max_send_sge(31), doctest::Contains("max_send_sge"), rdmachan::Error);
    // A device no machine has (a ConnectX host, or the emulated one, has an mlx5_0).
    CHECK_THROWS_WITH_AS(ChannelBuilder().device("mlx5_no_such_device").build(), doctest::Contains("mlx5_no_such_device"),
                         rdmachan::Error);
    nlohmann::json endpoint = ChannelBuilder().psn(77).build().endpoint();
    CHECK(endpoint.at("psn") == 77);
    nlohmann::json bad = endpoint;
    bad["qpn"] = 1u << 24;
    CHECK_THROWS_WITH_AS(bad.get<rdmachan::ChannelEndpoint>(), doctest::Contains("'qpn'"), rdmachan::Error);
    bad = endpoint;
    bad["gid"] = "zz";
    CHECK_THROWS_WITH_AS(bad.get<rdmachan::ChannelEndpoint>(), doctest::Contains("'gid'"), rdmachan::Error);
    bad = endpoint;
    bad["mtu"] = -1;
    CHECK_THROWS_WITH_AS(bad.get<rdmachan::ChannelEndpoint>(), doctest::Contains("'mtu'"), rdmachan::Error);
    bad = endpoint;
    bad.erase("lid");
    CHECK_THROWS_WITH_AS(bad.get<rdmachan::ChannelEndpoint>(), doctest::Contains("'lid' is missing"), rdmachan::Error);
    // Two channels built without a PSN get different random ones (24 bits).
    CHECK(ChannelBuilder().build().endpoint().psn <= 0xffffff);
}

// The kernel's soft-RoCE in a VM is far slower than the software device: fewer there. Under a
// sanitizer every write costs ten to thirty times more (this case alone took 46 s of the TSan
// run): 128,000 writes still wrap the 64-entry send queue 2,000 times.
namespace {
int small_write_count() {
    if (on_kernel_rdma_stack()) return 64 * 1000;
    if (rdmachan::test::kSanitizerBuild) return 128000;
    return 1000000;
}
}  // namespace

TEST_CASE("a million small writes through scoped posting (fewer under a sanitizer or on a kernel stack): no send-queue overflow") {
    ConnectedPair pair = connect_pair(ChannelBuilder().max_send_wr(64).deadline(std::chrono::seconds(10)));
    std::vector<std::uint8_t> a_memory(64 * 8), b_memory(64 * 8);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    const int kWrites = small_write_count();
    constexpr int kBatch = 64;
    int failures = 0;
    pair.a.scope([&](rdmachan::Scope& scope) {
        rdmachan::ScopedWork batch[kBatch];
        for (int posted = 0; posted < kWrites; posted += kBatch) {
            for (int i = 0; i < kBatch; ++i) {
                std::uint64_t value = static_cast<std::uint64_t>(posted + i);
                std::memcpy(a_memory.data() + i * 8, &value, 8);
                batch[i] = scope.post_write(a_region.slice(i * 8, 8), b_region.remote(i * 8, 8));
            }
            for (int i = kBatch; i-- > 0;) failures += !batch[i].wait().ok();
        }
    });
    CHECK(failures == 0);
    std::uint64_t last = 0;
    std::memcpy(&last, b_memory.data() + 63 * 8, 8);
    CHECK(last == kWrites - 1);
}

TEST_CASE("threading contract: channels on different threads share the process's device without locks") {
    // Each thread owns its own pair of channels; all four share one software device.
    auto worker = [](int seed, int* failures) {
        ConnectedPair pair = connect_pair();
        std::vector<std::uint8_t> a_memory(4096), b_memory(4096);
        MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
        MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
        for (int i = 0; i < 2000; ++i) {
            a_memory[i % 4096] = static_cast<std::uint8_t>(seed + i);
            if (!pair.a.write(a_region.slice(0, 4096), b_region.remote()).ok()) ++*failures;
            if (b_memory[i % 4096] != static_cast<std::uint8_t>(seed + i)) ++*failures;
        }
    };
    int failures[2] = {0, 0};
    std::thread first(worker, 1, &failures[0]);
    std::thread second(worker, 100, &failures[1]);
    first.join();
    second.join();
    CHECK(failures[0] == 0);
    CHECK(failures[1] == 0);
}

TEST_CASE("waiting that never spins (sleeps at once) still completes everything") {
    ConnectedPair pair = connect_pair(ChannelBuilder().backoff(0, 0, std::chrono::microseconds(200)).deadline(std::chrono::seconds(5)));
    std::vector<std::uint8_t> a_memory(4096, 3), b_memory(4096, 0);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    for (int i = 0; i < 50; ++i) REQUIRE(pair.a.write(a_region.slice(0, 4096), b_region.remote()).ok());
    CHECK(b_memory[4095] == 3);
}

TEST_CASE("a batch posts under one doorbell, completes once, and its bytes arrive") {
    ConnectedPair pair = connect_pair(ChannelBuilder().max_send_wr(64).deadline(std::chrono::seconds(5)));
    std::vector<std::uint8_t> a_memory(64 * 1024), b_memory(64 * 1024), back(64 * 1024);
    fill(a_memory, 3);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion back_region = pair.a.register_memory(back.data(), back.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    // 32 writes of 2 KiB (inline for none: max_inline_data is 64) and 16 of 32 bytes (inline).
    rdmachan::WorkBatch writes;
    for (std::uint32_t i = 0; i < 32; ++i) writes.write(a_region.slice(i * 2048, 2048), b_region.remote(i * 2048, 2048));
    REQUIRE(pair.a.execute(writes).ok());
    CHECK(std::memcmp(a_memory.data(), b_memory.data(), 64 * 1024) == 0);
    rdmachan::WorkBatch small;
    for (std::uint32_t i = 0; i < 16; ++i) small.write(a_region.slice(i * 32 + 1, 32), b_region.remote(i * 32, 32));
    WorkResult small_result = pair.a.execute(small);
    REQUIRE(small_result.ok());
    CHECK(small_result.completion().bytes == 16 * 32);
    CHECK(std::memcmp(a_memory.data() + 1, b_memory.data(), 16 * 32) == 0);
    // Read everything back in one batch, in a scope.
    rdmachan::WorkBatch reads;
    for (std::uint32_t i = 0; i < 16; ++i) reads.read(back_region.slice(i * 4096, 4096), b_region.remote(i * 4096, 4096));
    pair.a.scope([&](rdmachan::Scope& scope) { CHECK(scope.post_batch(reads).wait().ok()); });
    CHECK(std::memcmp(back.data(), b_memory.data(), back.size()) == 0);
    const rdmachan::PeerCounters counters = pair.a.counters();
    CHECK(counters.operations == 32 + 16 + 16);
    CHECK(counters.bytes == 64 * 1024 + 16 * 32 + 64 * 1024);
    CHECK(counters.errors == 0);
    CHECK(counters.outstanding == 0);
}

TEST_CASE("a batch posted again reuses its conversion only while it is unchanged") {
    // The engine keeps the work requests of the last batch it converted, by WorkBatch::version():
    // every change, a clear, a move and a new batch (even at the same address) must be posted
    // as it is now.
    ConnectedPair pair = connect_pair(ChannelBuilder().max_send_wr(64).deadline(std::chrono::seconds(5)));
    std::vector<std::uint8_t> a_memory(8 * 1024), b_memory(8 * 1024);
    fill(a_memory, 5);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    auto b_zone = [&](std::uint32_t offset, std::uint32_t length) {
        return std::vector<std::uint8_t>(b_memory.begin() + offset, b_memory.begin() + offset + length);
    };
    auto a_zone = [&](std::uint32_t offset, std::uint32_t length) {
        return std::vector<std::uint8_t>(a_memory.begin() + offset, a_memory.begin() + offset + length);
    };
    rdmachan::WorkBatch batch;
    for (std::uint32_t i = 0; i < 4; ++i) batch.write(a_region.slice(i * 256, 256), b_region.remote(i * 256, 256));
    REQUIRE(pair.a.execute(batch).ok());
    REQUIRE(pair.a.execute(batch).ok());  // unchanged: the conversion is reused
    CHECK(b_zone(0, 1024) == a_zone(0, 1024));
    // Changed (same count after a clear): the new targets, not the old ones.
    batch.clear();
    for (std::uint32_t i = 0; i < 4; ++i) batch.write(a_region.slice(1024 + i * 256, 256), b_region.remote(2048 + i * 256, 256));
    const WorkResult changed = pair.a.execute(batch);
    REQUIRE(changed.ok());
    CHECK(changed.completion().bytes == 4 * 256);
    CHECK(b_zone(2048, 1024) == a_zone(1024, 1024));
    // Grown by one: five writes go.
    batch.write(a_region.slice(3072, 512), b_region.remote(4096, 512));
    REQUIRE(pair.a.execute(batch).ok());
    CHECK(b_zone(4096, 512) == a_zone(3072, 512));
    // Moved from: the moved-to batch posts the same writes; the moved-from one is empty.
    rdmachan::WorkBatch moved = std::move(batch);
    CHECK(batch.empty());
    REQUIRE(pair.a.execute(moved).ok());
    // A new batch in the old one's place, as many entries as the first had, other targets.
    batch = rdmachan::WorkBatch();
    for (std::uint32_t i = 0; i < 4; ++i) batch.write(a_region.slice(4096 + i * 256, 256), b_region.remote(6144 + i * 256, 256));
    REQUIRE(pair.a.execute(batch).ok());
    CHECK(b_zone(6144, 1024) == a_zone(4096, 1024));
    CHECK(pair.a.counters().operations == 4 + 4 + 4 + 5 + 5 + 4);
}

TEST_CASE("a batch with a bad rkey in the middle reports that failure, and nothing hangs") {
    ConnectedPair pair = connect_pair(ChannelBuilder().max_send_wr(64).deadline(std::chrono::seconds(5)));
    std::vector<std::uint8_t> a_memory(4096, 0x5a), b_memory(4096, 0);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    RemoteMemoryRegion wrong = b_region.remote(2048, 256);
    wrong.rkey ^= 0x3300;
    rdmachan::WorkBatch batch;
    batch.write(a_region.slice(0, 256), b_region.remote(0, 256));
    batch.write(a_region.slice(0, 256), wrong);
    for (std::uint32_t i = 0; i < 8; ++i) batch.write(a_region.slice(0, 128), b_region.remote(256 + i * 128, 128));
    WorkResult result = pair.a.execute(batch);
    REQUIRE_FALSE(result.ok());
    CHECK(result.error().status == 10);  // remote access error, not the flushes that follow it
    CHECK(result.error().message().find("batch") != std::string::npos);
    CHECK_FALSE(pair.a.healthy());
    // The region the bad key pointed at was not written.
    CHECK(std::all_of(b_memory.begin() + 2048, b_memory.begin() + 2304, [](std::uint8_t byte) { return byte == 0; }));
    CHECK(pair.a.counters().outstanding == 0);
}

TEST_CASE("batches are checked before anything is posted") {
    ConnectedPair pair = connect_pair(ChannelBuilder().max_send_wr(16));
    std::vector<std::uint8_t> memory(4096);
    MemoryRegion region = pair.a.register_memory(memory.data(), memory.size());
    rdmachan::WorkBatch empty;
    CHECK_THROWS_WITH_AS(pair.a.post_batch(empty), doctest::Contains("empty"), rdmachan::Error);
    rdmachan::WorkBatch large;
    for (int i = 0; i < 17; ++i) large.write(region.slice(0, 8), region.remote(0, 8));
    CHECK_THROWS_WITH_AS(pair.a.post_batch(large), doctest::Contains("more than max_send_wr (16)"), rdmachan::Error);
    rdmachan::WorkBatch misfit;
    CHECK_THROWS_WITH_AS(misfit.write(region.slice(0, 64), region.remote(0, 32)), doctest::Contains("entry 0"),
                         rdmachan::Error);
    CHECK(pair.a.counters().operations == 0);
    CHECK(pair.a.healthy());
}

TEST_CASE("batches back to back many times the send queue's size: the budget holds, nothing overflows") {
    ConnectedPair pair = connect_pair(ChannelBuilder().max_send_wr(32).cq_entries(32).deadline(std::chrono::seconds(10)));
    std::vector<std::uint8_t> a_memory(16 * 8), b_memory(16 * 8);
    MemoryRegion a_region = pair.a.register_memory(a_memory.data(), a_memory.size());
    MemoryRegion b_region = pair.b.register_memory(b_memory.data(), b_memory.size());
    rdmachan::WorkBatch batch(16);
    for (std::uint32_t i = 0; i < 16; ++i) batch.write(a_region.slice(i * 8, 8), b_region.remote(i * 8, 8));
    const int rounds = on_kernel_rdma_stack() ? 500 : 10000;
    int failures = 0;
    pair.a.scope([&](rdmachan::Scope& scope) {
        rdmachan::ScopedWork previous[3];
        for (int round = 0; round < rounds; ++round) {
            // Three batches in flight (48 requests) against a budget of 32: posting waits for room.
            rdmachan::ScopedWork& slot = previous[round % 3];
            if (round >= 3) failures += !slot.wait().ok();
            slot = scope.post_batch(batch);
        }
    });
    CHECK(failures == 0);
    CHECK(pair.a.counters().operations == static_cast<std::uint64_t>(rounds) * 16);
    CHECK(pair.a.counters().errors == 0);
}

TEST_CASE("connect through the shipped pairwise exchange: endpoints and published regions cross over TCP") {
    std::vector<std::uint8_t> listener_memory(4096, 0), connector_memory(4096);
    fill(connector_memory, 9);
    std::promise<std::uint16_t> port_promise;
    std::future<std::uint16_t> port_future = port_promise.get_future();
    std::string listener_error;
    std::thread listener([&] {
        try {
            rdmachan::PreparedChannel prepared = ChannelBuilder().device(first_device()).build();
            MemoryRegion region = prepared.register_memory(listener_memory.data(), listener_memory.size());
            prepared.publish_region("inbox", region);
            rdmachan::PairwiseSettings settings;
            settings.role = rdmachan::PairwiseSettings::Role::listen;
            settings.token = "channel-test-token";
            settings.timeout = std::chrono::seconds(10);
            settings.on_listening = [&](std::uint16_t port) { port_promise.set_value(port); };
            Channel channel = std::move(prepared).connect(settings);
            // Wait for the connector's write with immediate.
            WorkResult notified = channel.receive(region.slice(0, 8));
            if (!notified.ok() || notified.completion().immediate.value_or(0) != 5) listener_error = "no immediate 5";
        } catch (const std::exception& error) {
            listener_error = error.what();
        }
    });
    const std::uint16_t port = port_future.get();
    rdmachan::PreparedChannel prepared = ChannelBuilder().device(second_device()).build();
    MemoryRegion region = prepared.register_memory(connector_memory.data(), connector_memory.size());
    rdmachan::PairwiseSettings settings;
    settings.role = rdmachan::PairwiseSettings::Role::connect;
    settings.port = port;
    settings.token = "channel-test-token";
    settings.timeout = std::chrono::seconds(10);
    Channel channel = std::move(prepared).connect(settings);
    const RemoteMemoryRegion inbox = channel.remote_region("inbox");
    CHECK(inbox.length == 4096);
    CHECK_THROWS_WITH_AS(channel.remote_region("outbox"), doctest::Contains("no region named 'outbox'"), rdmachan::Error);
    const WorkResult written = channel.write(region.slice(0, 4096), inbox, 5u);
    CHECK_MESSAGE(written.ok(), (written.ok() ? std::string() : written.error().message()));
    listener.join();
    CHECK(listener_error.empty());
    CHECK(std::memcmp(listener_memory.data(), connector_memory.data(), 4096) == 0);
}

TEST_CASE("the pairwise exchange refuses a peer without the job token") {
    std::promise<std::uint16_t> port_promise;
    std::future<std::uint16_t> port_future = port_promise.get_future();
    std::string listener_error;
    std::thread listener([&] {
        try {
            rdmachan::PairwiseSettings settings;
            settings.role = rdmachan::PairwiseSettings::Role::listen;
            settings.token = "right";
            settings.timeout = std::chrono::seconds(3);
            settings.on_listening = [&](std::uint16_t port) { port_promise.set_value(port); };
            (void)ChannelBuilder().device(first_device()).build().connect(settings);
        } catch (const std::exception& error) {
            listener_error = error.what();
        }
    });
    rdmachan::PairwiseSettings settings;
    settings.role = rdmachan::PairwiseSettings::Role::connect;
    settings.port = port_future.get();
    settings.token = "wrong";
    settings.timeout = std::chrono::seconds(3);
    CHECK_THROWS_AS((void)ChannelBuilder().device(second_device()).build().connect(settings), rdmachan::Error);
    listener.join();
    CHECK_FALSE(listener_error.empty());
}
