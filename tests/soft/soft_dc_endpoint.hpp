// Test fixtures for DC on the software device, driven through the project's mlx5 data path:
// a DC initiator (SendQueue with dc_initiator, its CQ poller) and a DC target (an SRQ posted
// through SharedReceiveQueue, its receive CQ poller, a registered buffer others may access).
#pragma once

#include <doctest/doctest.h>

#include <array>
#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/send_queue.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/soft/device.hpp"

namespace rdmachan::test {

namespace mlx5 = rdmachan::mlx5;

inline constexpr std::uint64_t kDcKey = 0x1ee7a330;  // UCX's UCT_IB_KEY, on both sides
inline constexpr std::uint32_t kAllAccess =
    soft::kLocalWrite | soft::kRemoteWrite | soft::kRemoteRead | soft::kRemoteAtomic;

// What an initiator needs to reach a DCT; plain bytes, so it also crosses a pipe.
struct DcTargetAddress {
    std::array<std::uint8_t, 48> base_address_vector;
    std::uint32_t dctn;
    std::uint64_t buffer_addr;
    std::uint32_t rkey;
};

template <typename Queue>
std::optional<mlx5::Completion> wait_for(Queue& queue, mlx5::CompletionTarget& target,
                                         std::uint32_t qpn, std::chrono::milliseconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    mlx5::Completion completion;
    auto resolve = [&](std::uint32_t cqe_qpn, std::uint32_t) {
        return cqe_qpn == qpn ? &target : static_cast<mlx5::CompletionTarget*>(nullptr);
    };
    while (std::chrono::steady_clock::now() < until) {
        if (queue.poll(&completion, 1, resolve) == 1) return completion;
        std::this_thread::yield();
    }
    return std::nullopt;
}

// The endpoints' buffer: `length` bytes from the device's arena (allocated), else `heap` sized
// to it and registered. `memory` is where the bytes are.
inline std::shared_ptr<soft::MemoryRegion> allocate_or_register(soft::Device& device,
                                                                const std::shared_ptr<soft::ProtectionDomain>& domain,
                                                                std::vector<std::uint8_t>& heap, std::uint32_t length,
                                                                bool allocated, std::uint8_t*& memory) {
    if (!allocated) {
        memory = heap.data();
        return device.register_memory(domain, heap.data(), heap.size(), kAllAccess);
    }
    auto region = device.allocate_memory(domain, length, kAllAccess);
    if (region == nullptr) throw std::runtime_error("the device's arena refused " + std::to_string(length) + " bytes");
    memory = reinterpret_cast<std::uint8_t*>(region->addr());
    return region;
}

class DcTargetEndpoint {
  public:
    // min_rnr_timer: verbs encoding (1 = 0.01 ms, 31 = 491.52 ms) the DCT asks initiators to
    // wait after an RNR NAK.
    // allocated: the buffer comes from the device's arena (Device::allocate_memory), where
    // same-host peers' zero-hop requests move bytes with a memcpy, not from the heap.
    explicit DcTargetEndpoint(std::shared_ptr<soft::Device> device, std::uint64_t key = kDcKey,
                              std::uint32_t buffer_size = 1 << 20, std::uint8_t min_rnr_timer = 1, bool allocated = false)
        : device_(std::move(device)), buffer_(allocated ? 0 : buffer_size) {
        domain_ = device_->allocate_protection_domain();
        region_ = allocate_or_register(*device_, domain_, buffer_, buffer_size, allocated, memory_);
        srq_ = device_->create_shared_receive_queue(domain_, 63, 1);
        cq_ = device_->create_completion_queue(256);
        soft::DcTargetInit init;
        init.srq = srq_;
        init.recv_cq = cq_;
        init.send_cq = cq_;
        init.access_flags = kAllAccess;
        init.dc_access_key = key;
        target_ = device_->create_dc_target(domain_, init);
        srq_wr_ids_.resize(srq_->ring().wqe_count);
        shared_ =
            mlx5::SharedReceiveQueue(srq_->ring(), srq_wr_ids_.data(), 0, srq_->initial_tail());
        completions_ = mlx5::CompletionQueue(cq_->ring());
        completion_target_.shared_receive = &shared_;
        target_->modify_to_init(1);
        target_->modify_to_ready_to_receive({1024, min_rnr_timer});
    }

    DcTargetAddress address() const {
        return {device_->address_vector(), target_->dctn(), reinterpret_cast<std::uint64_t>(memory_), region_->rkey()};
    }

    mlx5::PostResult post_receive(std::uint64_t wr_id, std::uint64_t offset, std::uint32_t length) {
        const mlx5::ScatterGatherElement element{reinterpret_cast<std::uint64_t>(memory_) + offset, length, region_->lkey()};
        const mlx5::ReceiveWorkRequest request{wr_id, &element, 1};
        return shared_.post(&request, 1, nullptr);
    }

    std::optional<mlx5::Completion> wait_receive(
        std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
        return wait_for(completions_, completion_target_, target_->dctn(), deadline);
    }

    std::uint8_t* buffer() { return memory_; }
    soft::DcTarget& target() { return *target_; }
    soft::Device& device() { return *device_; }

