// Test fixture: one RC QP on a software device, driven through the project's mlx5 data path
// (SendQueue, ReceiveQueue, CompletionQueue) exactly as the channel layer will drive it.
#pragma once

#include <doctest/doctest.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <memory>
#include <optional>
#include <span>
#include <thread>
#include <vector>

#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/receive_queue.hpp"
#include "transport/mlx5/send_queue.hpp"
#include "transport/soft/device.hpp"

namespace rdmachan::test {

namespace mlx5 = rdmachan::mlx5;

// What a peer needs to connect to this endpoint; sent through a pipe between processes.
struct Address {
    std::uint8_t gid[16];
    std::uint16_t lid;
    std::uint32_t qpn;
    std::uint64_t buffer_addr;
    std::uint32_t rkey;
};

struct EndpointOptions {
    std::uint32_t buffer_size = 1 << 20;
    std::uint32_t access = soft::kLocalWrite | soft::kRemoteWrite | soft::kRemoteRead | soft::kRemoteAtomic;
    std::uint32_t max_send_wr = 256;
    std::uint32_t max_recv_wr = 256;
    std::uint32_t cq_entries = 1024;
    std::uint8_t rnr_retry = 7;
    std::uint8_t min_rnr_timer = 1;
    std::uint8_t timeout = 17;  // 0.54 s per try: tests run on 2 loaded cores, not on a NIC
    std::uint8_t retry_cnt = 3;
    // The buffer comes from the device's arena (Device::allocate_memory), not from the heap.
    bool allocated = false;
    // Both CQs created for CQE compression (transport/soft/held_completions.hpp).
    bool compressed_cqes = false;
    // The QP created with scatter-to-CQE, and its CQEs' data copied by the poller.
    bool scatter_to_cqe = false;
};

class SoftEndpoint {
    // Maps a CQE's QPN to this endpoint's queues; defined first so its type is known below.
    auto resolver() {
        return [this](std::uint32_t qpn, std::uint32_t) -> mlx5::CompletionTarget* {
            return qpn == queue_pair_->qpn() ? &target_ : nullptr;
        };
    }

public:
    // With `domain`, the queue pair and buffer belong to that protection domain (a second queue
    // pair of the same domain: for UMR work requests, whose keys then serve the first one).
    explicit SoftEndpoint(std::shared_ptr<soft::Device> device, const EndpointOptions& options = {},
                          std::shared_ptr<soft::ProtectionDomain> domain = nullptr)
        : device_(std::move(device)), options_(options), buffer_(options.allocated ? 0 : options.buffer_size) {
        domain_ = domain != nullptr ? std::move(domain) : device_->allocate_protection_domain();
        constexpr std::uint32_t kAll = soft::kLocalWrite | soft::kRemoteWrite | soft::kRemoteRead | soft::kRemoteAtomic;
        if (options.allocated) {
            region_ = device_->allocate_memory(domain_, options.buffer_size, kAll);
            if (region_ == nullptr) throw std::runtime_error("the device's arena refused " + std::to_string(options.buffer_size) + " bytes");
            memory_ = reinterpret_cast<std::uint8_t*>(region_->addr());
        } else {
            region_ = device_->register_memory(domain_, buffer_.data(), buffer_.size(), kAll);
            memory_ = buffer_.data();
        }
        send_cq_ = device_->create_completion_queue(options.cq_entries, 64, options.compressed_cqes);
        recv_cq_ = device_->create_completion_queue(options.cq_entries, 64, options.compressed_cqes);
        soft::QueuePairInit init;
        init.send_cq = send_cq_;
        init.recv_cq = recv_cq_;
        init.capabilities = {options.max_send_wr, options.max_recv_wr, 4, 4, 128};
        init.scatter_to_cqe = options.scatter_to_cqe;
        queue_pair_ = device_->create_queue_pair(domain_, init);
        const mlx5::SendQueueRing& send_ring = queue_pair_->send_ring();
        send_wr_ids_.resize(send_ring.wqe_count);
        send_wqe_ends_.resize(send_ring.wqe_count);
        send_umr_opcodes_.resize(send_ring.wqe_count);
        mlx5::SendQueueConfig config;
        config.max_sge = 4;
        config.max_inline_data = 128;
        send_ = mlx5::SendQueue(send_ring, {send_wr_ids_.data(), send_wqe_ends_.data(), 0, 0, send_umr_opcodes_.data()},
                                config);
        receive_wr_ids_.resize(queue_pair_->receive_ring().wqe_count);
        receive_ = mlx5::ReceiveQueue(queue_pair_->receive_ring(), receive_wr_ids_.data(), {});
        send_completions_ = mlx5::CompletionQueue(send_cq_->ring());
        receive_completions_ = mlx5::CompletionQueue(recv_cq_->ring());
        target_.send = &send_.tracking();
        target_.send_wqe_count = send_ring.wqe_count;
        target_.receive = &receive_;
        target_.scatter_to_cqe = options.scatter_to_cqe;
        target_.send_ring = options.scatter_to_cqe ? send_ring.buffer : nullptr;
        queue_pair_->modify_to_init(1, options.access);
    }

