// Scatter-to-CQE on the software device: for a QP created with it, a received send of up to 32
// bytes, and the answer to a signaled read of up to 32 bytes or to an atomic, travel in the CQE
// (format 1 in op_own bits 3:2) instead of into memory, and the mlx5 poller copies them to the
// buffers the WQE names. Each case first waits for the CQE to be written and checks its format
// and that the buffer is still untouched (the data is in the CQE, not in memory), then polls and
// checks the bytes. Larger payloads, and unsignaled reads, land in memory under a plain CQE.
// On the TCP path: the same-host path's zero-hop moves never write data into a CQE.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <thread>

#include "tests/soft/device_pair.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::EndpointOptions;
using rdmachan::test::send_request;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::TcpDevicePair;
using rdmachan::test::write_request;

namespace {

EndpointOptions scattering() {
    EndpointOptions options;
    options.scatter_to_cqe = true;
    return options;
}

// The op_own byte of the CQE at free-running `index` of `cq`, once the device wrote it (the
// owner bit of that pass); 0xff if it did not within the deadline.
std::uint8_t written_op_own(soft::CompletionQueue& cq, std::uint32_t index) {
    const mlx5::CompletionQueueRing ring = cq.ring();
    const std::uint8_t* op_own = ring.buffer + static_cast<std::size_t>(index & (ring.cqe_count - 1)) * ring.cqe_size +
                                 ring.cqe_size - 1;
    const std::uint8_t owner = (index / ring.cqe_count) & 1;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::chrono::steady_clock::now() < until) {
        const std::uint8_t value = __atomic_load_n(op_own, __ATOMIC_ACQUIRE);
        if ((value >> 4) != mlx5::kCqeInvalid && (value & 1) == owner) return value;
        std::this_thread::yield();
    }
    return 0xff;
}

std::uint8_t format_of(std::uint8_t op_own) { return (op_own >> 2) & 3; }

bool all_equal(const std::uint8_t* bytes, std::size_t length, std::uint8_t value) {
    for (std::size_t i = 0; i < length; ++i) {
        if (bytes[i] != value) return false;
    }
    return true;
}

}  // namespace

TEST_CASE("scatter-to-CQE: received sends of up to 32 bytes travel in the CQE, longer ones in memory") {
    TcpDevicePair pair(scattering());
    SoftEndpoint& initiator = pair.initiator;
    SoftEndpoint& target = pair.target;
    std::uint32_t received = 0;  // receive CQEs so far
    for (const std::uint32_t length : {1u, 17u, 32u, 33u, 200u}) {
        CAPTURE(length);
        const std::uint64_t at = 4096 * (received + 1);
        std::memset(target.buffer() + at, 0, 256);
        for (std::uint32_t i = 0; i < length; ++i) initiator.buffer()[at + i] = static_cast<std::uint8_t>(length + i);
        REQUIRE(target.post_receive(900 + received, at, 256) == mlx5::PostResult::ok);
        const mlx5::ScatterGatherElement piece = initiator.local(at, length);
        const mlx5::SendWorkRequest send = send_request(received, &piece, 1, mlx5::SendOpcode::send);
        REQUIRE(initiator.post(&send, 1) == mlx5::PostResult::ok);

        const std::uint8_t op_own = written_op_own(target.receive_cq(), received);
        REQUIRE(op_own != 0xff);
        CHECK((op_own >> 4) == mlx5::kCqeResponderSend);
        if (length <= 32) {
            CHECK(format_of(op_own) == mlx5::kCqeFormatInlineScatter32);
            CHECK(all_equal(target.buffer() + at, 256, 0));  // not in memory until polled
        } else {
            CHECK(format_of(op_own) == 0);
        }
        const auto completion = target.wait_receive();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->wr_id == 900 + received);
        CHECK(completion->byte_len == length);
        CHECK(std::memcmp(target.buffer() + at, initiator.buffer() + at, length) == 0);
        CHECK(all_equal(target.buffer() + at + length, 256 - length, 0));
        REQUIRE(initiator.wait_send().has_value());
        ++received;
    }
}