  private:
    std::shared_ptr<soft::Device> device_;
    std::vector<std::uint8_t> buffer_;  // empty when the buffer is allocated by the device
    std::uint8_t* memory_ = nullptr;
    std::shared_ptr<soft::ProtectionDomain> domain_;
    std::shared_ptr<soft::MemoryRegion> region_;
    std::shared_ptr<soft::SharedReceiveQueue> srq_;
    std::shared_ptr<soft::CompletionQueue> cq_;
    std::shared_ptr<soft::DcTarget> target_;
    std::vector<std::uint64_t> srq_wr_ids_;
    mlx5::SharedReceiveQueue shared_;
    mlx5::CompletionQueue completions_;
    mlx5::CompletionTarget completion_target_;
};

class DcInitiatorEndpoint {
  public:
    // timeout: the verbs local ACK timeout (4.096 us * 2^timeout per try, retry_cnt 3); 17 gives
    // 0.54 s per try, generous for 2 loaded cores.
    // allocated: as DcTargetEndpoint's.
    explicit DcInitiatorEndpoint(std::shared_ptr<soft::Device> device, std::uint8_t timeout = 17,
                                 std::uint32_t buffer_size = 1 << 20, bool allocated = false)
        : device_(std::move(device)), timeout_(timeout), buffer_(allocated ? 0 : buffer_size) {
        domain_ = device_->allocate_protection_domain();
        region_ = allocate_or_register(*device_, domain_, buffer_, buffer_size, allocated, memory_);
        cq_ = device_->create_completion_queue(256);
        soft::DcInitiatorInit init;
        init.send_cq = cq_;
        init.capabilities = {64, 0, 2, 0, 64};
        initiator_ = device_->create_dc_initiator(domain_, init);
        wr_ids_.resize(initiator_->send_ring().wqe_count);
        wqe_ends_.resize(initiator_->send_ring().wqe_count);
        completions_ = mlx5::CompletionQueue(cq_->ring());
        connect();
    }

    // INIT → RTR (no remote) → RTS, and a send queue starting at producer index 0: what a DCI
    // goes through when created and again after RESET. sq_psn: where its packet sequence starts
    // (a new one after RESET tells a late answer to the old sequence from one to the new).
    void connect(std::uint32_t sq_psn = 0x2000) {
        initiator_->modify_to_init(1, 0);
        initiator_->modify_to_ready_to_receive(1024);
        soft::ReadyToSendAttributes attributes;
        attributes.sq_psn = sq_psn;
        attributes.timeout = timeout_;
        attributes.retry_cnt = 3;
        attributes.rnr_retry = 7;
        initiator_->modify_to_ready_to_send(attributes);
        mlx5::SendQueueConfig config;
        config.max_sge = 2;
        config.max_inline_data = 64;
        config.dc_initiator = true;
        send_ = mlx5::SendQueue(initiator_->send_ring(), {wr_ids_.data(), wqe_ends_.data(), 0, 0},
                                config);
        completion_target_.send = &send_.tracking();
        completion_target_.send_wqe_count = initiator_->send_ring().wqe_count;
    }

    // Posts one request to the DCT `to` names, with `key` as the DC key of its address vector.
    mlx5::PostResult post(mlx5::SendWorkRequest request, const DcTargetAddress& to,
                          std::uint64_t key = kDcKey) {
        std::uint8_t address_vector[mlx5::kAddressVectorSize];
        mlx5::make_dc_address_vector(address_vector, to.base_address_vector.data(), to.dctn, key);
        request.dc_address_vector = address_vector;
        const mlx5::PostResult result = send_.post(&request, 1, nullptr);
        initiator_->ring_send_doorbell();
        return result;
    }

    std::optional<mlx5::Completion> wait_send(
        std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
        return wait_for(completions_, completion_target_, initiator_->qpn(), deadline);
    }

    mlx5::ScatterGatherElement local(std::uint64_t offset, std::uint32_t length) const {
        return {reinterpret_cast<std::uint64_t>(memory_) + offset, length, region_->lkey()};
    }

    std::uint8_t* buffer() { return memory_; }
    std::uint16_t lid() const { return device_->lid(); }
    soft::DcInitiator& initiator() { return *initiator_; }
    mlx5::SendQueue& send_queue() { return send_; }

  private:
    std::shared_ptr<soft::Device> device_;
    std::uint8_t timeout_;
    std::vector<std::uint8_t> buffer_;  // empty when the buffer is allocated by the device
    std::uint8_t* memory_ = nullptr;
    std::shared_ptr<soft::ProtectionDomain> domain_;
    std::shared_ptr<soft::MemoryRegion> region_;
    std::shared_ptr<soft::CompletionQueue> cq_;
    std::shared_ptr<soft::DcInitiator> initiator_;
    std::vector<std::uint64_t> wr_ids_;
    std::vector<std::uint32_t> wqe_ends_;
    mlx5::SendQueue send_;
    mlx5::CompletionQueue completions_;
    mlx5::CompletionTarget completion_target_;
};

inline mlx5::SendWorkRequest dc_request(mlx5::SendOpcode opcode, std::uint64_t wr_id,
                                        const mlx5::ScatterGatherElement* element,
                                        std::uint64_t remote_addr = 0, std::uint32_t rkey = 0) {
    mlx5::SendWorkRequest request;
    request.wr_id = wr_id;
    request.opcode = opcode;
    request.flags = mlx5::kSendSignaled;
    request.sg_list = element;
    request.num_sge = element != nullptr ? 1 : 0;
    request.remote_addr = remote_addr;
    request.rkey = rkey;
    return request;
}

// Posts one request and returns its completion (the test fails if none comes).
inline mlx5::Completion complete(DcInitiatorEndpoint& initiator,
                                 const mlx5::SendWorkRequest& request, const DcTargetAddress& to,
                                 std::uint64_t key = kDcKey) {
    REQUIRE(initiator.post(request, to, key) == mlx5::PostResult::ok);
    const auto completion = initiator.wait_send();
    REQUIRE(completion.has_value());
    return *completion;
}

}  // namespace rdmachan::test
