// DC error paths on the software device, through the real mlx5 data path: what a wrong DC key,
// a bad rkey, an unserved DCT number or a too-small SRQ buffer do to the initiator and the
// target, the DCT number before RTR, and a DCI recovered through RESET.
#include <doctest/doctest.h>

#include <cstring>

#include "tests/soft/soft_dc_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::complete;
using rdmachan::test::dc_request;
using rdmachan::test::DcInitiatorEndpoint;
using rdmachan::test::DcTargetAddress;
using rdmachan::test::DcTargetEndpoint;
using rdmachan::test::kDcKey;

TEST_CASE("a wrong DC key: remote access error on the DCI, the DCT's memory and SRQ untouched") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint intruder(soft::Device::open());
    const DcTargetAddress to = target.address();
    std::memset(target.buffer(), 0x11, 8192);
    REQUIRE(target.post_receive(5, 4096, 1024) == mlx5::PostResult::ok);

    std::memset(intruder.buffer(), 0xee, 4096);
    const mlx5::ScatterGatherElement element = intruder.local(0, 512);
    // A key that differs only in its upper 32 bits (all 64 are compared): refused before anything
    // of the DCT is looked at.
    const mlx5::Completion refused = complete(
        intruder, dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr, to.rkey),
        to, kDcKey ^ (1ull << 63));
    CHECK(refused.wr_id == 1);
    CHECK(refused.status == mlx5::CompletionStatus::remote_access_error);
    CHECK(refused.syndrome == mlx5::kSyndromeRemoteAccess);
    // The DCI is in ERR now: what follows is flushed and never reaches the DCT.
    const mlx5::Completion flushed =
        complete(intruder, dc_request(mlx5::SendOpcode::send, 2, &element), to, kDcKey ^ (1ull << 63));
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
    const mlx5::Completion accepted =
        complete(friendly, dc_request(mlx5::SendOpcode::send, 3, &good), to);
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
    CHECK_THROWS_WITH_AS(target->dctn(), doctest::Contains("only after the move to RTR"),
                         soft::SoftDeviceError);
    CHECK_THROWS_AS(target->modify_to_init(2), soft::SoftDeviceError);  // port 1 only
    CHECK_THROWS_WITH_AS(target->modify_to_ready_to_receive({1000, 1}),
                         doctest::Contains("path_mtu"), soft::SoftDeviceError);
    target->modify_to_ready_to_receive({1024, 1});
    CHECK(target->dctn() != 0);
    CHECK(target->state() == soft::QueuePairState::ready_to_receive);
    CHECK_THROWS_WITH_AS(target->modify_to_ready_to_receive({1024, 1}),
                         doctest::Contains("RTR -> RTR"), soft::SoftDeviceError);

    init.srq = nullptr;
    CHECK_THROWS_WITH_AS(device->create_dc_target(domain, init), doctest::Contains("SRQ"),
                         soft::SoftDeviceError);
    init.srq = srq;
    init.recv_cq = nullptr;
    CHECK_THROWS_WITH_AS(device->create_dc_target(domain, init), doctest::Contains("recv_cq"),
                         soft::SoftDeviceError);

    // A DCI refuses transitions out of order, naming itself.
    soft::DcInitiatorInit initiator_init;
    initiator_init.send_cq = cq;
    auto initiator = device->create_dc_initiator(domain, initiator_init);
    CHECK_THROWS_WITH_AS(initiator->modify_to_ready_to_send({}), doctest::Contains("RESET -> RTS"),
                         soft::SoftDeviceError);
    const std::string named = "DCI " + std::to_string(initiator->qpn());
    CHECK_THROWS_WITH_AS(initiator->modify_to_ready_to_send({}), doctest::Contains(named.c_str()),
                         soft::SoftDeviceError);
    initiator_init.send_cq = nullptr;
    CHECK_THROWS_WITH_AS(device->create_dc_initiator(domain, initiator_init),
                         doctest::Contains("send_cq"), soft::SoftDeviceError);
}

