// Channel between two processes on the software device, connected through the shipped pairwise
// exchange (TCP, job token): every operation at every level, immediates, batches, atomics, and
// a bad rkey that fails on the initiator and leaves the target's memory unchanged.
#include <doctest/doctest.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <vector>

#include "rdmachan/channel.hpp"
#include "tests/channel/process_pair_settings.hpp"
#include "transport/soft/device.hpp"

using namespace rdmachan;

namespace {

constexpr std::size_t kMemory = 64 * 1024;
constexpr std::size_t kUntouched = 8192;  // the bad-rkey write aims here
constexpr std::size_t kWord = 16384;      // the atomics' word
constexpr std::size_t kBatchArea = 20480;
const char* const kToken = "channel-processes-test";

std::uint8_t pattern(std::size_t index, std::uint8_t seed) { return static_cast<std::uint8_t>(index * 7 + seed); }

// What allocate_memory promises: memory of the region's own, page aligned, zeroed, as long as asked.
bool allocated_well(const MemoryRegion& region) {
    const auto* bytes = static_cast<const std::uint8_t*>(region.data());
    return bytes != nullptr && reinterpret_cast<std::uintptr_t>(bytes) % 4096 == 0 && region.length() == kMemory &&
           std::all_of(bytes, bytes + kMemory, [](std::uint8_t b) { return b == 0; });
}

#define EXPECT(condition, what)                                                          \
    do {                                                                                 \
        if (!(condition)) {                                                              \
            std::fprintf(stderr, "target: %s failed (%s:%d)\n", what, __FILE__, __LINE__); \
            return 1;                                                                    \
        }                                                                                \
    } while (0)

// The child: listens, answers, and checks its own memory at the end. done_pipe: the initiator
// writes a byte there once its last operation (the bad-rkey write) has failed.
int target(int port_pipe, int done_pipe, bool allocated) try {
    PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).build();
    std::vector<std::uint8_t> heap(allocated ? 0 : kMemory, 0);
    MemoryRegion region = allocated ? prepared.allocate_memory(kMemory) : prepared.register_memory(heap.data(), heap.size());
    auto* memory = static_cast<std::uint8_t*>(region.data());
    EXPECT(!allocated || allocated_well(region), "allocated memory: page aligned, zeroed, the length asked");
    prepared.publish_region("memory", region);
    Channel channel = std::move(prepared).connect(test::listening_settings(kToken, port_pipe));

    // 1. Blocking receive with immediate, echoed back with another immediate.
    WorkResult first = channel.receive(region.slice(32768, 4096));
    EXPECT(first.ok() && first.completion().immediate == 1u && first.completion().bytes == 1000, "blocking receive");
    EXPECT(channel.send(region.slice(32768, 1000), 2u).ok(), "blocking echo send");

    // 2. Four scoped receives, waited for in reverse order.
    bool scoped_ok = true;
    channel.scope([&](Scope& scope) {
        ScopedWork receives[4];
        for (int i = 0; i < 4; ++i) receives[i] = scope.post_receive(region.slice(40960 + i * 64, 64));
        for (int i = 4; i-- > 0;) {
            WorkResult result = receives[i].wait();
            scoped_ok = scoped_ok && result.ok() && result.completion().immediate == 10u + i;
        }
    });
    EXPECT(scoped_ok, "scoped receives in reverse order");

    // 3. The write with immediate says the unpolled write before it has landed.
    PendingWork notice = channel.post_receive(region.slice(49152, 8));
    WorkResult noticed = notice.wait();
    EXPECT(noticed.ok() && noticed.completion().immediate == 20u, "write-with-immediate notice");
    for (std::size_t i = 0; i < 4096; ++i) EXPECT(memory[i] == pattern(i, 5), "unpolled write bytes");

    // 4. The initiator's atomics, batches and finally a write with a bad rkey need nothing from
    //    this side. Once it says the bad write has failed, the memory it aimed at is checked
    //    (no timer here: on a slow machine a timer could end this QP before the initiator is done).
    pollfd done{done_pipe, POLLIN, 0};
    std::uint8_t signal = 0;
    EXPECT(poll(&done, 1, 60000) == 1 && read(done_pipe, &signal, 1) == 1, "the initiator's signal after its last operation");
    // The pipe is causality ThreadSanitizer cannot see: the device thread wrote this memory.
    soft::acquire_remote_writes();
    EXPECT(std::all_of(memory + kUntouched, memory + kUntouched + 256, [](std::uint8_t b) { return b == 0; }),
           "bad-rkey target untouched");
    std::uint64_t word = 0;
    std::memcpy(&word, memory + kWord, 8);
    EXPECT(word == 1000, "atomics' final value");
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "target: %s\n", error.what());
    return 2;
}

