// Dynamically connected transport on the software device, through the real mlx5 data path:
// DCIs posting through SendQueue (dc_initiator) with an address vector per WQE, DCTs
// receiving through an SRQ, both completing on CQs polled by the project's CompletionQueue.
#include <doctest/doctest.h>

#include <cstring>

#include "tests/soft/soft_dc_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::dc_request;
using rdmachan::test::DcInitiatorEndpoint;
using rdmachan::test::DcTargetAddress;
using rdmachan::test::DcTargetEndpoint;
using rdmachan::test::kDcKey;

namespace {

void fill(std::uint8_t* bytes, std::size_t length, std::uint8_t seed) {
    for (std::size_t i = 0; i < length; ++i) bytes[i] = static_cast<std::uint8_t>(seed + i * 7);
}

// Posts one request and returns its completion (the test fails if none comes).
mlx5::Completion complete(DcInitiatorEndpoint& initiator, const mlx5::SendWorkRequest& request, const DcTargetAddress& to,
                          std::uint64_t key = kDcKey) {
    REQUIRE(initiator.post(request, to, key) == mlx5::PostResult::ok);
    const auto completion = initiator.wait_send();
    REQUIRE(completion.has_value());
    return *completion;
}

}  // namespace

TEST_CASE("DCI to DCT on another device: every operation, receives through the SRQ naming the sender") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    const std::uint32_t dci = initiator.initiator().qpn();

    // RDMA write: lands without the target calling in.
    fill(initiator.buffer(), 4096, 1);
    mlx5::ScatterGatherElement element = initiator.local(0, 4096);
    mlx5::Completion done = complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr + 8192, to.rkey), to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.wr_id == 1);
    CHECK(done.opcode == mlx5::CompletionOpcode::rdma_write);
    CHECK(std::memcmp(target.buffer() + 8192, initiator.buffer(), 4096) == 0);

    // RDMA write with immediate: consumes an SRQ WQE; the CQE names the DCT and the DCI.
    REQUIRE(target.post_receive(70, 512 * 1024, 64) == mlx5::PostResult::ok);
    fill(initiator.buffer(), 100, 9);
    element = initiator.local(0, 100);
    mlx5::SendWorkRequest request = dc_request(mlx5::SendOpcode::rdma_write_with_immediate, 2, &element, to.buffer_addr + 1000, to.rkey);
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
    fill(initiator.buffer(), 3000, 3);
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
    fill(target.buffer() + 20000, 3000, 77);
    element = initiator.local(100000, 3000);
    done = complete(initiator, dc_request(mlx5::SendOpcode::rdma_read, 5, &element, to.buffer_addr + 20000, to.rkey), to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.opcode == mlx5::CompletionOpcode::rdma_read);
    CHECK(done.byte_len == 3000);
    CHECK(std::memcmp(initiator.buffer() + 100000, target.buffer() + 20000, 3000) == 0);

    // Atomics on the target's word: fetch-and-add 40 + 2, then compare 42 and swap 1234.
    std::uint64_t word = 40;
    std::memcpy(target.buffer() + 4096, &word, 8);
    element = initiator.local(200000, 8);
    request = dc_request(mlx5::SendOpcode::atomic_fetch_and_add, 6, &element, to.buffer_addr + 4096, to.rkey);
    request.compare_add = 2;
    done = complete(initiator, request, to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.opcode == mlx5::CompletionOpcode::atomic_fetch_and_add);
    std::memcpy(&word, initiator.buffer() + 200000, 8);
    CHECK(word == 40);
    request = dc_request(mlx5::SendOpcode::atomic_compare_and_swap, 7, &element, to.buffer_addr + 4096, to.rkey);
    request.compare_add = 42;
    request.swap = 1234;
    done = complete(initiator, request, to);
    CHECK(done.status == mlx5::CompletionStatus::success);
    std::memcpy(&word, initiator.buffer() + 200000, 8);
    CHECK(word == 42);
    std::memcpy(&word, target.buffer() + 4096, 8);
    CHECK(word == 1234);
}

TEST_CASE("one DCI alternates between two DCTs without waiting; completions come in posting order") {
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
        fill(initiator.buffer() + i * 256, 256, static_cast<std::uint8_t>(i));
        const mlx5::ScatterGatherElement element = initiator.local(i * 256, 200);
        mlx5::SendWorkRequest request = dc_request(mlx5::SendOpcode::send_with_immediate, 1000 + i, &element);
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
        CHECK(std::memcmp(target.buffer() + 64 * 1024 + (i / 2) * 256, initiator.buffer() + i * 256, 200) == 0);
    }
}