TEST_CASE("a bad rkey through DC: remote access error, the target untouched and still serving") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    std::memset(target.buffer(), 0x22, 4096);
    std::memset(initiator.buffer(), 0x99, 4096);
    const mlx5::ScatterGatherElement element = initiator.local(0, 256);
    const mlx5::Completion done = complete(
        initiator,
        dc_request(mlx5::SendOpcode::rdma_write, 9, &element, to.buffer_addr, to.rkey ^ 0x80), to);
    CHECK(done.status == mlx5::CompletionStatus::remote_access_error);
    CHECK(done.wr_id == 9);
    CHECK(initiator.initiator().state() == soft::QueuePairState::error);
    for (int i = 0; i < 4096; ++i) REQUIRE(target.buffer()[i] == 0x22);
    CHECK(target.target().key_violations() == 0);  // a good DC key: not a key violation

    // Past the end of the region: refused too.
    DcInitiatorEndpoint second(soft::Device::open());
    const mlx5::ScatterGatherElement landing = second.local(0, 256);
    const mlx5::Completion beyond = complete(second,
                                             dc_request(mlx5::SendOpcode::rdma_read, 10, &landing,
                                                        to.buffer_addr + (1 << 20) - 128, to.rkey),
                                             to);
    CHECK(beyond.status == mlx5::CompletionStatus::remote_access_error);

    DcInitiatorEndpoint third(soft::Device::open());
    std::memset(third.buffer(), 0x99, 256);
    const mlx5::ScatterGatherElement source = third.local(0, 256);
    const mlx5::Completion good = complete(
        third, dc_request(mlx5::SendOpcode::rdma_write, 11, &source, to.buffer_addr, to.rkey), to);
    CHECK(good.status == mlx5::CompletionStatus::success);
    CHECK(target.buffer()[0] == 0x99);
}

TEST_CASE(
    "a DCI in ERR is flushed, then RESET -> INIT -> RTR -> RTS and used again from producer index "
    "0") {
    // The sends the DCI holds when it goes to ERR are addressed to a DCT that never gets a
    // receive: they wait on RNR (retried forever) until the application moves the DCI to ERR,
    // whenever its thread runs. Copies of them resent before the ERR may still be on their way
    // afterwards, and a DCT rightly serves such a copy; going to another DCT than the send after
    // the reset, none can take the receive posted for that send. (With one DCT and the longest
    // RNR timer, 491.52 ms, this case depended on the move to ERR coming before the first resend:
    // under the soak its thread ran 1 s late, and a stale copy took the new send's receive.)
    DcTargetEndpoint refusing(soft::Device::open(), kDcKey, 1 << 20, 31);  // resends 491 ms apart
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress nowhere_to_land = refusing.address();
    const DcTargetAddress to = target.address();
    const mlx5::ScatterGatherElement element = initiator.local(0, 64);
    std::memset(initiator.buffer(), 0x55, 64);
    REQUIRE(initiator.post(dc_request(mlx5::SendOpcode::send, 1, &element), nowhere_to_land) ==
            mlx5::PostResult::ok);
    REQUIRE(initiator.post(dc_request(mlx5::SendOpcode::rdma_write, 2, &element,
                                      nowhere_to_land.buffer_addr, nowhere_to_land.rkey),
                           nowhere_to_land) == mlx5::PostResult::ok);
    CHECK_FALSE(initiator.wait_send(std::chrono::milliseconds(100)).has_value());
    CHECK(initiator.send_queue().tracking().producer_index > 0);
    initiator.initiator().modify_to_error();
    for (std::uint64_t wr_id = 1; wr_id <= 2; ++wr_id) {
        const auto flushed = initiator.wait_send();
        REQUIRE(flushed.has_value());
        CHECK(flushed->wr_id == wr_id);
        CHECK(flushed->status == mlx5::CompletionStatus::work_request_flushed);
    }
    CHECK_THROWS_AS(initiator.initiator().modify_to_init(1, 0),
                    soft::SoftDeviceError);  // ERR -> INIT is invalid

    initiator.initiator().modify_to_reset();
    CHECK(initiator.initiator().state() == soft::QueuePairState::reset);
    // A new packet sequence: an RNR NAK the refusing DCT sends late, to a copy resent before the
    // ERR, then names a PSN the DCI no longer has in flight, and is ignored.
    initiator.connect(0x3000);
    CHECK(initiator.initiator().state() == soft::QueuePairState::ready_to_send);
    CHECK(initiator.send_queue().tracking().producer_index == 0);

    REQUIRE(target.post_receive(3, 8192, 64) == mlx5::PostResult::ok);
    std::memset(initiator.buffer(), 0x77, 64);
    const mlx5::Completion sent =
        complete(initiator, dc_request(mlx5::SendOpcode::send, 3, &element), to);
    CHECK(sent.status == mlx5::CompletionStatus::success);
    CHECK(sent.wr_id == 3);
    const auto received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->status == mlx5::CompletionStatus::success);
    CHECK(target.buffer()[8192] == 0x77);
    CHECK(received->wr_id == 3);
    // The write behind the refused send never landed (requests after an RNR NAK wait for it).
    CHECK(refusing.buffer()[0] == 0);
}