// Both sides' memory from the library (allocate_memory: on the software device, memory the peer
// maps, so writes into it are memcpys) or from the application (a vector, register_memory).
void every_operation(bool allocated) {
    int ends[2];
    int done[2];
    REQUIRE(pipe(ends) == 0);
    REQUIRE(pipe(done) == 0);
    const pid_t child = fork();
    if (child == 0) {
        close(ends[0]);
        close(done[1]);
        std::_Exit(target(ends[1], done[0], allocated));
    }
    close(ends[1]);
    close(done[0]);
    std::uint16_t port = 0;
    REQUIRE(read(ends[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
    close(ends[0]);

    PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).build();
    std::vector<std::uint8_t> heap(allocated ? 0 : kMemory, 0);
    MemoryRegion region = allocated ? prepared.allocate_memory(kMemory) : prepared.register_memory(heap.data(), heap.size());
    auto* memory = static_cast<std::uint8_t*>(region.data());
    CHECK((!allocated || allocated_well(region)));
    Channel channel = std::move(prepared).connect(test::connecting_settings(kToken, port));
    const RemoteMemoryRegion remote = channel.remote_region("memory");
    CHECK(remote.length == kMemory);

    // 1. Blocking send and receive, with immediates.
    for (std::size_t i = 0; i < 1000; ++i) memory[i] = pattern(i, 1);
    PendingWork echo = channel.post_receive(region.slice(4096, 4096));
    REQUIRE(channel.send(region.slice(0, 1000), 1u).ok());
    WorkResult echoed = echo.wait();
    REQUIRE(echoed.ok());
    CHECK(echoed.completion().immediate == 2u);
    CHECK(std::memcmp(memory, memory + 4096, 1000) == 0);

    // 2. Scoped sends (small ones go inline), polled in any order.
    channel.scope([&](Scope& scope) {
        ScopedWork sends[4];
        for (int i = 0; i < 4; ++i) sends[i] = scope.post_send(region.slice(i * 16, 16), 10u + i);
        CHECK(sends[2].wait().ok());
        CHECK(sends[0].wait().ok());
    });  // 1 and 3 drained here

    // 3. Unpolled write, read back, then a write with immediate as the notice.
    for (std::size_t i = 0; i < 4096; ++i) memory[i] = pattern(i, 5);
    PendingWork written = channel.post_write(region.slice(0, 4096), remote.slice(0, 4096));
    PendingWork read_back = channel.post_read(region.slice(8192, 4096), remote.slice(0, 4096));
    CHECK(written.wait().ok());
    CHECK(read_back.wait().ok());
    CHECK(std::memcmp(memory, memory + 8192, 4096) == 0);
    REQUIRE(channel.write(region.slice(12288, 8), remote.slice(49152, 8), 20u).ok());

    // 4. Atomics on the target's word: 0 -> 500 -> 1000 (add), then a failed and a good CAS.
    const LocalSlice result = region.slice(16384, 8);
    std::uint64_t old = 0;
    REQUIRE(channel.fetch_and_add(result, remote.slice(kWord, 8), 500).ok());
    std::memcpy(&old, memory + 16384, 8);
    CHECK(old == 0);
    REQUIRE(channel.compare_and_swap(result, remote.slice(kWord, 8), 7, 9).ok());
    std::memcpy(&old, memory + 16384, 8);
    CHECK(old == 500);  // the compare failed: unchanged
    REQUIRE(channel.compare_and_swap(result, remote.slice(kWord, 8), 500, 1000).ok());

    // 5. A batch of 8 writes and a batch of 8 reads, one doorbell each.
    for (std::size_t i = 0; i < 8 * 512; ++i) memory[kBatchArea + i] = pattern(i, 9);
    WorkBatch writes, reads;
    for (std::uint32_t i = 0; i < 8; ++i) {
        writes.write(region.slice(kBatchArea + i * 512, 512), remote.slice(kBatchArea + i * 512, 512));
        reads.read(region.slice(32768 + i * 512, 512), remote.slice(kBatchArea + i * 512, 512));
    }
    REQUIRE(channel.execute(writes).ok());
    REQUIRE(channel.execute(reads).ok());
    CHECK(std::memcmp(memory + kBatchArea, memory + 32768, 8 * 512) == 0);

    // 6. A bad rkey: remote access error here, nothing written there (the target checks).
    RemoteMemoryRegion wrong = remote.slice(kUntouched, 256);
    wrong.rkey ^= 0x4400;
    WorkResult refused = channel.write(region.slice(0, 256), wrong);
    REQUIRE_FALSE(refused.ok());
    CHECK(refused.error().status == 10);
    CHECK(refused.error().message().find("RDMA write") != std::string::npos);
    const std::uint8_t signal = 1;
    CHECK(write(done[1], &signal, 1) == 1);
    close(done[1]);

    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
}

}  // namespace

TEST_CASE("two processes: every operation at every level through the pairwise exchange") {
    SUBCASE("memory registered by the application") { every_operation(false); }
    SUBCASE("memory allocated by the library") { every_operation(true); }
}
