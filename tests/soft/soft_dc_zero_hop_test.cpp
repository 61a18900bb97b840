// Zero-hop DC (issue 17, zero_hop.cpp): RDMA writes, reads and atomics from a DCI to a DCT of a
// same-host device run on the thread that rings the DCI's doorbell, checked against the DCT's
// published entry (in RTR, its access key) and the region's, as handle_dc_request checks them.
// Here: the completions and bytes are the request path's (RDMACHAN_SOFT_ZERO_HOP=0); a wrong DC
// key still gets the request path's NAK, the target untouched and the violation counted; and a
// DCI mixing zero-hop writes with sends (request path, through the DCT's SRQ) to two DCTs keeps
// every completion in posting order, the DCT learning of the DCI from its first request-path
// request even when the DCI's connect went zero-hop.
#include <doctest/doctest.h>

#include <cstring>
#include <vector>

#include "tests/soft/scoped_environment.hpp"
#include "tests/soft/fill_pattern.hpp"
#include "tests/soft/soft_dc_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::complete;
using rdmachan::test::dc_request;
using rdmachan::test::DcInitiatorEndpoint;
using rdmachan::test::DcTargetAddress;
using rdmachan::test::DcTargetEndpoint;
using rdmachan::test::Environment;
using rdmachan::test::fill_pattern;
using rdmachan::test::kDcKey;

namespace {

// What one run of every kind left: the completions, the target's bytes, the initiator's bytes
// (reads and atomic results land there), and how many went zero-hop.
struct DcKinds {
    std::vector<mlx5::Completion> completions;
    std::vector<std::uint8_t> target_bytes;
    std::vector<std::uint8_t> initiator_bytes;
    std::uint64_t zero_hop = 0;
};

DcKinds run_dc_kinds(const char* zero_hop) {
    Environment setting("RDMACHAN_SOFT_ZERO_HOP", zero_hop);
    DcTargetEndpoint target(soft::Device::open());
    auto initiator_device = soft::Device::open();
    DcInitiatorEndpoint initiator(initiator_device);
    const DcTargetAddress to = target.address();
    fill_pattern(target.buffer(), 65536, 3);
    fill_pattern(initiator.buffer(), 65536, 101);
    std::memset(initiator.buffer() + 131072, 0, 65536);
    // The first request opens the connection to the target's device (the request path); its
    // completion comes after the hello reply, so the path is settled from here on.
    mlx5::ScatterGatherElement element = initiator.local(0, 64);
    DcKinds kinds;
    kinds.completions.push_back(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr + 60000, to.rkey), to));
    const std::uint64_t before = initiator_device->zero_hop_writes() + initiator_device->zero_hop_reads();
    element = initiator.local(100, 4000);
    kinds.completions.push_back(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 2, &element, to.buffer_addr + 8192, to.rkey), to));
    element = initiator.local(0, 8);  // inline
    kinds.completions.push_back(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 3, &element, to.buffer_addr + 3, to.rkey), to));
    element = initiator.local(131072, 5000);
    kinds.completions.push_back(complete(initiator, dc_request(mlx5::SendOpcode::rdma_read, 4, &element, to.buffer_addr + 20000, to.rkey), to));
    element = initiator.local(140000, 8);
    mlx5::SendWorkRequest add = dc_request(mlx5::SendOpcode::atomic_fetch_and_add, 5, &element, to.buffer_addr + 40000, to.rkey);
    add.compare_add = 0x1234;
    kinds.completions.push_back(complete(initiator, add, to));
    element = initiator.local(140008, 8);
    mlx5::SendWorkRequest swap = dc_request(mlx5::SendOpcode::atomic_compare_and_swap, 6, &element, to.buffer_addr + 40000, to.rkey);
    swap.compare_add = 0;  // not taken: the word is not 0
    swap.swap = 77;
    kinds.completions.push_back(complete(initiator, swap, to));
    kinds.zero_hop = initiator_device->zero_hop_writes() + initiator_device->zero_hop_reads() - before;
    soft::acquire_remote_writes();
    kinds.target_bytes.assign(target.buffer(), target.buffer() + 65536);
    kinds.initiator_bytes.assign(initiator.buffer() + 131072, initiator.buffer() + 131072 + 16384);
    return kinds;
}

}  // namespace

TEST_CASE("DC zero-hop: writes, reads and atomics to a same-host DCT complete as on the request path, the bytes the same") {
    const DcKinds zero_hop = run_dc_kinds("1");
    const DcKinds request_path = run_dc_kinds("0");
    CHECK(zero_hop.zero_hop == 3);  // two writes and the read; the atomics' words are not in an arena
    CHECK(request_path.zero_hop == 0);
    REQUIRE(zero_hop.completions.size() == request_path.completions.size());
    for (std::size_t i = 0; i < zero_hop.completions.size(); ++i) {
        const mlx5::Completion& mine = zero_hop.completions[i];
        const mlx5::Completion& theirs = request_path.completions[i];
        CAPTURE(i);
        CHECK(mine.status == mlx5::CompletionStatus::success);
        CHECK(mine.status == theirs.status);
        CHECK(mine.wr_id == theirs.wr_id);
        CHECK(mine.opcode == theirs.opcode);
        CHECK(mine.byte_len == theirs.byte_len);
        CHECK(mine.is_receive == theirs.is_receive);
    }
    CHECK(zero_hop.target_bytes == request_path.target_bytes);
    CHECK(zero_hop.initiator_bytes == request_path.initiator_bytes);
}

