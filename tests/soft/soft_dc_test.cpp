// Dynamically connected transport on the software device, through the real mlx5 data path:
// DCIs posting through SendQueue (dc_initiator) with an address vector per WQE, DCTs
// receiving through an SRQ, both completing on CQs polled by the project's CompletionQueue.
#include <doctest/doctest.h>

#include <cstring>

#include "tests/soft/fill_pattern.hpp"
#include "tests/soft/soft_dc_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::complete;
using rdmachan::test::dc_request;
using rdmachan::test::DcInitiatorEndpoint;
using rdmachan::test::DcTargetAddress;
using rdmachan::test::DcTargetEndpoint;
using rdmachan::test::fill_pattern;
using rdmachan::test::kDcKey;

TEST_CASE(
    "DCI to DCT on another device: every operation, receives through the SRQ naming the sender") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    const std::uint32_t dci = initiator.initiator().qpn();

    // RDMA write: lands without the target calling in.
    fill_pattern(initiator.buffer(), 4096, 1);
    mlx5::ScatterGatherElement element = initiator.local(0, 4096);
    mlx5::Completion done = complete(
        initiator,
        dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr + 8192, to.rkey), to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.wr_id == 1);
    CHECK(done.opcode == mlx5::CompletionOpcode::rdma_write);
    CHECK(std::memcmp(target.buffer() + 8192, initiator.buffer(), 4096) == 0);

    // RDMA write with immediate: consumes an SRQ WQE; the CQE names the DCT and the DCI.
    REQUIRE(target.post_receive(70, 512 * 1024, 64) == mlx5::PostResult::ok);
    fill_pattern(initiator.buffer(), 100, 9);
    element = initiator.local(0, 100);
    mlx5::SendWorkRequest request = dc_request(mlx5::SendOpcode::rdma_write_with_immediate, 2,
                                               &element, to.buffer_addr + 1000, to.rkey);
    request.immediate = 0xfeedbeef;
    done = complete(initiator, request, to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    auto received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->status == mlx5::CompletionStatus::success);
    CHECK(received->wr_id == 70);
    CHECK(received->opcode == mlx5::CompletionOpcode::receive_rdma_with_immediate);
    CHECK(received->immediate == 0xfeedbeef);
    CHECK(received->byte_len == 100);
    CHECK(received->qp_num == to.dctn);
    CHECK(received->src_qp == dci);
    CHECK(received->slid == initiator.lid());
    CHECK((received->flags & mlx5::kCompletionGrh) != 0);  // the address vector carried a GRH
    CHECK(std::memcmp(target.buffer() + 1000, initiator.buffer(), 100) == 0);

    // Send and send with immediate: scattered into SRQ buffers, in order.
    REQUIRE(target.post_receive(71, 600 * 1024, 2000) == mlx5::PostResult::ok);
    REQUIRE(target.post_receive(72, 610 * 1024, 2000) == mlx5::PostResult::ok);
    fill_pattern(initiator.buffer(), 3000, 3);
    element = initiator.local(0, 1500);
    done = complete(initiator, dc_request(mlx5::SendOpcode::send, 3, &element), to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.opcode == mlx5::CompletionOpcode::send);
    element = initiator.local(1500, 1500);
    request = dc_request(mlx5::SendOpcode::send_with_immediate, 4, &element);
    request.immediate = 0x12345678;
    done = complete(initiator, request, to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->wr_id == 71);
    CHECK(received->opcode == mlx5::CompletionOpcode::receive);
    CHECK(received->byte_len == 1500);
    CHECK(received->src_qp == dci);
    CHECK(std::memcmp(target.buffer() + 600 * 1024, initiator.buffer(), 1500) == 0);
    received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->wr_id == 72);
    CHECK(received->immediate == 0x12345678);
    CHECK((received->flags & mlx5::kCompletionWithImmediate) != 0);
    CHECK(std::memcmp(target.buffer() + 610 * 1024, initiator.buffer() + 1500, 1500) == 0);

    // RDMA read: the target's bytes come back.
    fill_pattern(target.buffer() + 20000, 3000, 77);
    element = initiator.local(100000, 3000);
    done = complete(
        initiator,
        dc_request(mlx5::SendOpcode::rdma_read, 5, &element, to.buffer_addr + 20000, to.rkey), to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.opcode == mlx5::CompletionOpcode::rdma_read);
    CHECK(done.byte_len == 3000);
    CHECK(std::memcmp(initiator.buffer() + 100000, target.buffer() + 20000, 3000) == 0);

    // Atomics on the target's word: fetch-and-add 40 + 2, then compare 42 and swap 1234.
    std::uint64_t word = 40;
    std::memcpy(target.buffer() + 4096, &word, 8);
    element = initiator.local(200000, 8);
    request = dc_request(mlx5::SendOpcode::atomic_fetch_and_add, 6, &element, to.buffer_addr + 4096,
                         to.rkey);
    request.compare_add = 2;
    done = complete(initiator, request, to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.opcode == mlx5::CompletionOpcode::atomic_fetch_and_add);
    std::memcpy(&word, initiator.buffer() + 200000, 8);
    CHECK(word == 40);
    request = dc_request(mlx5::SendOpcode::atomic_compare_and_swap, 7, &element,
                         to.buffer_addr + 4096, to.rkey);
    request.compare_add = 42;
    request.swap = 1234;
    done = complete(initiator, request, to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    std::memcpy(&word, initiator.buffer() + 200000, 8);
    CHECK(word == 42);
    std::memcpy(&word, target.buffer() + 4096, 8);
    CHECK(word == 1234);
}

