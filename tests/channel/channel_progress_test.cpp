// Channel::progress() between two processes over TCP (the same-host path off): the target of a
// stream of RDMA writes polls its memory for each one's last byte and lends its thread to the
// device between looks, as ucx_perftest's put ping-pong progresses its worker; its calls read
// the writes themselves (transport/soft/README.md, "Progress from the caller's thread").
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "rdmachan/channel.hpp"
#include "tests/channel/process_pair_settings.hpp"
#include "tests/sanitizer_build.hpp"

using namespace rdmachan;

namespace {

constexpr std::size_t kMemory = 1024 * 1024;
constexpr std::size_t kBytes = 256;
constexpr std::uint32_t kWrites = 1000;  // each into a slot of its own: the initiator does not wait for the target
static_assert(kWrites * kBytes <= kMemory);
const char* const kToken = "channel-progress-test";

std::uint8_t marker(std::uint32_t index) { return static_cast<std::uint8_t>(index % 255 + 1); }

// Waits until the byte at `offset` of `memory` is `expected`, calling progress() between looks;
// counts the calls that handled something. False if it never came.
bool poll_marker_with_progress(Channel& channel, const std::uint8_t* memory, std::size_t offset, std::uint8_t expected,
                               std::uint32_t& handled) {
    const std::uint8_t* last = memory + offset;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (__atomic_load_n(last, __ATOMIC_ACQUIRE) != expected) {
        if (channel.progress()) ++handled;
        if (std::chrono::steady_clock::now() > until) {
            std::fprintf(stderr, "the byte at %zu never became %u\n", offset, expected);
            return false;
        }
    }
    return true;
}

// The child: connects, runs `body` on its channel and memory, writes the number body returns
// to result_pipe, then waits for end_pipe to close (the parent is done with its memory); exits
// non-zero on failure.
template <typename Body>
int child(int port_pipe, int result_pipe, int end_pipe, Body body) try {
    PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).build();
    MemoryRegion region = prepared.allocate_memory(kMemory);
    prepared.publish_region("memory", region);
    Channel channel = std::move(prepared).connect(test::listening_settings(kToken, port_pipe));
    const std::optional<std::uint32_t> result = body(channel, region);
    if (!result) return 1;
    if (write(result_pipe, &*result, sizeof *result) != static_cast<ssize_t>(sizeof *result)) return 4;
    std::uint8_t end = 0;
    (void)!read(end_pipe, &end, 1);
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "child: %s\n", error.what());
    return 2;
}

// Forks a child running `body`, connects to it, runs `parent` on this side's channel and memory,
// and returns the child's number once it exited well.
template <typename ChildBody, typename ParentBody>
std::uint32_t run_pair(ChildBody child_body, ParentBody parent) {
    REQUIRE(setenv("RDMACHAN_SOFT_TRANSPORT", "tcp", 1) == 0);
    int port_pipe[2];
    int result_pipe[2];
    int end_pipe[2];
    REQUIRE(pipe(port_pipe) == 0);
    REQUIRE(pipe(result_pipe) == 0);
    REQUIRE(pipe(end_pipe) == 0);
    const pid_t pid = fork();
    if (pid == 0) {
        close(port_pipe[0]);
        close(result_pipe[0]);
        close(end_pipe[1]);
        std::_Exit(child(port_pipe[1], result_pipe[1], end_pipe[0], child_body) == 0 ? 0 : 1);
    }
    close(port_pipe[1]);
    close(result_pipe[1]);
    close(end_pipe[0]);
    std::uint16_t port = 0;
    REQUIRE(read(port_pipe[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));
    std::uint32_t result = 0;
    {
        PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).build();
        MemoryRegion region = prepared.allocate_memory(kMemory);
        prepared.publish_region("memory", region);
        Channel channel = std::move(prepared).connect(test::connecting_settings(kToken, port));
        parent(channel, region);
        REQUIRE(read(result_pipe[0], &result, sizeof result) == static_cast<ssize_t>(sizeof result));
        close(end_pipe[1]);
    }
    int status = 0;
    REQUIRE(waitpid(pid, &status, 0) == pid);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    unsetenv("RDMACHAN_SOFT_TRANSPORT");
    return result;
}

