// Zero-hop DC (zero_hop.cpp): RDMA writes, reads and atomics from a DCI to a DCT of a
// same-host device run on the thread that rings the DCI's doorbell, checked against the DCT's
// published entry (in RTR, its access key) and the region's, as handle_dc_request checks them.
// Here: the completions and bytes are the request path's (RDMACHAN_SOFT_ZERO_HOP=0); a wrong DC
// key still gets the request path's NAK, the target untouched and the violation counted; and a
// DCI mixing zero-hop writes with sends (request path, through the DCT's SRQ) to two DCTs keeps
// every completion in posting order, the DCT learning of the DCI from its first request-path
// request even when the DCI's connect went zero-hop.
#include <doctest/doctest.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "tests/sanitizer_build.hpp"
#include "tests/soft/scoped_environment.hpp"
#include "tests/soft/fill_pattern.hpp"
#include "tests/soft/soft_dc_endpoint.hpp"
#include "tests/soft/soft_endpoint.hpp"

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

namespace {

// What one run of the kinds that consume a DCT's SRQ WQE left: the sender's and the DCT's
// completions, the DCT's bytes, and how many went zero-hop.
struct DcReceives {
    std::vector<mlx5::Completion> sent;
    std::vector<mlx5::Completion> received;
    std::vector<std::uint8_t> target_bytes;
    std::uint64_t zero_hop = 0;
    std::uint16_t initiator_lid = 0;
    std::uint32_t initiator_qpn = 0;
};

DcReceives run_dc_receives(const char* zero_hop) {
    Environment setting("RDMACHAN_SOFT_ZERO_HOP", zero_hop);
    DcTargetEndpoint target(soft::Device::open(), kDcKey, 1 << 20, 1, true);
    auto initiator_device = soft::Device::open();
    DcInitiatorEndpoint initiator(initiator_device, 17, 1 << 20, true);
    const DcTargetAddress to = target.address();
    std::memset(target.buffer(), 0xee, 262144);
    fill_pattern(initiator.buffer(), 65536, 29);
    mlx5::ScatterGatherElement element = initiator.local(0, 64);
    // Settles the path to the target's device (the first request goes the request path).
    REQUIRE(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr + 200000, to.rkey), to).status ==
            mlx5::CompletionStatus::success);
    for (std::uint32_t i = 0; i < 6; ++i) REQUIRE(target.post_receive(10 + i, 65536 + i * 8192, 8192) == mlx5::PostResult::ok);
    const std::uint64_t before = initiator_device->zero_hop_receives();
    DcReceives run;
    element = initiator.local(0, 40);  // inline
    run.sent.push_back(complete(initiator, dc_request(mlx5::SendOpcode::send, 2, &element), to));
    element = initiator.local(64, 5000);
    run.sent.push_back(complete(initiator, dc_request(mlx5::SendOpcode::send, 3, &element), to));
    element = initiator.local(8192, 300);
    mlx5::SendWorkRequest with_immediate = dc_request(mlx5::SendOpcode::send_with_immediate, 4, &element);
    with_immediate.immediate = 0xabcd0123;
    run.sent.push_back(complete(initiator, with_immediate, to));
    element = initiator.local(16384, 3000);
    mlx5::SendWorkRequest write = dc_request(mlx5::SendOpcode::rdma_write_with_immediate, 5, &element, to.buffer_addr + 4096, to.rkey);
    write.immediate = 77;
    run.sent.push_back(complete(initiator, write, to));
    run.sent.push_back(complete(initiator, dc_request(mlx5::SendOpcode::send, 6, nullptr), to));  // no bytes
    element = initiator.local(32768, 8192);  // fills its receive exactly
    run.sent.push_back(complete(initiator, dc_request(mlx5::SendOpcode::send, 7, &element), to));
    run.zero_hop = initiator_device->zero_hop_receives() - before;
    run.initiator_lid = initiator.lid();
    run.initiator_qpn = initiator.initiator().qpn();
    for (std::uint32_t i = 0; i < 6; ++i) {
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        run.received.push_back(*received);
    }
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(20)).has_value());
    soft::acquire_remote_writes();
    run.target_bytes.assign(target.buffer(), target.buffer() + 262144);
    return run;
}

}  // namespace