TEST_CASE(
    "one DCI alternates between two DCTs without waiting; completions come in posting order") {
    auto device = soft::Device::open();
    DcTargetEndpoint first(device);
    DcTargetEndpoint second(soft::Device::open());
    DcInitiatorEndpoint initiator(device);  // one DCT on its own device (loopback), one over TCP
    const DcTargetAddress targets[2] = {first.address(), second.address()};
    constexpr std::uint32_t kMessages = 40;
    for (std::uint32_t i = 0; i < kMessages / 2; ++i) {
        REQUIRE(first.post_receive(i, 64 * 1024 + i * 256, 256) == mlx5::PostResult::ok);
        REQUIRE(second.post_receive(i, 64 * 1024 + i * 256, 256) == mlx5::PostResult::ok);
    }
    for (std::uint32_t i = 0; i < kMessages; ++i) {
        fill_pattern(initiator.buffer() + i * 256, 256, static_cast<std::uint8_t>(i));
        const mlx5::ScatterGatherElement element = initiator.local(i * 256, 200);
        mlx5::SendWorkRequest request =
            dc_request(mlx5::SendOpcode::send_with_immediate, 1000 + i, &element);
        request.immediate = i;
        REQUIRE(initiator.post(request, targets[i % 2]) == mlx5::PostResult::ok);
    }
    for (std::uint32_t i = 0; i < kMessages; ++i) {
        const auto done = initiator.wait_send();
        REQUIRE(done.has_value());
        CHECK(done->status == mlx5::CompletionStatus::success);
        CHECK(done->wr_id == 1000 + i);
    }
    DcTargetEndpoint* endpoints[2] = {&first, &second};
    for (std::uint32_t i = 0; i < kMessages; ++i) {
        DcTargetEndpoint& target = *endpoints[i % 2];
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->status == mlx5::CompletionStatus::success);
        CHECK(received->immediate == i);  // each DCT sees its messages in posting order
        CHECK(received->wr_id == i / 2);
        CHECK(received->src_qp == initiator.initiator().qpn());
        CHECK(std::memcmp(target.buffer() + 64 * 1024 + (i / 2) * 256, initiator.buffer() + i * 256,
                          200) == 0);
    }
}