TEST_CASE("DC zero-hop: a wrong DC key gets the request path's remote access error, the DCT's memory untouched") {
    Environment setting("RDMACHAN_SOFT_ZERO_HOP", "1");
    DcTargetEndpoint target(soft::Device::open());
    auto initiator_device = soft::Device::open();
    DcInitiatorEndpoint initiator(initiator_device);
    const DcTargetAddress to = target.address();
    std::memset(target.buffer(), 0, 8192);
    fill_pattern(initiator.buffer(), 8192, 5);
    mlx5::ScatterGatherElement element = initiator.local(0, 64);
    REQUIRE(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr, to.rkey), to).status ==
            mlx5::CompletionStatus::success);
    const std::uint64_t before = initiator_device->zero_hop_writes();
    element = initiator.local(0, 4096);
    const mlx5::Completion refused =
        complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 2, &element, to.buffer_addr + 4096, to.rkey), to, kDcKey + 1);
    CHECK(refused.status == mlx5::CompletionStatus::remote_access_error);
    CHECK(initiator_device->zero_hop_writes() == before);
    CHECK(target.target().key_violations() == 1);
    std::uint32_t changed = 0;
    for (std::uint32_t b = 4096; b < 8192; ++b) changed += target.buffer()[b] != 0;
    CHECK(changed == 0);
}

TEST_CASE("DC zero-hop: one DCI mixing zero-hop writes and request-path sends to two DCTs keeps posting order, and each DCT learns of it") {
    Environment setting("RDMACHAN_SOFT_ZERO_HOP", "1");
    DcTargetEndpoint first(soft::Device::open());
    DcTargetEndpoint second(soft::Device::open());
    auto initiator_device = soft::Device::open();
    DcInitiatorEndpoint initiator(initiator_device);
    const DcTargetAddress targets[2] = {first.address(), second.address()};
    DcTargetEndpoint* endpoints[2] = {&first, &second};
    // Settle both paths.
    mlx5::ScatterGatherElement element = initiator.local(0, 8);
    for (const DcTargetAddress& to : targets) {
        REQUIRE(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr, to.rkey), to).status ==
                mlx5::CompletionStatus::success);
    }
    const std::uint64_t before = initiator_device->zero_hop_writes();
    // Each round, to one DCT after the other: a write (its connect goes zero-hop when the DCI
    // moved to that DCT), then a send, which must reach the DCT's SRQ with a connect of its own.
    constexpr std::uint32_t kRounds = 20;
    for (std::uint32_t i = 0; i < kRounds; ++i) {
        REQUIRE(first.post_receive(i, 512 * 1024 + i * 256, 256) == mlx5::PostResult::ok);
        REQUIRE(second.post_receive(i, 512 * 1024 + i * 256, 256) == mlx5::PostResult::ok);
    }
    std::uint64_t wr_id = 100;
    for (std::uint32_t i = 0; i < 2 * kRounds; ++i) {
        const DcTargetAddress& to = targets[i % 2];
        fill_pattern(initiator.buffer() + i * 512, 512, static_cast<std::uint8_t>(i));
        element = initiator.local(i * 512, 256);
        REQUIRE(initiator.post(dc_request(mlx5::SendOpcode::rdma_write, wr_id++, &element, to.buffer_addr + 65536 + i * 256, to.rkey),
                               to) == mlx5::PostResult::ok);
        element = initiator.local(i * 512 + 256, 200);
        mlx5::SendWorkRequest send = dc_request(mlx5::SendOpcode::send_with_immediate, wr_id++, &element);
        send.immediate = i;
        REQUIRE(initiator.post(send, to) == mlx5::PostResult::ok);
    }
    for (std::uint64_t expected = 100; expected < wr_id; ++expected) {
        const auto done = initiator.wait_send();
        REQUIRE_MESSAGE(done.has_value(), "no completion for wr_id " << expected);
        CHECK(done->status == mlx5::CompletionStatus::success);
        CHECK(done->wr_id == expected);
    }
    CHECK(initiator_device->zero_hop_writes() > before);  // some writes went zero-hop
    soft::acquire_remote_writes();
    for (std::uint32_t i = 0; i < 2 * kRounds; ++i) {
        DcTargetEndpoint& target = *endpoints[i % 2];
        CHECK(std::memcmp(target.buffer() + 65536 + i * 256, initiator.buffer() + i * 512, 256) == 0);
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->status == mlx5::CompletionStatus::success);
        CHECK(received->immediate == i);
        CHECK(received->wr_id == i / 2);
        CHECK(received->src_qp == initiator.initiator().qpn());
        CHECK(std::memcmp(target.buffer() + 512 * 1024 + (i / 2) * 256, initiator.buffer() + i * 512 + 256, 200) == 0);
    }
}
