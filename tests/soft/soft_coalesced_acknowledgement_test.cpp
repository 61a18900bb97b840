// Coalesced acknowledgements on the TCP path (transport/soft/README.md, "Coalesced
// acknowledgements"): the responder answers the plain RDMA writes it reads from a socket in one
// turn with one ACK, the last write's, which acknowledges the earlier ones too (IB spec 9.7.5.1.1);
// the requester completes them all, in order. Any other answer leaves after the ACK it would
// otherwise overtake. The requests arrive together (tests/soft/arriving_together.hpp).
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/soft/arriving_together.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::expect_send_completions;
using rdmachan::test::frame_bytes;
using rdmachan::test::post_arriving_together;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;
using Pair = rdmachan::test::SettledTcpPair;

TEST_CASE("coalesced acknowledgements: writes read together are answered by one ACK and complete in order") {
    Pair pair;
    rdmachan::test::WriteBurst burst(pair);
    constexpr std::uint32_t kWrites = rdmachan::test::WriteBurst::kWrites;
    constexpr std::uint32_t kBytes = rdmachan::test::WriteBurst::kBytes;
    const std::uint64_t coalesced_before = pair.target_device->acknowledgements_coalesced();
    burst.post_and_complete(pair);
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
