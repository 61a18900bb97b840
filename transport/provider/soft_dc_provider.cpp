#include "transport/provider/soft_dc_provider.hpp"

#include <vector>

#include "rdmachan/error.hpp"
#include "transport/mlx5/address_vector.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::transport::soft_dc {
namespace {

class Initiator final : public RingQueuePair {
public:
    Initiator(RingQueuePairInit init, std::shared_ptr<soft::DcInitiator> initiator, std::uint8_t port)
        : RingQueuePair(std::move(init)), initiator_(std::move(initiator)), port_(port) {
        set_doorbell_notification(
            [](void* context) { static_cast<soft::DcInitiator*>(context)->ring_send_doorbell(); }, initiator_.get());
    }

    void connect(const ConnectSettings& settings) override {
        try {
            initiator_->modify_to_init(port_, 0);
            initiator_->modify_to_ready_to_receive(settings.path_mtu);
            soft::ReadyToSendAttributes send;
            send.sq_psn = settings.local_psn;
            send.timeout = settings.ack_timeout;
            send.retry_cnt = settings.retry_count;
            send.rnr_retry = settings.rnr_retry;
            send.max_rd_atomic = settings.max_rd_atomic;
            initiator_->modify_to_ready_to_send(send);
        } catch (const soft::SoftDeviceError& error) {
            throw Error("connect DC initiator " + std::to_string(qpn()) + ": " + error.what());
        }
    }

    void move_to_error() override { initiator_->modify_to_error(); }

    void recover() {
        initiator_->modify_to_reset();
        reset_send_queue();
    }

private:
    std::shared_ptr<soft::DcInitiator> initiator_;
    std::uint8_t port_;
};

class SharedQueue final : public SharedReceiveQueue {
public:
    SharedQueue(std::shared_ptr<soft::SharedReceiveQueue> queue, std::shared_ptr<RingCompletionQueue> receive_queue)
        : queue_(std::move(queue)),
          receive_queue_(std::move(receive_queue)),
          wr_ids_(queue_->ring().wqe_count),
          ring_(queue_->ring(), wr_ids_.data(), 0, queue_->initial_tail()) {}

    mlx5::PostResult post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                  std::uint32_t* posted) noexcept override {
        return ring_.post(requests, count, posted);
    }

    mlx5::SharedReceiveQueue& ring() { return ring_; }
    const std::shared_ptr<soft::SharedReceiveQueue>& soft_queue() const { return queue_; }

private:
    std::shared_ptr<soft::SharedReceiveQueue> queue_;
    std::shared_ptr<RingCompletionQueue> receive_queue_;
    std::vector<std::uint64_t> wr_ids_;
    mlx5::SharedReceiveQueue ring_;
};

class Target final : public DcTarget {
public:
    Target(std::shared_ptr<soft::DcTarget> target, std::shared_ptr<SharedQueue> shared_queue,
           std::shared_ptr<RingCompletionQueue> receive_queue)
        : target_(std::move(target)), shared_queue_(std::move(shared_queue)), receive_queue_(std::move(receive_queue)) {
        completion_target_.shared_receive = &shared_queue_->ring();
    }
    ~Target() override {
        if (attached_) receive_queue_->detach(number_);
    }

    void make_ready(std::uint8_t port, std::uint32_t path_mtu, std::uint8_t min_rnr_timer) override {
        try {
            target_->modify_to_init(port);
            target_->modify_to_ready_to_receive({path_mtu, min_rnr_timer});
            number_ = target_->dctn();
        } catch (const soft::SoftDeviceError& error) {
            throw Error(std::string("DC target to RTR: ") + error.what());
        }
        // Its receive CQEs name the DCT number: the CQ finds the SRQ through it.
        receive_queue_->attach(number_, &completion_target_);
        attached_ = true;
    }

    std::uint32_t number() const override {
        if (!attached_) throw Error("the DCT number exists only once the DC target is in RTR");
        return number_;
    }

private:
    std::shared_ptr<soft::DcTarget> target_;
    std::shared_ptr<SharedQueue> shared_queue_;
    std::shared_ptr<RingCompletionQueue> receive_queue_;
    mlx5::CompletionTarget completion_target_;
    std::uint32_t number_ = 0;
    bool attached_ = false;
};

}  // namespace