TEST_CASE("DC zero-hop receives: sends and writes with immediate into a same-host DCT's SRQ complete as on the request path") {
    const DcReceives zero_hop = run_dc_receives("1");
    const DcReceives request_path = run_dc_receives("0");
    CHECK(zero_hop.zero_hop == 6);
    CHECK(request_path.zero_hop == 0);
    REQUIRE(zero_hop.sent.size() == request_path.sent.size());
    for (std::size_t i = 0; i < zero_hop.sent.size(); ++i) {
        CAPTURE(i);
        CHECK(zero_hop.sent[i].status == mlx5::CompletionStatus::success);
        CHECK(zero_hop.sent[i].status == request_path.sent[i].status);
        CHECK(zero_hop.sent[i].wr_id == request_path.sent[i].wr_id);
        CHECK(zero_hop.sent[i].opcode == request_path.sent[i].opcode);
    }
    REQUIRE(zero_hop.received.size() == request_path.received.size());
    for (std::size_t i = 0; i < zero_hop.received.size(); ++i) {
        const mlx5::Completion& mine = zero_hop.received[i];
        const mlx5::Completion& theirs = request_path.received[i];
        CAPTURE(i);
        CHECK(mine.status == mlx5::CompletionStatus::success);
        CHECK(mine.status == theirs.status);
        CHECK(mine.wr_id == theirs.wr_id);
        CHECK(mine.opcode == theirs.opcode);
        CHECK(mine.flags == theirs.flags);
        CHECK(mine.is_receive == theirs.is_receive);
        CHECK(mine.byte_len == theirs.byte_len);
        CHECK(mine.immediate == theirs.immediate);
        CHECK(mine.qp_num == theirs.qp_num);
        CHECK(mine.sl == theirs.sl);
        CHECK(mine.pkey_index == theirs.pkey_index);
        // The sender's device and DCI differ between the runs: each names its own.
        CHECK(mine.slid == zero_hop.initiator_lid);
        CHECK(theirs.slid == request_path.initiator_lid);
        CHECK(mine.src_qp == zero_hop.initiator_qpn);
        CHECK(theirs.src_qp == request_path.initiator_qpn);
    }
    CHECK(zero_hop.target_bytes == request_path.target_bytes);
}

TEST_CASE("DC zero-hop receives: no WQE in the SRQ takes the request path (RNR, the retry delivers), the sends after it wait, then go zero-hop") {
    Environment setting("RDMACHAN_SOFT_ZERO_HOP", "1");
    DcTargetEndpoint target(soft::Device::open(), kDcKey, 1 << 20, 1, true);
    auto initiator_device = soft::Device::open();
    DcInitiatorEndpoint initiator(initiator_device, 17, 1 << 20, true);
    const DcTargetAddress to = target.address();
    mlx5::ScatterGatherElement element = initiator.local(0, 64);
    REQUIRE(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr + 200000, to.rkey), to).status ==
            mlx5::CompletionStatus::success);
    constexpr std::uint32_t kSends = 11;
    for (std::uint32_t i = 0; i < kSends; ++i) {
        fill_pattern(initiator.buffer() + i * 64, 64, static_cast<std::uint8_t>(i));
        element = initiator.local(i * 64, 64);
        REQUIRE(initiator.post(dc_request(mlx5::SendOpcode::send, 100 + i, &element), to) == mlx5::PostResult::ok);
    }
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(50)).has_value());
    for (std::uint32_t i = 0; i < kSends; ++i) REQUIRE(target.post_receive(i, 65536 + i * 64, 64) == mlx5::PostResult::ok);
    for (std::uint32_t i = 0; i < kSends; ++i) {
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->status == mlx5::CompletionStatus::success);
        CHECK(received->wr_id == i);
        CHECK(received->src_qp == initiator.initiator().qpn());
    }
    for (std::uint32_t i = 0; i < kSends; ++i) {
        const auto sent = initiator.wait_send();
        REQUIRE(sent.has_value());
        CHECK(sent->status == mlx5::CompletionStatus::success);
        CHECK(sent->wr_id == 100 + i);
    }
    soft::acquire_remote_writes();
    for (std::uint32_t i = 0; i < kSends; ++i) CHECK(std::memcmp(target.buffer() + 65536 + i * 64, initiator.buffer() + i * 64, 64) == 0);
    // The refused one took the request path; those behind it waited for its answer and went
    // zero-hop (one more may still find the target's receive lock busy past the brief wait and
    // take the request path too). Without that wait each found the lock held by the target's
    // answer to the one before, on a loaded machine, and all ten took the request path.
    const std::uint64_t zero_hop = initiator_device->zero_hop_receives();
    MESSAGE(zero_hop << " of the " << kSends - 1 << " sends after the refused one went zero-hop");
    CHECK(zero_hop >= kSends - 3);
}