TEST_CASE("two DCIs on two devices send to one DCT: both land in its SRQ and name their sender") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint a(soft::Device::open());
    DcInitiatorEndpoint b(soft::Device::open());
    const DcTargetAddress to = target.address();
    constexpr std::uint32_t kEach = 20;
    for (std::uint32_t i = 0; i < 2 * kEach; ++i) REQUIRE(target.post_receive(i, i * 128, 128) == mlx5::PostResult::ok);
    for (std::uint32_t i = 0; i < kEach; ++i) {
        a.buffer()[i] = static_cast<std::uint8_t>(0xa0);
        b.buffer()[i] = static_cast<std::uint8_t>(0xb0);
        const mlx5::ScatterGatherElement from_a = a.local(i, 1);
        const mlx5::ScatterGatherElement from_b = b.local(i, 1);
        mlx5::SendWorkRequest request = dc_request(mlx5::SendOpcode::send_with_immediate, i, &from_a);
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

TEST_CASE("a wrong DC key: remote access error on the DCI, the DCT's memory and SRQ untouched") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint intruder(soft::Device::open());
    const DcTargetAddress to = target.address();
    std::memset(target.buffer(), 0x11, 8192);
    REQUIRE(target.post_receive(5, 4096, 1024) == mlx5::PostResult::ok);

    std::memset(intruder.buffer(), 0xee, 4096);
    const mlx5::ScatterGatherElement element = intruder.local(0, 512);
    // A key one bit off: refused before anything of the DCT is looked at.
    const mlx5::Completion refused =
        complete(intruder, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr, to.rkey), to, kDcKey ^ 1);
    CHECK(refused.wr_id == 1);
    CHECK(refused.status == mlx5::CompletionStatus::remote_access_error);
    CHECK(refused.syndrome == mlx5::kSyndromeRemoteAccess);
    // The DCI is in ERR now: what follows is flushed and never reaches the DCT.
    const mlx5::Completion flushed = complete(intruder, dc_request(mlx5::SendOpcode::send, 2, &element), to, kDcKey ^ 1);
    CHECK(flushed.wr_id == 2);
    CHECK(flushed.status == mlx5::CompletionStatus::work_request_flushed);
    CHECK(intruder.initiator().state() == soft::QueuePairState::error);
    CHECK(target.target().key_violations() == 1);
    for (int i = 0; i < 8192; ++i) REQUIRE(target.buffer()[i] == 0x11);
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(200)).has_value());

    // The DCT is unharmed: the right key gets through and finds the receive still posted.
    DcInitiatorEndpoint friendly(soft::Device::open());
    std::memset(friendly.buffer(), 0x5a, 512);
    const mlx5::ScatterGatherElement good = friendly.local(0, 512);
    const mlx5::Completion accepted = complete(friendly, dc_request(mlx5::SendOpcode::send, 3, &good), to);
    CHECK(accepted.status == mlx5::CompletionStatus::success);
    const auto received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->wr_id == 5);
    CHECK(received->src_qp == friendly.initiator().qpn());
    CHECK(target.buffer()[4096] == 0x5a);
    CHECK(target.target().key_violations() == 1);
}

