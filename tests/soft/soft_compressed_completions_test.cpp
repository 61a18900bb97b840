// CQE compression on the software device (transport/soft/held_completions.hpp): CQEs that
// complete in one read turn, into a CQ created for compression, are written as compressed
// sessions where they can share one, and read back through the mlx5 poller's session decoder
// exactly as the same CQEs uncompressed: every wr_id, opcode, byte count and status, in order.
// The requests arrive together (tests/soft/arriving_together.hpp), so that their answers, or the
// receives they consume, complete in one turn.
#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/soft/arriving_together.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::answer_bytes;
using rdmachan::test::EndpointOptions;
using rdmachan::test::expect_send_completions;
using rdmachan::test::frame_bytes;
using rdmachan::test::post_arriving_together;
using rdmachan::test::send_request;
using rdmachan::test::SettledTcpPair;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

EndpointOptions compressed() {
    EndpointOptions options;
    options.compressed_cqes = true;
    return options;
}

struct Counts {
    std::uint64_t sessions;
    std::uint64_t cqes;
};

Counts counts(soft::Device& device) { return {device.compressed_sessions(), device.compressed_cqes()}; }

}  // namespace

TEST_CASE("compressed CQEs: writes acknowledged together complete as one session, in order") {
    SettledTcpPair pair(compressed());
    rdmachan::test::WriteBurst burst(pair);
    constexpr std::uint32_t kWrites = rdmachan::test::WriteBurst::kWrites;
    constexpr std::uint32_t kBytes = rdmachan::test::WriteBurst::kBytes;
    const Counts before = counts(*pair.initiator_device);
    burst.post_and_complete(pair);
    for (std::uint32_t w = 0; w < kWrites; ++w) CHECK(pair.target.buffer()[w * kBytes + kBytes - 1] == w + 1);
    // One ACK acknowledged all sixteen: their CQEs went as one session.
    const Counts after = counts(*pair.initiator_device);
    CHECK(after.sessions - before.sessions == 1);
    CHECK(after.cqes - before.cqes == kWrites);
}

TEST_CASE("compressed CQEs: writes and reads answered in one turn share a session, each read with its byte count") {
    SettledTcpPair pair(compressed());
    SoftEndpoint& initiator = pair.initiator;
    SoftEndpoint& target = pair.target;
    std::memset(target.buffer(), 0, 1 << 16);
    for (int b = 0; b < 200; ++b) target.buffer()[8192 + b] = static_cast<std::uint8_t>(0x40 + b);
    std::memset(initiator.buffer(), 0x11, 64);
    const mlx5::ScatterGatherElement eight = initiator.local(0, 8);
    const mlx5::ScatterGatherElement read_small = initiator.local(4096, 24);
    const mlx5::ScatterGatherElement read_large = initiator.local(8192, 200);
    mlx5::SendWorkRequest requests[5] = {
        write_request(1, &eight, pair.remote.buffer_addr, pair.remote.rkey),
        write_request(2, &read_small, pair.remote.buffer_addr + 8192, pair.remote.rkey),
        write_request(3, &eight, pair.remote.buffer_addr + 64, pair.remote.rkey),
        write_request(4, &read_large, pair.remote.buffer_addr + 8192, pair.remote.rkey),
        write_request(5, &eight, pair.remote.buffer_addr + 128, pair.remote.rkey),
    };
    requests[1].opcode = mlx5::SendOpcode::rdma_read;
    requests[3].opcode = mlx5::SendOpcode::rdma_read;
    const Counts before = counts(*pair.initiator_device);
    // The answers: the ACK held for each write goes before the read answer that follows it
    // (coalesced acknowledgements), so three ACKs and two read answers, read in one turn.
    post_arriving_together(pair, requests, 5, 3 * frame_bytes(8) + 2 * frame_bytes(0),
                           3 * answer_bytes(0) + answer_bytes(24) + answer_bytes(200));

    std::uint32_t lengths[5] = {};
    for (std::uint64_t wr_id = 1; wr_id <= 5; ++wr_id) {
        const auto completion = initiator.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->wr_id == wr_id);
        CHECK(completion->opcode == (wr_id % 2 == 0 ? mlx5::CompletionOpcode::rdma_read : mlx5::CompletionOpcode::rdma_write));
        lengths[wr_id - 1] = completion->byte_len;
    }
    CHECK(lengths[1] == 24);
    CHECK(lengths[3] == 200);
    CHECK(initiator.buffer()[4096 + 23] == 0x40 + 23);
    CHECK(initiator.buffer()[8192 + 199] == static_cast<std::uint8_t>(0x40 + 199));
    const Counts after = counts(*pair.initiator_device);
    CHECK(after.sessions - before.sessions == 1);
    CHECK(after.cqes - before.cqes == 5);
}