TEST_CASE("scatter-to-CQE: a signaled read of up to 32 bytes and an atomic answer in the CQE") {
    TcpDevicePair pair(scattering());  // its first read (settle_path) took send CQE 0
    SoftEndpoint& initiator = pair.initiator;
    SoftEndpoint& target = pair.target;
    for (int b = 0; b < 256; ++b) target.buffer()[8192 + b] = static_cast<std::uint8_t>(0x80 + b);
    std::uint64_t counter = 41;
    std::memcpy(target.buffer() + 16384, &counter, sizeof counter);
    std::memset(initiator.buffer() + 4096, 0, 512);
    std::uint32_t sent = 1;  // send CQEs so far

    struct Read {
        std::uint32_t length;
        bool in_cqe;
    };
    for (const Read read : {Read{24, true}, Read{32, true}, Read{33, false}, Read{100, false}}) {
        CAPTURE(read.length);
        const mlx5::ScatterGatherElement into = initiator.local(4096, read.length);
        mlx5::SendWorkRequest request = write_request(sent, &into, pair.remote.buffer_addr + 8192, pair.remote.rkey);
        request.opcode = mlx5::SendOpcode::rdma_read;
        std::memset(initiator.buffer() + 4096, 0, 512);
        REQUIRE(initiator.post(&request, 1) == mlx5::PostResult::ok);
        const std::uint8_t op_own = written_op_own(initiator.send_cq(), sent);
        REQUIRE(op_own != 0xff);
        CHECK((op_own >> 4) == mlx5::kCqeRequester);
        CHECK(format_of(op_own) == (read.in_cqe ? mlx5::kCqeFormatInlineScatter32 : 0));
        if (read.in_cqe) CHECK(all_equal(initiator.buffer() + 4096, 512, 0));
        const auto completion = initiator.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->byte_len == read.length);
        CHECK(std::memcmp(initiator.buffer() + 4096, target.buffer() + 8192, read.length) == 0);
        CHECK(all_equal(initiator.buffer() + 4096 + read.length, 512 - read.length, 0));
        ++sent;
    }

    const mlx5::ScatterGatherElement result = initiator.local(6144, 8);
    mlx5::SendWorkRequest add = write_request(sent, &result, pair.remote.buffer_addr + 16384, pair.remote.rkey);
    add.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
    add.compare_add = 1;
    std::memset(initiator.buffer() + 6144, 0, 8);
    REQUIRE(initiator.post(&add, 1) == mlx5::PostResult::ok);
    const std::uint8_t op_own = written_op_own(initiator.send_cq(), sent);
    REQUIRE(op_own != 0xff);
    CHECK(format_of(op_own) == mlx5::kCqeFormatInlineScatter32);
    const auto completion = initiator.wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::success);
    CHECK(completion->byte_len == 8);
    std::uint64_t fetched = 0;
    std::memcpy(&fetched, initiator.buffer() + 6144, sizeof fetched);
    CHECK(fetched == 41);
}

TEST_CASE("scatter-to-CQE: an unsignaled small read lands in memory, the signaled write after it completes plain") {
    TcpDevicePair pair(scattering());
    SoftEndpoint& initiator = pair.initiator;
    SoftEndpoint& target = pair.target;
    for (int b = 0; b < 16; ++b) target.buffer()[8192 + b] = static_cast<std::uint8_t>(0x10 + b);
    std::memset(initiator.buffer() + 4096, 0, 64);
    const mlx5::ScatterGatherElement into = initiator.local(4096, 16);
    const mlx5::ScatterGatherElement eight = initiator.local(0, 8);
    mlx5::SendWorkRequest requests[2] = {
        write_request(1, &into, pair.remote.buffer_addr + 8192, pair.remote.rkey, 0),
        write_request(2, &eight, pair.remote.buffer_addr + 64, pair.remote.rkey),
    };
    requests[0].opcode = mlx5::SendOpcode::rdma_read;
    REQUIRE(initiator.post(requests, 2) == mlx5::PostResult::ok);
    const std::uint8_t op_own = written_op_own(initiator.send_cq(), 1);
    REQUIRE(op_own != 0xff);
    CHECK(format_of(op_own) == 0);
    const auto completion = initiator.wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->wr_id == 2);
    CHECK(std::memcmp(initiator.buffer() + 4096, target.buffer() + 8192, 16) == 0);
}