TEST_CASE("the DCT number exists only after RTR; a DCT needs an SRQ and a receive CQ") {
    auto device = soft::Device::open();
    auto domain = device->allocate_protection_domain();
    auto srq = device->create_shared_receive_queue(domain, 15, 1);
    auto cq = device->create_completion_queue(16);
    soft::DcTargetInit init;
    init.srq = srq;
    init.recv_cq = cq;
    init.dc_access_key = kDcKey;
    auto target = device->create_dc_target(domain, init);
    CHECK_THROWS_WITH_AS(target->dctn(), doctest::Contains("RESET"), soft::SoftDeviceError);
    target->modify_to_init(1);
    CHECK_THROWS_WITH_AS(target->dctn(), doctest::Contains("only after the move to RTR"), soft::SoftDeviceError);
    CHECK_THROWS_AS(target->modify_to_init(2), soft::SoftDeviceError);  // port 1 only
    CHECK_THROWS_WITH_AS(target->modify_to_ready_to_receive({1000, 1}), doctest::Contains("path_mtu"), soft::SoftDeviceError);
    target->modify_to_ready_to_receive({1024, 1});
    CHECK(target->dctn() != 0);
    CHECK(target->state() == soft::QueuePairState::ready_to_receive);
    CHECK_THROWS_WITH_AS(target->modify_to_ready_to_receive({1024, 1}), doctest::Contains("RTR -> RTR"), soft::SoftDeviceError);

    init.srq = nullptr;
    CHECK_THROWS_WITH_AS(device->create_dc_target(domain, init), doctest::Contains("SRQ"), soft::SoftDeviceError);
    init.srq = srq;
    init.recv_cq = nullptr;
    CHECK_THROWS_WITH_AS(device->create_dc_target(domain, init), doctest::Contains("recv_cq"), soft::SoftDeviceError);

    // A DCI refuses transitions out of order, naming itself.
    soft::DcInitiatorInit initiator_init;
    initiator_init.send_cq = cq;
    auto initiator = device->create_dc_initiator(domain, initiator_init);
    CHECK_THROWS_WITH_AS(initiator->modify_to_ready_to_send({}), doctest::Contains("RESET -> RTS"), soft::SoftDeviceError);
    const std::string named = "DCI " + std::to_string(initiator->qpn());
    CHECK_THROWS_WITH_AS(initiator->modify_to_ready_to_send({}), doctest::Contains(named.c_str()), soft::SoftDeviceError);
    initiator_init.send_cq = nullptr;
    CHECK_THROWS_WITH_AS(device->create_dc_initiator(domain, initiator_init), doctest::Contains("send_cq"), soft::SoftDeviceError);
}

TEST_CASE("a bad rkey through DC: remote access error, the target untouched and still serving") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    std::memset(target.buffer(), 0x22, 4096);
    std::memset(initiator.buffer(), 0x99, 4096);
    const mlx5::ScatterGatherElement element = initiator.local(0, 256);
    const mlx5::Completion done =
        complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 9, &element, to.buffer_addr, to.rkey ^ 0x80), to);
    CHECK(done.status == mlx5::CompletionStatus::remote_access_error);
    CHECK(done.wr_id == 9);
    CHECK(initiator.initiator().state() == soft::QueuePairState::error);
    for (int i = 0; i < 4096; ++i) REQUIRE(target.buffer()[i] == 0x22);
    CHECK(target.target().key_violations() == 0);  // a good DC key: not a key violation

    // Past the end of the region: refused too.
    DcInitiatorEndpoint second(soft::Device::open());
    const mlx5::ScatterGatherElement landing = second.local(0, 256);
    const mlx5::Completion beyond =
        complete(second, dc_request(mlx5::SendOpcode::rdma_read, 10, &landing, to.buffer_addr + (1 << 20) - 128, to.rkey), to);
    CHECK(beyond.status == mlx5::CompletionStatus::remote_access_error);

    DcInitiatorEndpoint third(soft::Device::open());
    std::memset(third.buffer(), 0x99, 256);
    const mlx5::ScatterGatherElement source = third.local(0, 256);
    const mlx5::Completion good =
        complete(third, dc_request(mlx5::SendOpcode::rdma_write, 11, &source, to.buffer_addr, to.rkey), to);
    CHECK(good.status == mlx5::CompletionStatus::success);
    CHECK(target.buffer()[0] == 0x99);
}

TEST_CASE("a DCI in ERR is flushed, then RESET -> INIT -> RTR -> RTS and used again from producer index 0") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    const mlx5::ScatterGatherElement element = initiator.local(0, 64);
    // No receive posted: the send waits on RNR (retried forever) until the DCI is moved to ERR.
    REQUIRE(initiator.post(dc_request(mlx5::SendOpcode::send, 1, &element), to) == mlx5::PostResult::ok);
    REQUIRE(initiator.post(dc_request(mlx5::SendOpcode::rdma_write, 2, &element, to.buffer_addr, to.rkey), to) ==
            mlx5::PostResult::ok);
    CHECK_FALSE(initiator.wait_send(std::chrono::milliseconds(100)).has_value());
    CHECK(initiator.send_queue().tracking().producer_index > 0);
    initiator.initiator().modify_to_error();
    for (std::uint64_t wr_id = 1; wr_id <= 2; ++wr_id) {
        const auto flushed = initiator.wait_send();
        REQUIRE(flushed.has_value());
        CHECK(flushed->wr_id == wr_id);
        CHECK(flushed->status == mlx5::CompletionStatus::work_request_flushed);
    }
    CHECK_THROWS_AS(initiator.initiator().modify_to_init(1, 0), soft::SoftDeviceError);  // ERR -> INIT is invalid

    initiator.initiator().modify_to_reset();
    CHECK(initiator.initiator().state() == soft::QueuePairState::reset);
    initiator.connect();
    CHECK(initiator.initiator().state() == soft::QueuePairState::ready_to_send);
    CHECK(initiator.send_queue().tracking().producer_index == 0);

    REQUIRE(target.post_receive(3, 8192, 64) == mlx5::PostResult::ok);
    std::memset(initiator.buffer(), 0x77, 64);
    const mlx5::Completion sent = complete(initiator, dc_request(mlx5::SendOpcode::send, 3, &element), to);
    CHECK(sent.status == mlx5::CompletionStatus::success);
    CHECK(sent.wr_id == 3);
    const auto received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->status == mlx5::CompletionStatus::success);
    CHECK(target.buffer()[8192] == 0x77);
    // Only one receive was ever consumed: the refused send before the reset took none.
    CHECK(received->wr_id == 3);
}