TEST_CASE("DC zero-hop receives: two DCIs, one zero-hop and one on the request path, share one SRQ: every message taken once, in each sender's order") {
    // The target's progress thread (the request path's sends) and the zero-hop sender's thread take
    // WQEs from one SRQ at once, both under the receive lock.
    static const std::uint32_t kMessages = rdmachan::test::kSanitizerBuild ? 1000 : 5000;
    constexpr std::uint32_t kWindow = 16;
    DcTargetEndpoint target(soft::Device::open(), kDcKey, 1 << 20, 1, true);
    std::shared_ptr<soft::Device> devices[2];
    {
        Environment on("RDMACHAN_SOFT_ZERO_HOP", "1");
        devices[0] = soft::Device::open();
    }
    {
        Environment off("RDMACHAN_SOFT_ZERO_HOP", "0");
        devices[1] = soft::Device::open();
    }
    DcInitiatorEndpoint zero_hop_sender(devices[0], 17, 1 << 20, true);
    DcInitiatorEndpoint request_path_sender(devices[1], 17, 1 << 20, true);
    DcInitiatorEndpoint* senders[2] = {&zero_hop_sender, &request_path_sender};
    const DcTargetAddress to = target.address();
    for (std::uint32_t i = 0; i < 2 * kWindow; ++i) REQUIRE(target.post_receive(i, 65536 + i * 64, 64) == mlx5::PostResult::ok);
    // Each message: 64 bytes, its first word the sender's number and its sequence.
    auto send_all = [&](std::uint32_t which, int& failures) {
        DcInitiatorEndpoint& sender = *senders[which];
        for (std::uint32_t i = 0; i < kMessages && failures == 0; ++i) {
            std::uint8_t* slot = sender.buffer() + (i % kWindow) * 64;
            const std::uint32_t word = which << 24 | i;
            std::memcpy(slot, &word, 4);
            std::memset(slot + 4, static_cast<int>(i & 0xff), 60);
            const mlx5::ScatterGatherElement element = sender.local((i % kWindow) * 64, 64);
            if (sender.post(dc_request(mlx5::SendOpcode::send, i, &element), to) != mlx5::PostResult::ok) ++failures;
            const auto sent = sender.wait_send(std::chrono::seconds(30));
            if (!sent || sent->status != mlx5::CompletionStatus::success || sent->wr_id != i) ++failures;
        }
    };
    int failures[3] = {};
    std::uint32_t next[2] = {0, 0};
    {
        std::jthread first(send_all, 0, std::ref(failures[0]));
        std::jthread second(send_all, 1, std::ref(failures[1]));
        for (std::uint32_t received = 0; received < 2 * kMessages && failures[2] == 0; ++received) {
            const auto completion = target.wait_receive(std::chrono::seconds(30));
            if (!completion || completion->status != mlx5::CompletionStatus::success || completion->byte_len != 64) {
                ++failures[2];
                break;
            }
            soft::acquire_remote_writes();
            const std::uint8_t* bytes = target.buffer() + 65536 + completion->wr_id * 64;
            std::uint32_t word = 0;
            std::memcpy(&word, bytes, 4);
            const std::uint32_t which = word >> 24;
            const std::uint32_t sequence = word & 0xffffff;
            // Each sender's messages arrive in its order, each once, every byte its own.
            if (which > 1 || sequence != next[which]++ || completion->src_qp != senders[which]->initiator().qpn()) ++failures[2];
            for (std::uint32_t b = 4; b < 64; ++b) failures[2] += bytes[b] != static_cast<std::uint8_t>(sequence & 0xff);
            if (target.post_receive(completion->wr_id, 65536 + completion->wr_id * 64, 64) != mlx5::PostResult::ok) ++failures[2];
        }
    }
    CHECK(failures[0] == 0);
    CHECK(failures[1] == 0);
    CHECK(failures[2] == 0);
    CHECK(next[0] == kMessages);
    CHECK(next[1] == kMessages);
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(20)).has_value());
    MESSAGE(devices[0]->zero_hop_receives() << " of " << kMessages << " went zero-hop");
    CHECK(devices[0]->zero_hop_receives() > 0);
    CHECK(devices[1]->zero_hop_receives() == 0);
}