    Address address() const {
        Address address{};
        const auto gid = device_->gid();
        std::memcpy(address.gid, gid.data(), 16);
        address.lid = device_->lid();
        address.qpn = queue_pair_->qpn();
        address.buffer_addr = reinterpret_cast<std::uint64_t>(memory_);
        address.rkey = region_->rkey();
        return address;
    }

    void connect(const Address& remote) {
        soft::ReadyToReceiveAttributes receive;
        std::memcpy(receive.remote.gid.data(), remote.gid, 16);
        receive.remote.lid = remote.lid;
        receive.remote.qpn = remote.qpn;
        receive.rq_psn = 0x1000;
        receive.min_rnr_timer = options_.min_rnr_timer;
        queue_pair_->modify_to_ready_to_receive(receive);
        soft::ReadyToSendAttributes send;
        send.sq_psn = 0x1000;
        send.rnr_retry = options_.rnr_retry;
        send.timeout = options_.timeout;
        send.retry_cnt = options_.retry_cnt;
        queue_pair_->modify_to_ready_to_send(send);
    }

    mlx5::PostResult post(const mlx5::SendWorkRequest* requests, std::uint32_t count, std::uint32_t* posted = nullptr) {
        const mlx5::PostResult result = send_.post(requests, count, posted);
        queue_pair_->ring_send_doorbell();
        return result;
    }

    mlx5::PostResult post_receive(std::uint64_t wr_id, std::uint64_t offset, std::uint32_t length) {
        mlx5::ScatterGatherElement element{reinterpret_cast<std::uint64_t>(memory_) + offset, length, region_->lkey()};
        mlx5::ReceiveWorkRequest request{wr_id, &element, 1};
        return receive_.post(&request, 1, nullptr);
    }

    // Receives of `length` bytes each, at offset, offset + stride, ..., posted with one doorbell
    // record update: they become visible to the device all at once.
    mlx5::PostResult post_receives(std::uint64_t first_wr_id, std::uint32_t count, std::uint64_t offset, std::uint32_t stride,
                                   std::uint32_t length) {
        std::vector<mlx5::ScatterGatherElement> elements(count);
        std::vector<mlx5::ReceiveWorkRequest> requests(count);
        for (std::uint32_t i = 0; i < count; ++i) {
            elements[i] = {reinterpret_cast<std::uint64_t>(memory_) + offset + std::uint64_t{i} * stride, length, region_->lkey()};
            requests[i] = {first_wr_id + i, &elements[i], 1};
        }
        return receive_.post(requests.data(), count, nullptr);
    }

    // A receive into any memory the device translates (an indirect key, zero-based).
    mlx5::PostResult post_receive(std::uint64_t wr_id, const mlx5::ScatterGatherElement& element) {
        mlx5::ReceiveWorkRequest request{wr_id, &element, 1};
        return receive_.post(&request, 1, nullptr);
    }

    mlx5::ScatterGatherElement local(std::uint64_t offset, std::uint32_t length) const {
        return {reinterpret_cast<std::uint64_t>(memory_) + offset, length, region_->lkey()};
    }

    // Polls until one completion arrives on the send (or receive) CQ, or the deadline passes.
    std::optional<mlx5::Completion> wait_send(std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
        return wait(send_completions_, deadline);
    }
    std::optional<mlx5::Completion> wait_receive(std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
        return wait(receive_completions_, deadline);
    }
    std::uint32_t poll_send(mlx5::Completion* completions, std::uint32_t capacity) {
        return send_completions_.poll(completions, capacity, resolver());
    }

    std::uint8_t* buffer() { return memory_; }
    soft::QueuePair& queue_pair() { return *queue_pair_; }
    mlx5::SendQueue& send_queue() { return send_; }
    soft::Device& device() { return *device_; }
    soft::ProtectionDomain& domain() { return *domain_; }
    const std::shared_ptr<soft::ProtectionDomain>& domain_pointer() { return domain_; }
    std::uint32_t lkey() const { return region_->lkey(); }
    soft::CompletionQueue& send_cq() { return *send_cq_; }
    soft::CompletionQueue& receive_cq() { return *recv_cq_; }
    bool receive_cq_overrun() const { return recv_cq_->overrun(); }

private:
    std::optional<mlx5::Completion> wait(mlx5::CompletionQueue& queue, std::chrono::milliseconds deadline) {
        const auto until = std::chrono::steady_clock::now() + deadline;
        mlx5::Completion completion;
        while (std::chrono::steady_clock::now() < until) {
            if (queue.poll(&completion, 1, resolver()) == 1) return completion;
            std::this_thread::yield();
        }
        return std::nullopt;
    }

