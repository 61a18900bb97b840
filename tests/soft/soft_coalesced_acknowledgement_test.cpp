// Coalesced acknowledgements on the TCP path (transport/soft/README.md, "Coalesced
// acknowledgements"): the responder answers the plain RDMA writes it reads from a socket in one
// turn with one ACK, the last write's, which acknowledges the earlier ones too (IB spec 9.7.5.1.1);
// the requester completes them all, in order. Any other answer leaves after the ACK it would
// otherwise overtake.
//
// To make the requests arrive together, the test holds the target device's mutex (its progress
// thread reads its sockets only under it) while the initiator sends them all, and lets go once
// every one is in flight, that is, written to the socket.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "tests/soft/device_pair.hpp"
#include "tests/soft/eventually.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device_core.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::expect_send_completions;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::TcpDevicePair;
using rdmachan::test::write_request;

namespace {

struct Pair : TcpDevicePair {
    Pair() {
        // The target's own connection to the initiator (opened when its QP reached RTS) settled
        // too: nothing of its set-up is left for the target's thread while the test holds it.
        REQUIRE(rdmachan::test::eventually([&] { return target_device->answered_hellos() >= 1; }));
    }
};

std::size_t requests_in_flight(soft::Device& device) {
    soft::DeviceCore& core = device.core();
    std::lock_guard lock(core.mutex);
    std::size_t count = 0;
    for (const auto& [qpn, queue_pair] : core.queue_pairs) count += queue_pair->in_flight.size();
    return count;
}

// The bytes of a request frame carrying `payload` bytes.
constexpr std::size_t frame_bytes(std::size_t payload) {
    return sizeof(soft::wire::FrameHeader) + sizeof(soft::wire::Request) + payload;
}

// Posts `requests` with one doorbell while the target's progress thread cannot read, waits
// until their `bytes` frames are all in the target's socket (waiting until they are in flight is
// not enough: the sender's kernel holds back what a fresh connection's receive window, 64 KiB,
// does not admit before the receiver reads), then lets the target read them, in one turn.
void post_arriving_together(Pair& pair, const mlx5::SendWorkRequest* requests, std::uint32_t count, std::size_t bytes) {
    soft::DeviceCore& target = pair.target_device->core();
    std::unique_lock held(target.mutex);
    REQUIRE(pair.initiator.post(requests, count) == mlx5::PostResult::ok);
    REQUIRE(rdmachan::test::eventually([&] { return requests_in_flight(*pair.initiator_device) == count; }));
    const bool arrived = rdmachan::test::eventually([&] { return target.unread_request_bytes() == bytes; });
    INFO("bytes in the target's sockets: " << target.unread_request_bytes() << " of " << bytes);
    REQUIRE(arrived);
}

}  // namespace

TEST_CASE("coalesced acknowledgements: writes read together are answered by one ACK and complete in order") {
    Pair pair;
    SoftEndpoint& initiator = pair.initiator;
    constexpr std::uint32_t kWrites = 16;
    // Sixteen frames well inside the 64 KiB a fresh connection's receive window admits before
    // the receiver reads: all arrive while the target's thread is held (4 KiB writes did not).
    constexpr std::uint32_t kBytes = 2048;
    std::memset(pair.target.buffer(), 0, kWrites * kBytes);
    for (std::uint32_t w = 0; w < kWrites; ++w) std::memset(initiator.buffer() + w * kBytes, static_cast<int>(w + 1), kBytes);
    mlx5::ScatterGatherElement sources[kWrites];
    mlx5::SendWorkRequest writes[kWrites];
    for (std::uint32_t w = 0; w < kWrites; ++w) {
        sources[w] = initiator.local(w * kBytes, kBytes);
        writes[w] = write_request(100 + w, &sources[w], pair.remote.buffer_addr + w * kBytes, pair.remote.rkey);
    }
    const std::uint64_t coalesced_before = pair.target_device->acknowledgements_coalesced();
    post_arriving_together(pair, writes, kWrites, kWrites * frame_bytes(kBytes));

    const std::vector<mlx5::CompletionOpcode> all_writes(kWrites, mlx5::CompletionOpcode::rdma_write);
    expect_send_completions(initiator, 100, all_writes);
    soft::acquire_remote_writes();
    for (std::uint32_t w = 0; w < kWrites; ++w) {
        CHECK(pair.target.buffer()[w * kBytes] == w + 1);
        CHECK(pair.target.buffer()[w * kBytes + kBytes - 1] == w + 1);
    }
    // Sixteen writes in one turn: the first fifteen ACKs were covered by the last one.
    CHECK(pair.target_device->acknowledgements_coalesced() - coalesced_before == kWrites - 1);
}

TEST_CASE("coalesced acknowledgements: a read and a send between writes are answered in their order") {
    Pair pair;
    SoftEndpoint& initiator = pair.initiator;
    SoftEndpoint& target = pair.target;
    std::memset(target.buffer(), 0, 1 << 16);
    for (int b = 0; b < 64; ++b) target.buffer()[8192 + b] = static_cast<std::uint8_t>(0xa0 + b);
    std::memset(initiator.buffer(), 0x11, 64);
    REQUIRE(target.post_receive(7, 16384, 64) == mlx5::PostResult::ok);

    const mlx5::ScatterGatherElement eight = initiator.local(0, 8);
    const mlx5::ScatterGatherElement into = initiator.local(4096, 64);
    mlx5::SendWorkRequest requests[6] = {
        write_request(1, &eight, pair.remote.buffer_addr, pair.remote.rkey),
        write_request(2, &eight, pair.remote.buffer_addr + 64, pair.remote.rkey),
        write_request(3, &into, pair.remote.buffer_addr + 8192, pair.remote.rkey),
        write_request(4, &eight, pair.remote.buffer_addr + 128, pair.remote.rkey),
        write_request(5, &eight, 0, 0),
        write_request(6, &eight, pair.remote.buffer_addr + 192, pair.remote.rkey),
    };
    requests[2].opcode = mlx5::SendOpcode::rdma_read;
    requests[4].opcode = mlx5::SendOpcode::send;
    const std::uint64_t coalesced_before = pair.target_device->acknowledgements_coalesced();
    // Five frames carry 8 bytes (four writes and the send, inline), the read none.
    post_arriving_together(pair, requests, 6, 5 * frame_bytes(8) + frame_bytes(0));

    const mlx5::CompletionOpcode expected[6] = {mlx5::CompletionOpcode::rdma_write, mlx5::CompletionOpcode::rdma_write,
                                                mlx5::CompletionOpcode::rdma_read,  mlx5::CompletionOpcode::rdma_write,
                                                mlx5::CompletionOpcode::send,       mlx5::CompletionOpcode::rdma_write};
    expect_send_completions(initiator, 1, expected);
    CHECK(initiator.buffer()[4096] == 0xa0);
    CHECK(initiator.buffer()[4096 + 63] == 0xa0 + 63);
    const auto received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->status == mlx5::CompletionStatus::success);
    CHECK(received->byte_len == 8);
    soft::acquire_remote_writes();
    for (int offset : {0, 64, 128, 192}) CHECK(target.buffer()[offset] == 0x11);
    // Only the ACK of the first write was covered (by the second's); the read's answer and the
    // send's sent the ACK held before them.
    CHECK(pair.target_device->acknowledgements_coalesced() - coalesced_before == 1);
}