TEST_CASE("DC zero-hop receives refused: a message longer than the SRQ's WQE, a wrong DC key and a bad key get the request path's errors") {
    Environment setting("RDMACHAN_SOFT_ZERO_HOP", "1");
    DcTargetEndpoint target(soft::Device::open(), kDcKey, 1 << 20, 1, true);
    auto initiator_device = soft::Device::open();
    DcInitiatorEndpoint initiator(initiator_device, 17, 1 << 20, true);
    const DcTargetAddress to = target.address();
    std::memset(target.buffer(), 0xee, 65536);
    mlx5::ScatterGatherElement element = initiator.local(0, 64);
    REQUIRE(complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr + 200000, to.rkey), to).status ==
            mlx5::CompletionStatus::success);
    SUBCASE("longer than the WQE: the initiator's remote invalid request, the WQE's local length error, the DCT still serving") {
        REQUIRE(target.post_receive(20, 0, 8) == mlx5::PostResult::ok);
        const mlx5::Completion sent = complete(initiator, dc_request(mlx5::SendOpcode::send, 2, &element), to);
        CHECK(sent.status == mlx5::CompletionStatus::remote_invalid_request);
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->wr_id == 20);
        CHECK(received->status == mlx5::CompletionStatus::local_length_error);
    }
    SUBCASE("a wrong DC key: remote access error, no WQE consumed, the violation counted") {
        REQUIRE(target.post_receive(30, 0, 4096) == mlx5::PostResult::ok);
        const mlx5::Completion refused = complete(initiator, dc_request(mlx5::SendOpcode::send, 2, &element), to, kDcKey + 1);
        CHECK(refused.status == mlx5::CompletionStatus::remote_access_error);
        CHECK(target.target().key_violations() == 1);
        CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(20)).has_value());
        CHECK(rdmachan::test::bytes_differing(target.buffer(), 4096, 0xee) == 0);
    }
    SUBCASE("a write with immediate through a bad key: remote access error, no WQE consumed, memory untouched") {
        REQUIRE(target.post_receive(40, 0, 0) == mlx5::PostResult::ok);
        element = initiator.local(0, 4096);
        mlx5::SendWorkRequest write = dc_request(mlx5::SendOpcode::rdma_write_with_immediate, 2, &element, to.buffer_addr, to.rkey ^ 0x100);
        const mlx5::Completion refused = complete(initiator, write, to);
        CHECK(refused.status == mlx5::CompletionStatus::remote_access_error);
        CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(20)).has_value());
        CHECK(rdmachan::test::bytes_differing(target.buffer(), 65536, 0xee) == 0);
    }
    CHECK(initiator_device->zero_hop_receives() == 0);
}
