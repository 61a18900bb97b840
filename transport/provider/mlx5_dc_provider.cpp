#include "transport/provider/mlx5_dc_provider.hpp"

#include <cstring>
#include <vector>

#include "rdmachan/error.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/provider/mlx5_dc_parameters.hpp"
#include "transport/verbs/dc_connection.hpp"
#include "transport/verbs/mlx5_dc.hpp"
#include "transport/verbs/shared_receive_queue.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::transport::mlx5_dc {
namespace {

class Initiator final : public RingQueuePair {
public:
    Initiator(RingQueuePairInit init, std::shared_ptr<verbs::QueuePair> queue_pair, std::uint8_t port)
        : RingQueuePair(std::move(init)), queue_pair_(std::move(queue_pair)), port_(port) {}

    void connect(const ConnectSettings& settings) override {
        try {
            verbs::connect_dc_initiator(*queue_pair_, initiator_parameters(port_, settings));
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

    void move_to_error() override { modify_state(IBV_QPS_ERR, "DCI ->ERR"); }

    // RESET clears the hardware's producer and consumer; ours restart at 0 with it
    // (mlx5-facts.md §6). The engine took every completion of this DCI before.
    void recover() {
        modify_state(IBV_QPS_RESET, "DCI ->RESET");
        reset_send_queue();
    }

private:
    void modify_state(ibv_qp_state state, const char* name) {
        verbs::QueuePairTransition transition;
        transition.attributes.qp_state = state;
        transition.mask = IBV_QP_STATE;
        try {
            queue_pair_->modify(transition, name);
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }
    std::shared_ptr<verbs::QueuePair> queue_pair_;
    std::uint8_t port_;
};

// Posted through its ring only: libmlx5 refills an SRQ's free list from its own poller, which
// a direct-polled CQ never runs (mlx5-facts.md §9 pitfall 7).
class SharedQueue final : public SharedReceiveQueue {
public:
    explicit SharedQueue(std::shared_ptr<verbs::SharedReceiveQueue> queue)
        : queue_(std::move(queue)), ring_descriptor_(verbs::mlx5_shared_receive_queue_ring(*queue_)),
          wr_ids_(ring_descriptor_.wqe_count),
          ring_(ring_descriptor_, wr_ids_.data(), 0, ring_descriptor_.wqe_count - 1) {}

    mlx5::PostResult post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                  std::uint32_t* posted) noexcept override {
        return ring_.post(requests, count, posted);
    }
    mlx5::SharedReceiveQueue& ring() { return ring_; }
    const std::shared_ptr<verbs::SharedReceiveQueue>& verbs_queue() const { return queue_; }

private:
    std::shared_ptr<verbs::SharedReceiveQueue> queue_;
    mlx5::SharedReceiveQueueRing ring_descriptor_;
    std::vector<std::uint64_t> wr_ids_;
    mlx5::SharedReceiveQueue ring_;
};

class Target final : public DcTarget {
public:
    Target(std::shared_ptr<verbs::Mlx5DcTarget> target, std::shared_ptr<SharedQueue> shared_queue,
           std::shared_ptr<RingCompletionQueue> receive_queue, unsigned access)
        : target_(std::move(target)), shared_queue_(std::move(shared_queue)),
          receive_queue_(std::move(receive_queue)), access_(access) {
        completion_target_.shared_receive = &shared_queue_->ring();
    }
    ~Target() override {
        if (ready_) receive_queue_->detach(target_->number());
    }

    void make_ready(std::uint8_t port, std::uint32_t path_mtu, std::uint8_t min_rnr_timer) override {
        try {
            target_->connect(target_parameters(port, path_mtu, min_rnr_timer, access_));
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
        receive_queue_->attach(target_->number(), &completion_target_);
        ready_ = true;
    }

    std::uint32_t number() const override {
        try {
            return target_->number();
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

private:
    std::shared_ptr<verbs::Mlx5DcTarget> target_;
    std::shared_ptr<SharedQueue> shared_queue_;
    std::shared_ptr<RingCompletionQueue> receive_queue_;
    unsigned access_;
    mlx5::CompletionTarget completion_target_;
    bool ready_ = false;
};

std::shared_ptr<verbs::CompletionQueue> verbs_queue_of(const RingCompletionQueue& queue) {
    return std::static_pointer_cast<Mlx5CompletionQueueOwner>(queue.owner())->queue;
}

}  // namespace

std::shared_ptr<QueuePair> create_initiator(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                            const std::shared_ptr<verbs::Mlx5ParentDomain>& parent_domain,
                                            const QueuePairSettings& settings,
                                            std::shared_ptr<RingCompletionQueue> send_queue) {
    verbs::QueuePairParents parents;
    parents.protection_domain = domain;
    parents.send_completion_queue = verbs_queue_of(*send_queue);
    const verbs::QueuePairCapabilities capabilities{settings.max_send_wr, 0, settings.max_send_sge, 0,
                                                    settings.max_inline_data};
    verbs::Mlx5DcInitiator created = verbs::create_mlx5_dc_initiator(std::move(parents), capabilities, parent_domain);
    const verbs::QueuePairCapabilities& granted = created.queue_pair->capabilities();
    RingQueuePairInit ring;
    ring.send_ring = created.send;
    ring.max_send_wr = granted.max_send_wr;
    ring.max_send_sge = granted.max_send_sge;
    ring.max_inline_data = granted.max_inline_data;
    ring.dc_initiator = true;
    ring.send_queue = send_queue;
    ring.receive_queue = std::move(send_queue);
    return std::make_shared<Initiator>(std::move(ring), std::move(created.queue_pair), settings.port);
}

void recover_initiator(QueuePair& initiator) { dynamic_cast<Initiator&>(initiator).recover(); }

std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                                                std::uint32_t max_wr) {
    return std::make_shared<SharedQueue>(verbs::SharedReceiveQueue::create(domain, max_wr, 1));
}

std::shared_ptr<DcTarget> create_target(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                        std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                        std::shared_ptr<RingCompletionQueue> receive_queue, std::uint64_t access_key,
                                        unsigned access) {
    auto shared = std::dynamic_pointer_cast<SharedQueue>(shared_receive_queue);
    if (shared == nullptr) throw Error("create_dc_target: the shared receive queue is another device's");
    verbs::QueuePairParents parents;
    parents.protection_domain = domain;
    parents.receive_completion_queue = verbs_queue_of(*receive_queue);
    parents.send_completion_queue = parents.receive_completion_queue;
    parents.shared_receive_queue = shared->verbs_queue();
    return std::make_shared<Target>(verbs::Mlx5DcTarget::create(std::move(parents), access_key), std::move(shared),
                                    std::move(receive_queue), access);
}

std::array<std::uint8_t, 48> address_vector(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                            const PortIdentity& local, const Gid& gid, std::uint16_t lid,
                                            std::uint32_t dctn, std::uint64_t key) {
    ibv_ah_attr attributes{};
    attributes.port_num = local.port;
    attributes.dlid = lid;
    // RoCE needs the GRH; InfiniBand within a subnet addresses by LID alone.
    if (local.ethernet || lid == 0) {
        attributes.is_global = 1;
        std::memcpy(attributes.grh.dgid.raw, gid.data(), gid.size());
        attributes.grh.sgid_index = local.gid_index;
        attributes.grh.hop_limit = 64;
    }
    const std::shared_ptr<verbs::AddressHandle> handle = verbs::AddressHandle::create(domain, attributes);
    const std::array<std::uint8_t, 48> base = verbs::address_vector_of(*handle, domain->context()->name());
    std::uint8_t vector[mlx5::kAddressVectorSize];
    mlx5::make_dc_address_vector(vector, base.data(), dctn, key);
    std::array<std::uint8_t, 48> result{};
    std::memcpy(result.data(), vector, result.size());
    return result;
}

}  // namespace rdmachan::transport::mlx5_dc
