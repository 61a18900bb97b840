// Progress from the caller's thread (transport/soft/README.md, "Progress from the caller's
// thread"): a thread that calls Device::progress() reads and handles what comes over the
// device's TCP connections itself; when it stops, the device's own thread takes them back
// within the hold, with any ACK the caller left held.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/soft/device_pair.hpp"
#include "transport/soft/device_core.hpp"
#include "tests/soft/eventually.hpp"
#include "tests/soft/scoped_environment.hpp"

namespace {

using namespace rdmachan;
using namespace rdmachan::test;
using Clock = std::chrono::steady_clock;

constexpr std::uint32_t kBytes = 64;

// An 8-bit pattern for write number `index`, never 0 (the buffers start zeroed).
std::uint8_t pattern(std::uint32_t index) { return static_cast<std::uint8_t>(index % 251 + 1); }

// Posts write number `index` of kBytes from the initiator's buffer to the target's, at an offset
// of its own.
void post_write(TcpDevicePair& pair, std::uint32_t index) {
    const std::uint64_t offset = static_cast<std::uint64_t>(index % 64) * kBytes;
    std::memset(pair.initiator.buffer() + offset, pattern(index), kBytes);
    const mlx5::ScatterGatherElement source = pair.initiator.local(offset, kBytes);
    mlx5::SendWorkRequest write = write_request(index, &source, pair.remote.buffer_addr + offset, pair.remote.rkey);
    write.flags |= mlx5::kSendSignaled;
    REQUIRE(pair.initiator.post(&write, 1) == mlx5::PostResult::ok);
}

// Polls the initiator's send CQ, lending this thread to its device between polls, as the
// channels' waits do.
std::optional<mlx5::Completion> wait_send_progressing(TcpDevicePair& pair, std::chrono::milliseconds deadline) {
    const auto until = Clock::now() + deadline;
    mlx5::Completion completion;
    while (Clock::now() < until) {
        if (pair.initiator.poll_send(&completion, 1) == 1) return completion;
        pair.initiator_device->progress();
    }
    return std::nullopt;
}

// Whether write `index`'s bytes are in the target's buffer. Not instrumented by ThreadSanitizer:
// the target's device thread may be writing them (a memcpy, as a NIC's DMA on hardware), which it
// would report as racing with this look; the look is meant to observe exactly that write.
__attribute__((no_sanitize("thread"))) bool landed(TcpDevicePair& pair, std::uint32_t index) {
    const std::uint8_t* bytes = pair.target.buffer() + static_cast<std::uint64_t>(index % 64) * kBytes;
    for (std::uint32_t b = 0; b < kBytes; ++b) {
        if (__atomic_load_n(bytes + b, __ATOMIC_RELAXED) != pattern(index)) return false;
    }
    return true;
}

// Posts writes until one of them was read by a progress() call on this thread (the target's
// device thread, awake at the end of a hold, may read one first), then stops calling it.
// Returns that write's index, or nothing if no call read one.
std::optional<std::uint32_t> write_read_by_caller(TcpDevicePair& pair, std::uint32_t first_index) {
    // progress() takes the sockets only while bytes came within the last millisecond: on a loaded
    // machine a round trip can take longer, and it may take many writes until one is read here.
    const auto give_up = Clock::now() + std::chrono::seconds(20);
    for (std::uint32_t index = first_index; Clock::now() < give_up; ++index) {
        // Traffic came (the path's first read, or the write before): this call takes the
        // sockets from the device thread, so the write's frame wakes nobody.
        pair.target_device->progress();
        const std::uint64_t turns = pair.target_device->caller_progress_turns();
        post_write(pair, index);
        const auto until = Clock::now() + std::chrono::seconds(5);
        while (!landed(pair, index)) {
            REQUIRE(Clock::now() < until);
            pair.target_device->progress();
        }
        if (pair.target_device->caller_progress_turns() != turns) return index;
        // The device thread read it (with no traffic yet, progress() leaves the sockets to it):
        // take its completion and try again.
        const auto completion = pair.initiator.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
    }
    return std::nullopt;
}

}  // namespace