std::shared_ptr<QueuePair> create_initiator(const std::shared_ptr<soft::Device>& device,
                                            const std::shared_ptr<soft::ProtectionDomain>& domain,
                                            const QueuePairSettings& settings,
                                            std::shared_ptr<RingCompletionQueue> send_queue) {
    soft::DcInitiatorInit init;
    init.send_cq = std::static_pointer_cast<soft::CompletionQueue>(send_queue->owner());
    init.capabilities = {settings.max_send_wr, 0, settings.max_send_sge, 0, settings.max_inline_data};
    try {
        std::shared_ptr<soft::DcInitiator> initiator = device->create_dc_initiator(domain, init);
        RingQueuePairInit ring;
        ring.send_ring = initiator->send_ring();
        ring.max_send_wr = settings.max_send_wr;
        ring.max_send_sge = initiator->max_send_sge();
        ring.max_inline_data = initiator->max_inline_data();
        ring.dc_initiator = true;
        ring.send_queue = send_queue;
        ring.receive_queue = std::move(send_queue);
        return std::make_shared<Initiator>(std::move(ring), std::move(initiator), settings.port);
    } catch (const soft::SoftDeviceError& error) {
        throw Error("create_dc_initiator on " + device->name() + ": " + error.what());
    }
}

void recover_initiator(QueuePair& initiator) {
    try {
        dynamic_cast<Initiator&>(initiator).recover();
    } catch (const soft::SoftDeviceError& error) {
        throw Error("recover DC initiator " + std::to_string(initiator.qpn()) + ": " + error.what());
    }
}

std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(const std::shared_ptr<soft::Device>& device,
                                                                const std::shared_ptr<soft::ProtectionDomain>& domain,
                                                                std::uint32_t max_wr,
                                                                std::shared_ptr<RingCompletionQueue> receive_queue) {
    try {
        return std::make_shared<SharedQueue>(device->create_shared_receive_queue(domain, max_wr, 1),
                                             std::move(receive_queue));
    } catch (const soft::SoftDeviceError& error) {
        throw Error("create_shared_receive_queue(" + std::to_string(max_wr) + ") on " + device->name() + ": " +
                    error.what());
    }
}

std::shared_ptr<DcTarget> create_target(const std::shared_ptr<soft::Device>& device,
                                        const std::shared_ptr<soft::ProtectionDomain>& domain,
                                        std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                        std::shared_ptr<RingCompletionQueue> receive_queue, std::uint64_t access_key,
                                        std::uint32_t soft_access) {
    auto shared = std::dynamic_pointer_cast<SharedQueue>(shared_receive_queue);
    if (shared == nullptr) throw Error("create_dc_target on " + device->name() + ": the SRQ is not this device's");
    soft::DcTargetInit init;
    init.srq = shared->soft_queue();
    init.recv_cq = std::static_pointer_cast<soft::CompletionQueue>(receive_queue->owner());
    init.send_cq = init.recv_cq;
    init.access_flags = soft_access;
    init.dc_access_key = access_key;
    try {
        return std::make_shared<Target>(device->create_dc_target(domain, init), std::move(shared),
                                        std::move(receive_queue));
    } catch (const soft::SoftDeviceError& error) {
        throw Error("create_dc_target on " + device->name() + ": " + error.what());
    }
}

std::array<std::uint8_t, 48> address_vector(const Gid& gid, std::uint16_t lid, std::uint32_t dctn, std::uint64_t key) {
    // The base vector as the software device reads it (and as an mlx5 address handle holds it):
    // GRH present, the peer's GID and LID; then the DCT number and key.
    mlx5::Destination destination;
    destination.lid = lid;
    destination.global = true;
    destination.route.hop_limit = 64;
    std::copy(gid.begin(), gid.end(), destination.route.destination_gid);
    std::uint8_t base[mlx5::kAddressVectorSize];
    mlx5::make_address_vector(base, destination);
    std::uint8_t vector[mlx5::kAddressVectorSize];
    mlx5::make_dc_address_vector(vector, base, dctn, key);
    std::array<std::uint8_t, 48> result{};
    std::copy(std::begin(vector), std::end(vector), result.begin());
    return result;
}

}  // namespace rdmachan::transport::soft_dc