// Ping-pong of writes as rdmachan-bench's latency test makes them: a write, then a poll of this
// side's memory for the answer's marker with progress() between looks, then the write's own
// completion (the channel's wait: progress() while it spins, then stop). Sizes cycle through
// kPingPongSizes, whose largest outlast the waits' spinning, so the waits hand the sockets back
// while frames are on the way; each side writes into the other's slot and polls its own.
constexpr std::uint32_t kPingPongSizes[] = {8, 65536, 524288};
constexpr std::size_t kSlot = 524288;
// 1,500 in the sanitizer builds (6,000 took 41 s of CI's time under ThreadSanitizer): each size
// still comes 500 times.
constexpr std::uint32_t kSteps = rdmachan::test::kSanitizerBuild ? 1500 : 6000;

bool ping_pong_step(Channel& channel, MemoryRegion& region, const RemoteMemoryRegion& remote, std::uint32_t index,
                    bool first_writes) {
    const std::uint32_t bytes = kPingPongSizes[index % 3];
    auto* memory = static_cast<std::uint8_t*>(region.data());
    std::uint32_t ignored = 0;
    std::optional<PendingWork> work;
    const auto post = [&] {
        std::memset(memory + kSlot, marker(index), bytes);
        work = channel.post_write(region.slice(kSlot, bytes), remote.slice(0, bytes));
    };
    if (first_writes) post();
    // The incoming slot is at offset 0; its last byte for this size.
    if (!poll_marker_with_progress(channel, memory, bytes - 1, marker(index), ignored)) return false;
    if (!first_writes) post();
    return work->wait().ok();
}

}  // namespace

TEST_CASE("Channel::progress() on the target of RDMA writes over TCP reads them on its own thread") {
    const std::uint32_t handled = run_pair(
        [](Channel& channel, MemoryRegion& region) -> std::optional<std::uint32_t> {
            const auto* memory = static_cast<const std::uint8_t*>(region.data());
            std::uint32_t handled = 0;
            for (std::uint32_t index = 0; index < kWrites; ++index) {
                if (!poll_marker_with_progress(channel, memory, index * kBytes + kBytes - 1, marker(index), handled)) {
                    return std::nullopt;
                }
            }
            channel.progress();  // the last ACK may still be held by the last call: this sends it
            return handled;
        },
        [](Channel& channel, MemoryRegion& region) {
            auto* memory = static_cast<std::uint8_t*>(region.data());
            const RemoteMemoryRegion remote = channel.remote_region("memory");
            for (std::uint32_t index = 0; index < kWrites; ++index) {
                const std::size_t offset = index * kBytes;
                std::memset(memory + offset, marker(index), kBytes);
                REQUIRE(channel.write(region.slice(offset, kBytes), remote.slice(offset, kBytes)).ok());
            }
        });
    // Each write is one frame: the target's calls read at least some of them (nearly all on an
    // idle machine; the device's own thread, awake at the end of a hold, may read others).
    MESSAGE(handled, " of ", kWrites, " writes read by the target's progress() calls");
    CHECK(handled > 0);
}

TEST_CASE("a ping-pong of writes polled with progress() over TCP, as rdmachan-bench's: every write arrives") {
    // Both sides hand the sockets between their threads at every step (the channel's waits stop
    // reading them when they stop spinning), while both devices' threads work: a hand-over that
    // left them to nobody shows as a write that never arrives.
    const std::uint32_t answered = run_pair(
        [](Channel& channel, MemoryRegion& region) -> std::optional<std::uint32_t> {
            const RemoteMemoryRegion remote = channel.remote_region("memory");
            for (std::uint32_t index = 0; index < kSteps; ++index) {
                if (!ping_pong_step(channel, region, remote, index, false)) return std::nullopt;
            }
            return kSteps;
        },
        [](Channel& channel, MemoryRegion& region) {
            const RemoteMemoryRegion remote = channel.remote_region("memory");
            for (std::uint32_t index = 0; index < kSteps; ++index) {
                REQUIRE_MESSAGE(ping_pong_step(channel, region, remote, index, true), "step ", index);
            }
        });
    CHECK(answered == kSteps);
}
