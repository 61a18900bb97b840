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
#include <vector>

#include "rdmachan/channel.hpp"

using namespace rdmachan;

namespace {

constexpr std::size_t kMemory = 64 * 1024;
constexpr std::size_t kBytes = 256;
constexpr std::uint32_t kWrites = 200;  // each into a slot of its own: the initiator does not wait for the target
static_assert(kWrites * kBytes <= kMemory);
const char* const kToken = "channel-progress-test";

std::uint8_t marker(std::uint32_t index) { return static_cast<std::uint8_t>(index % 255 + 1); }

// Waits for write `index`'s last byte, calling progress() between looks; counts the calls that
// handled something. False if it never came. Not instrumented by ThreadSanitizer: the device's
// thread may be the one that writes the byte (a memcpy, as a NIC's DMA on hardware), which it
// would report as racing with this poll; the poll is meant to observe exactly that write.
__attribute__((no_sanitize("thread"))) bool poll_marker_with_progress(Channel& channel, const std::uint8_t* memory, std::uint32_t index, std::uint32_t& handled) {
    const std::uint8_t* last = memory + index * kBytes + kBytes - 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (__atomic_load_n(last, __ATOMIC_ACQUIRE) != marker(index)) {
        if (channel.progress()) ++handled;
        if (std::chrono::steady_clock::now() > until) return false;
    }
    return true;
}

// The child: the writes' target. Writes how many progress() calls handled something to
// result_pipe, then waits for end_pipe to close (the initiator is done with its memory), or
// exits non-zero.
int target(int port_pipe, int result_pipe, int end_pipe) try {
    PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).build();
    MemoryRegion region = prepared.allocate_memory(kMemory);
    const auto* memory = static_cast<const std::uint8_t*>(region.data());
    prepared.publish_region("memory", region);
    PairwiseSettings settings;
    settings.role = PairwiseSettings::Role::listen;
    settings.token = kToken;
    settings.timeout = std::chrono::seconds(20);
    settings.on_listening = [&](std::uint16_t port) {
        if (write(port_pipe, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) std::_Exit(3);
    };
    Channel channel = std::move(prepared).connect(settings);
    std::uint32_t handled = 0;
    for (std::uint32_t index = 0; index < kWrites; ++index) {
        if (!poll_marker_with_progress(channel, memory, index, handled)) {
            std::fprintf(stderr, "target: write %u never arrived\n", index);
            return 1;
        }
    }
    // The last ACK may still be held by this thread's last call: one more sends it.
    channel.progress();
    if (write(result_pipe, &handled, sizeof handled) != static_cast<ssize_t>(sizeof handled)) return 4;
    std::uint8_t end = 0;
    (void)!read(end_pipe, &end, 1);
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "target: %s\n", error.what());
    return 2;
}

}  // namespace

TEST_CASE("Channel::progress() on the target of RDMA writes over TCP reads them on its own thread") {
    REQUIRE(setenv("RDMACHAN_SOFT_TRANSPORT", "tcp", 1) == 0);
    int port_pipe[2];
    int result_pipe[2];
    int end_pipe[2];
    REQUIRE(pipe(port_pipe) == 0);
    REQUIRE(pipe(result_pipe) == 0);
    REQUIRE(pipe(end_pipe) == 0);
    const pid_t child = fork();
    if (child == 0) {
        close(port_pipe[0]);
        close(result_pipe[0]);
        close(end_pipe[1]);
        std::_Exit(target(port_pipe[1], result_pipe[1], end_pipe[0]) == 0 ? 0 : 1);
    }
    close(port_pipe[1]);
    close(result_pipe[1]);
    close(end_pipe[0]);
    std::uint16_t port = 0;
    REQUIRE(read(port_pipe[0], &port, sizeof port) == static_cast<ssize_t>(sizeof port));

    PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).build();
    MemoryRegion region = prepared.allocate_memory(kMemory);
    auto* memory = static_cast<std::uint8_t*>(region.data());
    PairwiseSettings settings;
    settings.role = PairwiseSettings::Role::connect;
    settings.port = port;
    settings.token = kToken;
    settings.timeout = std::chrono::seconds(20);
    Channel channel = std::move(prepared).connect(settings);
    const RemoteMemoryRegion remote = channel.remote_region("memory");
    for (std::uint32_t index = 0; index < kWrites; ++index) {
        const std::size_t offset = index * kBytes;
        std::memset(memory + offset, marker(index), kBytes);
        const WorkResult result = channel.write(region.slice(offset, kBytes), remote.slice(offset, kBytes));
        REQUIRE(result.ok());
    }
    std::uint32_t handled = 0;
    REQUIRE(read(result_pipe[0], &handled, sizeof handled) == static_cast<ssize_t>(sizeof handled));
    close(end_pipe[1]);
    int status = 0;
    REQUIRE(waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    // Each write is one frame: the target's calls read at least some of them (nearly all on an
    // idle machine; the device's own thread, awake at the end of a hold, may read others).
    MESSAGE(handled, " of ", kWrites, " writes read by the target's progress() calls");
    CHECK(handled > 0);
    unsetenv("RDMACHAN_SOFT_TRANSPORT");
}