TEST_CASE("two DCIs on two devices send to one DCT: both land in its SRQ and name their sender") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint a(soft::Device::open());
    DcInitiatorEndpoint b(soft::Device::open());
    const DcTargetAddress to = target.address();
    constexpr std::uint32_t kEach = 20;
    for (std::uint32_t i = 0; i < 2 * kEach; ++i)
        REQUIRE(target.post_receive(i, i * 128, 128) == mlx5::PostResult::ok);
    for (std::uint32_t i = 0; i < kEach; ++i) {
        a.buffer()[i] = static_cast<std::uint8_t>(0xa0);
        b.buffer()[i] = static_cast<std::uint8_t>(0xb0);
        const mlx5::ScatterGatherElement from_a = a.local(i, 1);
        const mlx5::ScatterGatherElement from_b = b.local(i, 1);
        mlx5::SendWorkRequest request =
            dc_request(mlx5::SendOpcode::send_with_immediate, i, &from_a);
        request.immediate = i;
        REQUIRE(a.post(request, to) == mlx5::PostResult::ok);
        request.sg_list = &from_b;
        request.immediate = 0x10000 + i;
        REQUIRE(b.post(request, to) == mlx5::PostResult::ok);
    }
    std::uint32_t next_from_a = 0;
    std::uint32_t next_from_b = 0;
    for (std::uint32_t i = 0; i < 2 * kEach; ++i) {
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        REQUIRE(received->status == mlx5::CompletionStatus::success);
        const std::uint8_t byte = target.buffer()[received->wr_id * 128];
        // DCIs on different devices may have the same number: the source LID tells them apart.
        if (received->slid == a.lid() && received->src_qp == a.initiator().qpn()) {
            CHECK(byte == 0xa0);
            CHECK(received->immediate == next_from_a++);  // each DCI's messages in its order
        } else {
            CHECK(received->slid == b.lid());
            CHECK(received->src_qp == b.initiator().qpn());
            CHECK(byte == 0xb0);
            CHECK(received->immediate == 0x10000 + next_from_b++);
        }
    }
    CHECK(next_from_a == kEach);
    CHECK(next_from_b == kEach);
    for (std::uint32_t i = 0; i < kEach; ++i) {
        CHECK(a.wait_send().has_value());
        CHECK(b.wait_send().has_value());
    }
}

TEST_CASE(
    "receiver not ready at a DCT: the DCI retries, and the requests behind the refused one stay in "
    "order") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    for (std::uint32_t i = 0; i < 3; ++i) {
        initiator.buffer()[i] = static_cast<std::uint8_t>(0x40 + i);
        const mlx5::ScatterGatherElement element = initiator.local(i, 1);
        mlx5::SendWorkRequest request =
            dc_request(mlx5::SendOpcode::send_with_immediate, 10 + i, &element);
        request.immediate = i;
        REQUIRE(initiator.post(request, to) == mlx5::PostResult::ok);
    }
    // Nothing posted at the DCT yet: no completion, the DCI keeps retrying (rnr_retry 7).
    CHECK_FALSE(initiator.wait_send(std::chrono::milliseconds(50)).has_value());
    CHECK(initiator.initiator().state() == soft::QueuePairState::ready_to_send);
    for (std::uint32_t i = 0; i < 3; ++i)
        REQUIRE(target.post_receive(i, i * 64, 64) == mlx5::PostResult::ok);
    for (std::uint32_t i = 0; i < 3; ++i) {
        const auto done = initiator.wait_send();
        REQUIRE(done.has_value());
        CHECK(done->status == mlx5::CompletionStatus::success);
        CHECK(done->wr_id == 10 + i);
        const auto received = target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->immediate == i);
        CHECK(target.buffer()[received->wr_id * 64] == 0x40 + i);
    }
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(20))
                    .has_value());  // each message delivered once
}

TEST_CASE(
    "a DCI's ring wraps many times: inline and gathered writes of 2 and 3 WQEBBs, segments across "
    "the ring end") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    const std::uint32_t ring_wqebbs = initiator.initiator().send_ring().wqe_count;
    std::uint32_t posted = 0;
    std::uint32_t completed = 0;
    for (std::uint32_t i = 0; i < 600; ++i) {
        const std::uint32_t length = 1 + (i * 37) % 60;  // up to 60 bytes: fits inline (64)
        const std::uint64_t offset = (i % 256) * 64;
        fill_pattern(initiator.buffer() + offset, length, static_cast<std::uint8_t>(i));
        const mlx5::ScatterGatherElement element = initiator.local(offset, length);
        mlx5::SendWorkRequest request =
            dc_request(mlx5::SendOpcode::rdma_write, i, &element, to.buffer_addr + offset, to.rkey);
        if (i % 3 == 0) request.flags |= mlx5::kSendInline;
        if (i % 4 != 3)
            request.flags &=
                ~mlx5::kSendSignaled;  // one completion retires the unsignaled ones before it
        REQUIRE(initiator.post(request, to) == mlx5::PostResult::ok);
        ++posted;
        if (i % 4 == 3) {
            const auto done = initiator.wait_send();
            REQUIRE(done.has_value());
            REQUIRE(done->status == mlx5::CompletionStatus::success);
            CHECK(done->wr_id == i);
            completed = posted;
            CHECK(std::memcmp(target.buffer() + offset, initiator.buffer() + offset, length) == 0);
        }
    }
    CHECK(completed == posted);
    CHECK(initiator.send_queue().tracking().producer_index >
          4 * ring_wqebbs);  // wrapped several times
}