TEST_CASE("progress() on the target's thread reads the initiator's writes, and on the initiator's its ACKs") {
    TcpDevicePair pair;
    std::atomic<bool> stop{false};
    std::thread target_caller([&] {
        while (!stop.load()) pair.target_device->progress();
    });
    // At least kWrites, and on until both callers read a frame: on a loaded machine a caller
    // thread may not run for a while, and the device threads then read every frame.
    constexpr std::uint32_t kWrites = 200;
    const auto until = Clock::now() + std::chrono::seconds(20);
    const auto both_read = [&] {
        return pair.target_device->caller_progress_turns() > 0 && pair.initiator_device->caller_progress_turns() > 0;
    };
    std::uint32_t writes = 0;
    for (std::uint32_t index = 0; index < kWrites || (!both_read() && Clock::now() < until); ++index, ++writes) {
        post_write(pair, index);
        const auto completion = wait_send_progressing(pair, std::chrono::seconds(10));
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->wr_id == index);
        const std::uint64_t offset = static_cast<std::uint64_t>(index % 64) * kBytes;
        CHECK(bytes_differing(pair.target.buffer() + offset, kBytes, pattern(index)) == 0);
    }
    stop.store(true);
    target_caller.join();
    // Both callers read frames. How many: on an idle machine nearly all (the device threads are
    // awake only at the ends of holds); on a loaded one a caller preempted for longer than the
    // hold hands the sockets back, and the device thread reads the next frames (in one CI run,
    // under the sanitizer builds' compilation, the target's caller read none of the first 200).
    MESSAGE("of ", writes, " writes, progress() calls that read a frame: target ", pair.target_device->caller_progress_turns(),
            ", initiator ", pair.initiator_device->caller_progress_turns());
    CHECK(pair.target_device->caller_progress_turns() > 0);
    CHECK(pair.initiator_device->caller_progress_turns() > 0);
}

TEST_CASE("after the caller stops calling progress(), the device's thread handles what comes, before any retransmission") {
    TcpDevicePair pair;  // ACK timeout 0.54 s a try
    const std::optional<std::uint32_t> read = write_read_by_caller(pair, 0);
    REQUIRE(read.has_value());
    const auto first = pair.initiator.wait_send();
    REQUIRE(first.has_value());
    CHECK(first->wr_id == *read);
    // Nobody on the target's side calls progress() from here on; its device thread must take
    // the connections back when the hold ends, not leave the next write to a retransmission.
    const std::uint64_t resends = pair.initiator_device->core().statistics.ack_timeout_resends.load();
    post_write(pair, 100);
    const auto completion = pair.initiator.wait_send(std::chrono::seconds(5));
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::success);
    CHECK(completion->wr_id == 100);
    CHECK(pair.initiator_device->core().statistics.ack_timeout_resends.load() == resends);
    CHECK(bytes_differing(pair.target.buffer() + (100 % 64) * kBytes, kBytes, pattern(100)) == 0);
}

TEST_CASE("an ACK a caller left held goes when the device's thread takes the connections back") {
    TcpDevicePair pair;
    // The caller read the write and left its ACK held (so it could answer first); it then calls
    // nothing more. The ACK must go when the hold ends, not after the initiator's ACK timeout
    // (0.54 s) resent the write: the initiator resends nothing. (Timing it from before
    // write_read_by_caller measured its retries too: 99 writes, 1.2 s, on a loaded machine.)
    const std::uint64_t resends = pair.initiator_device->core().statistics.ack_timeout_resends.load();
    const std::optional<std::uint32_t> read = write_read_by_caller(pair, 0);
    REQUIRE(read.has_value());
    CHECK(bytes_differing(pair.target.buffer() + (*read % 64) * kBytes, kBytes, pattern(*read)) == 0);
    const auto completion = pair.initiator.wait_send(std::chrono::seconds(5));
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::success);
    CHECK(completion->wr_id == *read);
    CHECK(pair.initiator_device->core().statistics.ack_timeout_resends.load() == resends);
}

TEST_CASE("stop_progress() hands the connections back at once") {
    TcpDevicePair pair;
    const std::optional<std::uint32_t> read = write_read_by_caller(pair, 0);
    REQUIRE(read.has_value());
    REQUIRE(pair.initiator.wait_send().has_value());
    pair.target_device->stop_progress();
    const std::uint64_t turns = pair.target_device->caller_progress_turns();
    post_write(pair, 100);
    const auto completion = pair.initiator.wait_send(std::chrono::seconds(5));
    REQUIRE(completion.has_value());
    CHECK(completion->wr_id == 100);
    CHECK(pair.target_device->caller_progress_turns() == turns);
}