TEST_CASE("compressed CQEs: sends received in one turn complete as one receive session, each with its length") {
    SettledTcpPair pair(compressed());
    SoftEndpoint& initiator = pair.initiator;
    SoftEndpoint& target = pair.target;
    constexpr std::uint32_t kSends = 12;
    for (std::uint32_t s = 0; s < kSends; ++s) {
        REQUIRE(target.post_receive(500 + s, 1024 * s, 1024) == mlx5::PostResult::ok);
        std::memset(initiator.buffer() + 1024 * s, static_cast<int>(0x30 + s), 1024);
    }
    mlx5::ScatterGatherElement pieces[kSends];
    mlx5::SendWorkRequest sends[kSends];
    std::size_t bytes = 0;
    for (std::uint32_t s = 0; s < kSends; ++s) {
        pieces[s] = initiator.local(1024 * s, 100 + s);
        sends[s] = send_request(s, &pieces[s], 1, mlx5::SendOpcode::send);
        bytes += frame_bytes(100 + s);
    }
    const Counts before = counts(*pair.target_device);
    post_arriving_together(pair, sends, kSends, bytes);

    for (std::uint32_t s = 0; s < kSends; ++s) {
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->status == mlx5::CompletionStatus::success);
        CHECK(received->wr_id == 500 + s);
        CHECK(received->opcode == mlx5::CompletionOpcode::receive);
        CHECK(received->byte_len == 100 + s);
        CHECK(target.buffer()[1024 * s + 99 + s] == 0x30 + s);
    }
    const Counts after = counts(*pair.target_device);
    CHECK(after.sessions - before.sessions == 1);
    CHECK(after.cqes - before.cqes == kSends);
    const std::vector<mlx5::CompletionOpcode> all_sends(kSends, mlx5::CompletionOpcode::send);
    expect_send_completions(initiator, 0, all_sends);
}

TEST_CASE("compressed CQEs: receives whose immediates differ, or that ask for a solicited event, stay plain") {
    SettledTcpPair pair(compressed());
    SoftEndpoint& initiator = pair.initiator;
    SoftEndpoint& target = pair.target;
    constexpr std::uint32_t kSends = 6;
    for (std::uint32_t s = 0; s < kSends; ++s) REQUIRE(target.post_receive(700 + s, 256 * s, 256) == mlx5::PostResult::ok);
    std::memset(initiator.buffer(), 0x5a, 64);
    const mlx5::ScatterGatherElement piece = initiator.local(0, 16);
    mlx5::SendWorkRequest sends[kSends];
    for (std::uint32_t s = 0; s < kSends; ++s) {
        sends[s] = send_request(s, &piece, 1, mlx5::SendOpcode::send_with_immediate);
        sends[s].immediate = 0x1000 + s;  // each its own: no two share a title
    }
    sends[kSends - 1].flags |= mlx5::kSendSolicited;
    const Counts before = counts(*pair.target_device);
    post_arriving_together(pair, sends, kSends, kSends * frame_bytes(16));

    for (std::uint32_t s = 0; s < kSends; ++s) {
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->status == mlx5::CompletionStatus::success);
        CHECK(received->wr_id == 700 + s);
        CHECK(received->immediate == 0x1000 + s);
        CHECK(received->byte_len == 16);
    }
    const Counts after = counts(*pair.target_device);
    CHECK(after.sessions == before.sessions);
    CHECK(after.cqes == before.cqes);
}

TEST_CASE("compressed CQEs: an error ends the session before it, and the flushed requests follow it") {
    SettledTcpPair pair(compressed());
    SoftEndpoint& initiator = pair.initiator;
    std::memset(initiator.buffer(), 0x22, 64);
    const mlx5::ScatterGatherElement eight = initiator.local(0, 8);
    constexpr std::uint32_t kWrites = 6;
    mlx5::SendWorkRequest writes[kWrites];
    for (std::uint32_t w = 0; w < kWrites; ++w) writes[w] = write_request(10 + w, &eight, pair.remote.buffer_addr + 64 * w, pair.remote.rkey);
    writes[3].rkey = pair.remote.rkey + 1;  // no such key at the target
    post_arriving_together(pair, writes, kWrites, kWrites * frame_bytes(8));

    for (std::uint64_t wr_id = 10; wr_id < 10 + kWrites; ++wr_id) {
        const auto completion = initiator.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->wr_id == wr_id);
        if (wr_id < 13) {
            CHECK(completion->status == mlx5::CompletionStatus::success);
        } else if (wr_id == 13) {
            CHECK(completion->status == mlx5::CompletionStatus::remote_access_error);
        } else {
            CHECK(completion->status == mlx5::CompletionStatus::work_request_flushed);
        }
    }
}