TEST_CASE(
    "a DCT number nobody serves, or a DCT not yet in RTR: the request is dropped and the DCI times "
    "out") {
    auto device = soft::Device::open();
    DcTargetEndpoint target(device);
    DcInitiatorEndpoint initiator(soft::Device::open(), 10);  // 4 ms per try, 4 tries
    DcTargetAddress nowhere = target.address();
    nowhere.dctn += 1000;
    const mlx5::ScatterGatherElement element = initiator.local(0, 8);
    mlx5::Completion done = complete(
        initiator,
        dc_request(mlx5::SendOpcode::rdma_write, 1, &element, nowhere.buffer_addr, nowhere.rkey),
        nowhere);
    CHECK(done.status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(done.syndrome == mlx5::kSyndromeTransportRetryExceeded);

    // A DCT in INIT has no number on the wire yet. Two DCTs created back to back get
    // consecutive numbers; the second stays in INIT while a DCI names the number it will get.
    auto domain = device->allocate_protection_domain();
    std::vector<std::uint8_t> memory(4096, 0);
    auto region =
        device->register_memory(domain, memory.data(), memory.size(), rdmachan::test::kAllAccess);
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
    const DcTargetAddress early{device->address_vector(), ready->dctn() + 1,
                                reinterpret_cast<std::uint64_t>(memory.data()), region->rkey()};
    DcInitiatorEndpoint second(soft::Device::open(), 10);
    second.buffer()[0] = 0x6b;
    const mlx5::ScatterGatherElement source = second.local(0, 1);
    done = complete(
        second, dc_request(mlx5::SendOpcode::rdma_write, 2, &source, early.buffer_addr, early.rkey),
        early);
    CHECK(done.status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(memory[0] == 0);
    // In RTR it gets exactly that number, and the same address vector now reaches it.
    waiting->modify_to_ready_to_receive({});
    REQUIRE(waiting->dctn() == early.dctn);
    // The default ACK timeout here: this write must succeed, and 4 tries of 4 ms are not enough
    // for two loaded progress threads to answer (the case failed so under a load average of 12).
    DcInitiatorEndpoint third(soft::Device::open());
    third.buffer()[0] = 0x6b;
    const mlx5::ScatterGatherElement again = third.local(0, 1);
    done = complete(
        third, dc_request(mlx5::SendOpcode::rdma_write, 3, &again, early.buffer_addr, early.rkey),
        early);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(memory[0] == 0x6b);
}

TEST_CASE(
    "a send longer than the SRQ buffer: length error at the DCT, invalid request at the DCI, the "
    "DCT keeps serving") {
    DcTargetEndpoint target(soft::Device::open());
    DcInitiatorEndpoint initiator(soft::Device::open());
    const DcTargetAddress to = target.address();
    REQUIRE(target.post_receive(1, 0, 64) == mlx5::PostResult::ok);
    const mlx5::ScatterGatherElement element = initiator.local(0, 200);
    const mlx5::Completion refused =
        complete(initiator, dc_request(mlx5::SendOpcode::send, 1, &element), to);
    CHECK(refused.status == mlx5::CompletionStatus::remote_invalid_request);
    const auto error = target.wait_receive();
    REQUIRE(error.has_value());
    CHECK(error->wr_id == 1);
    CHECK(error->status == mlx5::CompletionStatus::local_length_error);
    CHECK(error->qp_num == to.dctn);
    CHECK(target.target().state() == soft::QueuePairState::ready_to_receive);

    DcInitiatorEndpoint other(soft::Device::open());
    REQUIRE(target.post_receive(2, 4096, 64) == mlx5::PostResult::ok);
    other.buffer()[0] = 0x31;
    const mlx5::ScatterGatherElement small = other.local(0, 64);
    CHECK(complete(other, dc_request(mlx5::SendOpcode::send, 2, &small), to).status ==
          mlx5::CompletionStatus::success);
    const auto received = target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->status == mlx5::CompletionStatus::success);
    CHECK(received->wr_id == 2);
    CHECK(target.buffer()[4096] == 0x31);
}