TEST_CASE("an RNR NAK read by a caller is still retried by the device's thread") {
    TcpDevicePair pair;  // rnr_retry 7: retried until a receive is posted
    const mlx5::ScatterGatherElement source = pair.initiator.local(0, 32);
    std::memset(pair.initiator.buffer(), 0x5a, 32);
    mlx5::SendWorkRequest send = send_request(7, &source, 1, mlx5::SendOpcode::send);
    REQUIRE(pair.initiator.post(&send, 1) == mlx5::PostResult::ok);
    // The initiator's thread reads the NAKs for a while, then the target posts its receive.
    const auto until = Clock::now() + std::chrono::milliseconds(50);
    while (Clock::now() < until) pair.initiator_device->progress();
    REQUIRE(pair.target.post_receive(1, 0, 64) == mlx5::PostResult::ok);
    const auto completion = wait_send_progressing(pair, std::chrono::seconds(5));
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::success);
    CHECK(completion->wr_id == 7);
    const auto received = pair.target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->byte_len == 32);
    CHECK(bytes_differing(pair.target.buffer(), 32, 0x5a) == 0);
}

TEST_CASE("RDMACHAN_SOFT_CALLER_PROGRESS: 0 leaves everything to the device's thread; another value names the variable, as for the other switches") {
    SUBCASE("0") {
        Environment off("RDMACHAN_SOFT_CALLER_PROGRESS", "0");
        TcpDevicePair pair;
        for (std::uint32_t index = 0; index < 20; ++index) {
            post_write(pair, index);
            const auto completion = wait_send_progressing(pair, std::chrono::seconds(10));
            REQUIRE(completion.has_value());
            CHECK(completion->status == mlx5::CompletionStatus::success);
            pair.target_device->progress();
        }
        CHECK(pair.initiator_device->caller_progress_turns() == 0);
        CHECK(pair.target_device->caller_progress_turns() == 0);
    }
    SUBCASE("a bad value, of this switch or of the device's other two") {
        for (const char* name : {"RDMACHAN_SOFT_CALLER_PROGRESS", "RDMACHAN_SOFT_ZERO_HOP", "RDMACHAN_SOFT_DOORBELL_REQUESTS"}) {
            Environment bad(name, "yes");
            try {
                (void)soft::Device::open();
                FAIL("the device opened with " << name << "=yes");
            } catch (const soft::SoftDeviceError& error) {
                CHECK(std::string(error.what()).find(std::string(name) + " = 'yes' is not 0 or 1") != std::string::npos);
            }
        }
    }
}

// One side's waits as the channels' are: a few progress() calls while spinning, then
// stop_progress() and only looks at the CQ (what the engine does when it starts to yield).
void run_handovers(const char* doorbell_requests) {
    Environment doorbells("RDMACHAN_SOFT_DOORBELL_REQUESTS", doorbell_requests);
    TcpDevicePair pair;
    std::atomic<bool> stop{false};
    std::thread target_caller([&] {
        std::uint32_t state = 12345;
        while (!stop.load()) {
            state = state * 1103515245 + 12345;
            for (std::uint32_t i = 0; i < (state >> 16) % 8; ++i) pair.target_device->progress();
            pair.target_device->stop_progress();
            if ((state >> 20) % 4 == 0) std::this_thread::sleep_for(std::chrono::microseconds(200));
        }
    });
    std::uint32_t state = 777;
    constexpr std::uint32_t kWrites = 20000;
    for (std::uint32_t index = 0; index < kWrites; ++index) {
        post_write(pair, index);
        mlx5::Completion completion;
        state = state * 1103515245 + 12345;
        std::uint32_t spins = (state >> 16) % 8;
        bool completed = false;
        const auto until = Clock::now() + std::chrono::seconds(5);
        while (!completed && Clock::now() < until) {
            completed = pair.initiator.poll_send(&completion, 1) == 1;
            if (completed) break;
            if (spins > 0) {
                pair.initiator_device->progress();
                if (--spins == 0) pair.initiator_device->stop_progress();
            } else {
                std::this_thread::yield();
            }
        }
        REQUIRE_MESSAGE(completed, "write ", index, " did not complete within 5 s");
        CHECK(completion.status == mlx5::CompletionStatus::success);
        CHECK(completion.wr_id == index);
    }
    stop.store(true);
    target_caller.join();
}

TEST_CASE("callers that start and stop progress() at random while both devices' threads work: every write completes") {
    // The sockets change hands often, also while a device thread executes a doorbell (always,
    // with the doorbell thread's requests off) or sleeps. A hand-over that left them to nobody
    // shows as a write that never completes.
    SUBCASE("requests from the doorbell thread") { run_handovers("1"); }
    SUBCASE("every request from the device's thread") { run_handovers("0"); }
}
