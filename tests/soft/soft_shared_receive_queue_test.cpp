// Receives through a shared receive queue on the software device: the data path posts SRQ
// WQEs (free list in the next segments), the device consumes them by following the links, and
// completions free them back in completion order — over many cycles of the list.
#include <doctest/doctest.h>

#include <cstring>

#include "tests/soft/soft_endpoint.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::SoftEndpoint;

TEST_CASE("two QPs share one SRQ: every message lands in an SRQ buffer and names its sender") {
    auto device = soft::Device::open();
    auto domain = device->allocate_protection_domain();
    std::vector<std::uint8_t> memory(64 * 1024);
    auto region = device->register_memory(domain, memory.data(), memory.size(), soft::kLocalWrite);
    auto srq = device->create_shared_receive_queue(domain, 7, 1);
    auto cq = device->create_completion_queue(64);
    std::vector<std::uint64_t> wr_ids(srq->ring().wqe_count);
    mlx5::SharedReceiveQueue shared(srq->ring(), wr_ids.data(), 0, srq->initial_tail());

    // Two receiving QPs on the SRQ, each connected to its own sender.
    std::vector<std::shared_ptr<soft::QueuePair>> receivers;
    std::vector<std::unique_ptr<SoftEndpoint>> senders;
    mlx5::CompletionTarget target;
    target.shared_receive = &shared;
    for (int i = 0; i < 2; ++i) {
        soft::QueuePairInit init;
        init.send_cq = cq;
        init.recv_cq = cq;
        init.srq = srq;
        auto receiver = device->create_queue_pair(domain, init);
        receiver->modify_to_init(1, soft::kLocalWrite);
        senders.push_back(std::make_unique<SoftEndpoint>(soft::Device::open()));
        const rdmachan::test::Address sender = senders.back()->address();
        soft::ReadyToReceiveAttributes receive;
        std::memcpy(receive.remote.gid.data(), sender.gid, 16);
        receive.remote.lid = sender.lid;
        receive.remote.qpn = sender.qpn;
        receive.rq_psn = 0x1000;
        receive.min_rnr_timer = 1;
        receiver->modify_to_ready_to_receive(receive);
        receiver->modify_to_ready_to_send({});
        rdmachan::test::Address self{};
        const auto gid = device->gid();
        std::memcpy(self.gid, gid.data(), 16);
        self.lid = device->lid();
        self.qpn = receiver->qpn();
        senders.back()->connect(self);
        receivers.push_back(receiver);
    }
    mlx5::CompletionQueue completions(cq->ring());
    auto resolve = [&](std::uint32_t qpn, std::uint32_t) {
        return qpn == receivers[0]->qpn() || qpn == receivers[1]->qpn() ? &target : static_cast<mlx5::CompletionTarget*>(nullptr);
    };

    // 7 buffers of 1 KiB; 200 messages cycle the free list many times.
    auto post_buffer = [&](std::uint64_t slot) {
        const mlx5::ScatterGatherElement element{reinterpret_cast<std::uint64_t>(memory.data()) + slot * 1024, 1024, region->lkey()};
        const mlx5::ReceiveWorkRequest request{slot, &element, 1};
        return shared.post(&request, 1, nullptr);
    };
    for (std::uint64_t slot = 0; slot < 7; ++slot) REQUIRE(post_buffer(slot) == mlx5::PostResult::ok);
    CHECK(post_buffer(7) == mlx5::PostResult::queue_full);  // max_wr 7: the sentinel is never posted

    int received_from[2] = {0, 0};
    for (std::uint32_t message = 0; message < 200; ++message) {
        SoftEndpoint& sender = *senders[message % 2];
        std::memset(sender.buffer(), static_cast<int>(message & 0xff), 100);
        const mlx5::ScatterGatherElement element = sender.local(0, 100);
        mlx5::SendWorkRequest request;
        request.wr_id = message;
        request.opcode = mlx5::SendOpcode::send_with_immediate;
        request.immediate = message;
        request.flags = mlx5::kSendSignaled;
        request.sg_list = &element;
        request.num_sge = 1;
        REQUIRE(sender.post(&request, 1) == mlx5::PostResult::ok);
        REQUIRE(sender.wait_send().has_value());
        mlx5::Completion completion;
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (completions.poll(&completion, 1, resolve) == 0) REQUIRE(std::chrono::steady_clock::now() < until);
        REQUIRE(completion.status == mlx5::CompletionStatus::success);
        CHECK(completion.immediate == message);
        CHECK(completion.byte_len == 100);
        const int from = completion.qp_num == receivers[0]->qpn() ? 0 : 1;
        CHECK(completion.src_qp == senders[from]->queue_pair().qpn());
        ++received_from[from];
        const std::uint64_t slot = completion.wr_id;
        REQUIRE(slot < 7);
        CHECK(memory[slot * 1024] == static_cast<std::uint8_t>(message & 0xff));
        CHECK(memory[slot * 1024 + 99] == static_cast<std::uint8_t>(message & 0xff));
        REQUIRE(post_buffer(slot) == mlx5::PostResult::ok);
    }
    CHECK(received_from[0] == 100);
    CHECK(received_from[1] == 100);
}
