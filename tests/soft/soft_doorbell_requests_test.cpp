// Requests sent from the doorbell thread (transport/soft/README.md, "Requests from the doorbell
// thread"), on the TCP path: the thread that rings an RC doorbell executes the WQEs and writes
// their frames to the peer's socket. Here: every operation type completes with the right bytes
// and allocates nothing on that thread; a request sent there while the progress thread sleeps
// still meets its ACK timeout (the timerfd); a stream of large writes that fills the socket
// keeps its order and its frames whole when the progress thread takes over the rest.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>

#include "tests/mlx5/allocation_counter.hpp"
#include "tests/soft/device_pair.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::bytes_differing;
using rdmachan::test::EndpointOptions;
using rdmachan::test::run_signaled;
using rdmachan::test::ScopedPartition;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

// The first request (settling the path) opens the connection, the progress thread's job; later
// ones may go from the doorbell thread.
using Pair = rdmachan::test::TcpDevicePair;

}  // namespace

TEST_CASE("doorbell-thread requests: write, read, send, atomics complete with the right bytes and allocate nothing") {
    Pair pair;
    SoftEndpoint& initiator = pair.initiator;
    const Address& remote = pair.remote;
    std::memset(pair.target.buffer(), 0, 1 << 20);
    for (int b = 0; b < 64; ++b) pair.target.buffer()[4096 + b] = static_cast<std::uint8_t>(b + 1);

    // One round of every request type; false when anything completed wrongly.
    std::uint64_t round_number = 0;
    auto round = [&]() -> bool {
        ++round_number;
        bool ok = true;
        std::uint8_t* local = initiator.buffer();
        std::memcpy(local, &round_number, 8);
        const mlx5::ScatterGatherElement eight = initiator.local(0, 8);
        ok &= run_signaled(initiator, write_request(1, &eight, remote.buffer_addr, remote.rkey)).status == mlx5::CompletionStatus::success;
        const mlx5::ScatterGatherElement into = initiator.local(64, 64);
        mlx5::SendWorkRequest read = write_request(2, &into, remote.buffer_addr + 4096, remote.rkey);
        read.opcode = mlx5::SendOpcode::rdma_read;
        ok &= run_signaled(initiator, read).status == mlx5::CompletionStatus::success;
        ok &= local[64] == 1 && local[127] == 64;
        ok &= pair.target.post_receive(3, 8192, 64) == mlx5::PostResult::ok;
        mlx5::SendWorkRequest send = write_request(3, &eight, 0, 0);
        send.opcode = mlx5::SendOpcode::send;
        ok &= run_signaled(initiator, send).status == mlx5::CompletionStatus::success;
        const auto received = pair.target.wait_receive();
        ok &= received.has_value() && received->status == mlx5::CompletionStatus::success && received->byte_len == 8;
        const mlx5::ScatterGatherElement old_value = initiator.local(256, 8);
        mlx5::SendWorkRequest add = write_request(4, &old_value, remote.buffer_addr + 512, remote.rkey);
        add.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
        add.compare_add = 1;
        ok &= run_signaled(initiator, add).status == mlx5::CompletionStatus::success;
        std::uint64_t before = 0;
        std::memcpy(&before, local + 256, 8);
        ok &= before == round_number - 1;  // the adds before this one
        return ok;
    };
    // Warm-up, uncounted: the rings' slots and the frames in them reach their sizes.
    for (int i = 0; i < 64; ++i) REQUIRE(round());
    const std::uint64_t from_doorbell_before = pair.initiator_device->requests_from_doorbell();
    std::uint64_t allocations = 0;
    bool all_ok = true;
    for (int i = 0; i < 200; ++i) {
        allocation_test::AllocationCounter counter;
        all_ok &= round();
        allocations += counter.count();
    }
    CHECK(all_ok);
    soft::acquire_remote_writes();
    std::uint64_t landed = 0;
    std::memcpy(&landed, pair.target.buffer(), 8);
    CHECK(landed == round_number);
    CHECK(std::memcmp(pair.target.buffer() + 8192, &round_number, 8) == 0);
    CHECK(allocations == 0);
    // The progress thread takes a doorbell only when it held the device lock at that moment:
    // most of these 800 requests went from this thread.
    const std::uint64_t from_doorbell = pair.initiator_device->requests_from_doorbell() - from_doorbell_before;
    MESSAGE("requests sent from the doorbell thread: " << from_doorbell << " of 800");
    CHECK(from_doorbell > 0);
}

TEST_CASE("doorbell-thread requests: a request no one answers meets its ACK timeout though the progress thread slept") {
    EndpointOptions options;
    options.timeout = 12;  // 16.8 ms per try
    options.retry_cnt = 1;
    Pair pair(options);
    SoftEndpoint& initiator = pair.initiator;
    // Let both progress threads go to sleep with nothing in flight (no deadline).
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const std::uint64_t from_doorbell_before = pair.initiator_device->requests_from_doorbell();
    ScopedPartition partition;  // the request's frame is lost: only the ACK timer can end it
    const mlx5::ScatterGatherElement eight = initiator.local(0, 8);
    mlx5::SendWorkRequest write = write_request(1, &eight, pair.remote.buffer_addr, pair.remote.rkey);
    REQUIRE(initiator.post(&write, 1) == mlx5::PostResult::ok);
    const auto completion = initiator.wait_send(std::chrono::seconds(5));
    REQUIRE(completion.has_value());
    CHECK(completion->status != mlx5::CompletionStatus::success);
    CHECK(completion->syndrome == mlx5::kSyndromeTransportRetryExceeded);
    // It was sent from this thread: the case the timerfd exists for.
    CHECK(pair.initiator_device->requests_from_doorbell() == from_doorbell_before + 1);
}

TEST_CASE("doorbell-thread requests: large writes that fill the socket stay whole and in order") {
    EndpointOptions options;
    options.buffer_size = 48 << 20;
    Pair pair(options);
    SoftEndpoint& initiator = pair.initiator;
    // 48 MiB in one burst: more than the kernel's socket buffers hold, so sends stop part-way and
    // the progress thread writes the rest of the output.
    constexpr std::uint32_t kWrites = 48;
    constexpr std::uint32_t kBytes = 1024 * 1024;
    // Each write carries its own pattern to the same place; the last must win.
    for (std::uint32_t w = 0; w < kWrites; ++w) std::memset(initiator.buffer() + w * kBytes, static_cast<int>(w + 1), kBytes);
    const std::uint64_t from_doorbell_before = pair.initiator_device->requests_from_doorbell();
    for (std::uint32_t w = 0; w < kWrites; ++w) {
        const mlx5::ScatterGatherElement source = initiator.local(w * kBytes, kBytes);
        const mlx5::SendWorkRequest write = write_request(w, &source, pair.remote.buffer_addr, pair.remote.rkey);
        REQUIRE(initiator.post(&write, 1) == mlx5::PostResult::ok);  // one doorbell each
    }
    for (std::uint32_t w = 0; w < kWrites; ++w) {
        const auto completion = initiator.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->wr_id == w);
    }
    soft::acquire_remote_writes();
    CHECK(bytes_differing(pair.target.buffer(), kBytes, kWrites) == 0);
    MESSAGE("requests sent from the doorbell thread: " << pair.initiator_device->requests_from_doorbell() - from_doorbell_before
                                                       << " of " << kWrites);
}