    std::shared_ptr<soft::Device> device_;
    EndpointOptions options_;
    std::vector<std::uint8_t> buffer_;  // empty when the buffer is allocated by the device
    std::uint8_t* memory_ = nullptr;
    std::shared_ptr<soft::ProtectionDomain> domain_;
    std::shared_ptr<soft::MemoryRegion> region_;
    std::shared_ptr<soft::CompletionQueue> send_cq_;
    std::shared_ptr<soft::CompletionQueue> recv_cq_;
    std::shared_ptr<soft::QueuePair> queue_pair_;
    std::vector<std::uint64_t> send_wr_ids_;
    std::vector<std::uint32_t> send_wqe_ends_;
    std::vector<std::uint8_t> send_umr_opcodes_;  // LOCAL_INV or key configuration, per UMR WQE
    std::vector<std::uint64_t> receive_wr_ids_;
    mlx5::SendQueue send_;
    mlx5::ReceiveQueue receive_;
    mlx5::CompletionQueue send_completions_;
    mlx5::CompletionQueue receive_completions_;
    mlx5::CompletionTarget target_;
};

inline mlx5::SendWorkRequest write_request(std::uint64_t wr_id, const mlx5::ScatterGatherElement* element,
                                           std::uint64_t remote_addr, std::uint32_t rkey, std::uint32_t flags = mlx5::kSendSignaled) {
    mlx5::SendWorkRequest request;
    request.wr_id = wr_id;
    request.opcode = mlx5::SendOpcode::rdma_write;
    request.flags = flags;
    request.sg_list = element;
    request.num_sge = 1;
    request.remote_addr = remote_addr;
    request.rkey = rkey;
    return request;
}

// A send of the `count` pieces at `elements` (any opcode that carries no remote address).
inline mlx5::SendWorkRequest send_request(std::uint64_t wr_id, const mlx5::ScatterGatherElement* elements, std::uint32_t count,
                                          mlx5::SendOpcode opcode, std::uint32_t flags = mlx5::kSendSignaled) {
    mlx5::SendWorkRequest request;
    request.wr_id = wr_id;
    request.opcode = opcode;
    request.flags = flags;
    request.sg_list = elements;
    request.num_sge = count;
    return request;
}

// Waits for the next send completions, one per entry of `opcodes`: each successful, with the
// wr_ids first_wr_id, first_wr_id + 1, ... in that order, and that entry's opcode.
inline void expect_send_completions(SoftEndpoint& endpoint, std::uint64_t first_wr_id,
                                    std::span<const mlx5::CompletionOpcode> opcodes) {
    for (std::size_t i = 0; i < opcodes.size(); ++i) {
        const auto completion = endpoint.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->wr_id == first_wr_id + i);
        CHECK(completion->opcode == opcodes[i]);
    }
}

// Posts `request` signaled and waits for its completion (the endpoint's default deadline).
inline mlx5::Completion run_signaled(SoftEndpoint& endpoint, mlx5::SendWorkRequest request) {
    request.flags |= mlx5::kSendSignaled;
    REQUIRE(endpoint.post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = endpoint.wait_send();
    REQUIRE(completion.has_value());
    return *completion;
}

// A small read into the last 64 bytes of the initiator's buffer. It opens the connection, and
// when it completes the hello reply that settles the path (same host or TCP, and on the same
// host maps the target's published table) has arrived: it was sent before the answer, on the
// same connection. A result rather than a REQUIRE, so a forked child can call it.
inline bool settle_path(SoftEndpoint& initiator, const Address& remote) {
    const mlx5::ScatterGatherElement into = initiator.local((1 << 20) - 64, 8);
    mlx5::SendWorkRequest read = write_request(1000, &into, remote.buffer_addr, remote.rkey);
    read.opcode = mlx5::SendOpcode::rdma_read;
    if (initiator.post(&read, 1) != mlx5::PostResult::ok) return false;
    const auto completion = initiator.wait_send();
    return completion && completion->status == mlx5::CompletionStatus::success;
}

// Bytes of [memory, memory + length) other than `expected`. Not instrumented by ASan: a forked
// child may map fresh pages where its parent's heap was, and the shadow memory it inherited
// still calls them a heap block's redzone.
__attribute__((no_sanitize("address"))) inline std::size_t bytes_differing(const std::uint8_t* memory, std::size_t length,
                                                                           std::uint8_t expected) {
    std::size_t differing = 0;
    for (std::size_t b = 0; b < length; ++b) differing += memory[b] != expected;
    return differing;
}

// A simulated partition (soft::simulate_partition) for the guard's lifetime, lifted however the
// test ends, so a failed check cannot leave it on for the cases after it.
class ScopedPartition {
public:
    ScopedPartition() { soft::simulate_partition(true); }
    ~ScopedPartition() { soft::simulate_partition(false); }
    ScopedPartition(const ScopedPartition&) = delete;
    ScopedPartition& operator=(const ScopedPartition&) = delete;
};

}  // namespace rdmachan::test