TEST_CASE("receiver not ready at a DCT: the DCI retries, and the requests behind the refused one stay in order") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    for (std::uint32_t i = 0; i < 3; ++i) {
        initiator.buffer()[i] = static_cast<std::uint8_t>(0x40 + i);
        const mlx5::ScatterGatherElement element = initiator.local(i, 1);
        mlx5::SendWorkRequest request = dc_request(mlx5::SendOpcode::send_with_immediate, 10 + i, &element);
        request.immediate = i;
        REQUIRE(initiator.post(request, to) == mlx5::PostResult::ok);
    }
    // Nothing posted at the DCT yet: no completion, the DCI keeps retrying (rnr_retry 7).
    CHECK_FALSE(initiator.wait_send(std::chrono::milliseconds(50)).has_value());
    CHECK(initiator.initiator().state() == soft::QueuePairState::ready_to_send);
    for (std::uint32_t i = 0; i < 3; ++i) REQUIRE(target.post_receive(i, i * 64, 64) == mlx5::PostResult::ok);
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
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(20)).has_value());  // each message delivered once
}

TEST_CASE("a DCT number nobody serves, or a DCT not yet in RTR: the request is dropped and the DCI times out") {
    auto device = soft::Device::open();
    DcTargetEndpoint target(device);
    DcInitiatorEndpoint initiator(soft::Device::open(), 10);  // 4 ms per try, 4 tries
    DcTargetAddress nowhere = target.address();
    nowhere.dctn += 1000;
    const mlx5::ScatterGatherElement element = initiator.local(0, 8);
    mlx5::Completion done =
        complete(initiator, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, nowhere.buffer_addr, nowhere.rkey), nowhere);
    CHECK(done.status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(done.syndrome == mlx5::kSyndromeTransportRetryExceeded);

    // A DCT in INIT has no number on the wire yet. Two DCTs created back to back get
    // consecutive numbers; the second stays in INIT while a DCI names the number it will get.
    auto domain = device->allocate_protection_domain();
    std::vector<std::uint8_t> memory(4096, 0);
    auto region = device->register_memory(domain, memory.data(), memory.size(), rdmachan::test::kAllAccess);
    soft::DcTargetInit init;
    init.srq = device->create_shared_receive_queue(domain, 3, 1);
    init.recv_cq = device->create_completion_queue(8);
    init.access_flags = rdmachan::test::kAllAccess;
    init.dc_access_key = kDcKey;
    auto ready = device->create_dc_target(domain, init);
    auto waiting = device->create_dc_target(domain, init);
    ready->modify_to_init(1);
    ready->modify_to_ready_to_receive({});
    waiting->modify_to_init(1);
    const DcTargetAddress early{device->address_vector(), ready->dctn() + 1, reinterpret_cast<std::uint64_t>(memory.data()),
                                region->rkey()};
    DcInitiatorEndpoint second(soft::Device::open(), 10);
    second.buffer()[0] = 0x6b;
    const mlx5::ScatterGatherElement source = second.local(0, 1);
    done = complete(second, dc_request(mlx5::SendOpcode::rdma_write, 2, &source, early.buffer_addr, early.rkey), early);
    CHECK(done.status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(memory[0] == 0);
    // In RTR it gets exactly that number, and the same address vector now reaches it.
    waiting->modify_to_ready_to_receive({});
    REQUIRE(waiting->dctn() == early.dctn);
    DcInitiatorEndpoint third(soft::Device::open(), 10);
    third.buffer()[0] = 0x6b;
    const mlx5::ScatterGatherElement again = third.local(0, 1);
    done = complete(third, dc_request(mlx5::SendOpcode::rdma_write, 3, &again, early.buffer_addr, early.rkey), early);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(memory[0] == 0x6b);
}
