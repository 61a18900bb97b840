#include "transport/provider/soft_provider.hpp"

#include <atomic>
#include <functional>

#include "rdmachan/error.hpp"
#include "common/logger.hpp"
#include "transport/provider/mlx5_ring_queues.hpp"
#include "transport/provider/soft_dc_provider.hpp"

namespace rdmachan::transport {
namespace {

std::uint32_t soft_access(std::uint32_t access) {
    std::uint32_t flags = 0;
    if ((access & kAccessLocalWrite) != 0) flags |= soft::kLocalWrite;
    if ((access & kAccessRemoteWrite) != 0) flags |= soft::kRemoteWrite;
    if ((access & kAccessRemoteRead) != 0) flags |= soft::kRemoteRead;
    if ((access & kAccessRemoteAtomic) != 0) flags |= soft::kRemoteAtomic;
    return flags;
}

// The software device's completion events: its CQ's eventfd, told of each arm as the NIC sees
// the CQ doorbell. The CQ outlives this object (the RingCompletionQueue's owner holds it).
class SoftCompletionEvents final : public RingCompletionEvents {
public:
    explicit SoftCompletionEvents(soft::CompletionQueue& queue) : queue_(queue) {}
    int descriptor() const noexcept override { return queue_.event_descriptor(); }
    void armed() noexcept override { queue_.ring_arm_doorbell(); }
    bool take() noexcept override { return queue_.take_event(); }

private:
    soft::CompletionQueue& queue_;
};

class SoftQueuePair final : public RingQueuePair {
public:
    SoftQueuePair(RingQueuePairInit init, std::shared_ptr<soft::QueuePair> queue_pair)
        : RingQueuePair(std::move(init)), queue_pair_(std::move(queue_pair)) {
        set_doorbell_notification([](void* context) { static_cast<soft::QueuePair*>(context)->ring_send_doorbell(); },
                                  queue_pair_.get());
    }

    void connect(const ConnectSettings& settings) override {
        soft::ReadyToReceiveAttributes receive;
        receive.remote.gid = settings.remote_gid;
        receive.remote.lid = settings.remote_lid;
        receive.remote.qpn = settings.remote_qpn;
        receive.rq_psn = settings.remote_psn;
        receive.path_mtu_bytes = settings.path_mtu;
        receive.max_dest_rd_atomic = settings.max_dest_rd_atomic;
        receive.min_rnr_timer = settings.min_rnr_timer;
        soft::ReadyToSendAttributes send;
        send.sq_psn = settings.local_psn;
        send.timeout = settings.ack_timeout;
        send.retry_cnt = settings.retry_count;
        send.rnr_retry = settings.rnr_retry;
        send.max_rd_atomic = settings.max_rd_atomic;
        try {
            queue_pair_->modify_to_ready_to_receive(receive);
            queue_pair_->modify_to_ready_to_send(send);
        } catch (const soft::SoftDeviceError& error) {
            throw Error(std::string("connect QP ") + std::to_string(qpn()) + ": " + error.what());
        }
    }

    void move_to_error() override { queue_pair_->modify_to_error(); }

private:
    std::shared_ptr<soft::QueuePair> queue_pair_;
};

class SoftProtectionDomain final : public ProtectionDomain {
public:
    SoftProtectionDomain(std::shared_ptr<soft::Device> device, std::shared_ptr<soft::ProtectionDomain> domain)
        : device_(std::move(device)), domain_(std::move(domain)) {}

    // The keys, the early end and the owner of a region this device registered or allocated.
    Registration registration_of(std::shared_ptr<soft::MemoryRegion> region) const {
        Registration registration;
        registration.lkey = region->lkey();
        registration.rkey = region->rkey();
        registration.deregister = deregister_hook(region.get());
        registration.owner = std::move(region);
        return registration;
    }

    Registration register_memory(void* data, std::size_t length, std::uint32_t access) override {
        try {
            return registration_of(device_->register_memory(domain_, data, length, soft_access(access)));
        } catch (const soft::SoftDeviceError& error) {
            throw Error("register_memory on " + device_->name() + ": " + error.what());
        }
    }

    Registration allocate_memory(std::size_t length, std::uint32_t access) override {
        std::shared_ptr<soft::MemoryRegion> region;
        try {
            region = device_->allocate_memory(domain_, length, soft_access(access));
        } catch (const soft::SoftDeviceError& error) {
            throw Error("allocate_memory on " + device_->name() + ": " + error.what());
        }
        // The arena could not serve it: ordinary memory, reached by cross-memory attach (said once
        // per protection domain).
        if (region == nullptr) {
            if (!arena_fallback_logged_.exchange(true)) {
                detail::logger().info("allocate_memory on {}: the device's arena cannot serve {} bytes ({}); ordinary memory "
                                      "instead, which same-host peers reach by cross-memory attach",
                                      device_->name(), length, device_->arena_refusal());
            }
            return ProtectionDomain::allocate_memory(length, access);
        }
        Registration registration = registration_of(region);
        registration.data = reinterpret_cast<std::uint8_t*>(region->addr());  // the region owns it
        return registration;
    }

    IndirectKeyRegistration create_indirect_key(std::uint32_t max_entries) override {
        try {
            std::shared_ptr<soft::IndirectKey> key = device_->create_indirect_key(domain_, max_entries);
            IndirectKeyRegistration registration;
            registration.lkey = key->lkey();
            registration.rkey = key->rkey();
            registration.max_entries = key->max_entries();
            registration.owner = std::move(key);
            return registration;
        } catch (const soft::SoftDeviceError& error) {
            throw Error("create_indirect_key on " + device_->name() + ": " + error.what());
        }
    }

    std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth) override {
        return create_ring_queue(depth, false);
    }

    // The software device compresses CQEs as a ConnectX does (transport/soft/held_completions.hpp).
    // The mini CQE format only says what a responder's mini CQEs carry in the bytes no ibv_wc
    // field comes from (the RX hash, or the checksum): the device writes zeros there in each.
    std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth, CqeCompression compression) override {
        return create_ring_queue(depth, compression != CqeCompression::off);
    }

    std::shared_ptr<CompletionQueue> create_ring_queue(std::uint32_t depth, bool compressed) {
        try {
            std::shared_ptr<soft::CompletionQueue> queue = device_->create_completion_queue(depth, 64, compressed);
            const mlx5::CompletionQueueRing ring = queue->ring();
            auto events = std::make_unique<SoftCompletionEvents>(*queue);
            return std::make_shared<RingCompletionQueue>(ring, std::move(queue), std::move(events));
        } catch (const soft::SoftDeviceError& error) {
            throw Error("create_completion_queue(" + std::to_string(depth) + ") on " + device_->name() + ": " +
                        error.what());
        }
    }

    std::shared_ptr<QueuePair> create_queue_pair(const QueuePairSettings& settings,
                                                 std::shared_ptr<CompletionQueue> send_queue,
                                                 std::shared_ptr<CompletionQueue> receive_queue) override {
        auto send_ring_queue = std::dynamic_pointer_cast<RingCompletionQueue>(send_queue);
        auto receive_ring_queue = std::dynamic_pointer_cast<RingCompletionQueue>(receive_queue);
        if (send_ring_queue == nullptr || receive_ring_queue == nullptr) {
            throw Error("create_queue_pair on " + device_->name() + ": completion queues come from another device");
        }
        soft::QueuePairInit init;
        init.send_cq = std::static_pointer_cast<soft::CompletionQueue>(soft_owner(*send_ring_queue));
        init.recv_cq = std::static_pointer_cast<soft::CompletionQueue>(soft_owner(*receive_ring_queue));
        init.capabilities = {settings.max_send_wr, settings.max_recv_wr, settings.max_send_sge, settings.max_recv_sge,
                             settings.max_inline_data};
        init.scatter_to_cqe = settings.scatter_to_cqe;
        try {
            std::shared_ptr<soft::QueuePair> queue_pair = device_->create_queue_pair(domain_, init);
            queue_pair->modify_to_init(settings.port, soft_access(settings.access));
            RingQueuePairInit ring;
            ring.send_ring = queue_pair->send_ring();
            ring.receive_ring = queue_pair->receive_ring();
            ring.max_send_wr = settings.max_send_wr;
            ring.max_recv_wr = settings.max_recv_wr;
            ring.max_send_sge = queue_pair->max_send_sge();
            ring.max_inline_data = queue_pair->max_inline_data();
            ring.scatter_to_cqe = settings.scatter_to_cqe;
            ring.send_queue = std::move(send_ring_queue);
            ring.receive_queue = std::move(receive_ring_queue);
            return std::make_shared<SoftQueuePair>(std::move(ring), std::move(queue_pair));
        } catch (const soft::SoftDeviceError& error) {
            throw Error("create_queue_pair on " + device_->name() + ": " + error.what());
        }
    }

    std::shared_ptr<QueuePair> create_dc_initiator(const QueuePairSettings& settings,
                                                   std::shared_ptr<CompletionQueue> send_queue) override {
        return soft_dc::create_initiator(device_, domain_, settings, ring_queue(send_queue, "create_dc_initiator"));
    }

    void recover_dc_initiator(QueuePair& initiator) override { soft_dc::recover_initiator(initiator); }

    std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(
        std::uint32_t max_wr, std::shared_ptr<CompletionQueue> receive_queue) override {
        return soft_dc::create_shared_receive_queue(device_, domain_, max_wr,
                                                    ring_queue(receive_queue, "create_shared_receive_queue"));
    }

    std::shared_ptr<DcTarget> create_dc_target(std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                               std::shared_ptr<CompletionQueue> receive_queue, std::uint64_t access_key,
                                               std::uint32_t access) override {
        return soft_dc::create_target(device_, domain_, std::move(shared_receive_queue),
                                      ring_queue(receive_queue, "create_dc_target"), access_key, soft_access(access));
    }

    std::array<std::uint8_t, 48> dc_address_vector(const PortIdentity&, const Gid& gid, std::uint16_t lid,
                                                   std::uint32_t dctn, std::uint64_t key) override {
        return soft_dc::address_vector(gid, lid, dctn, key);
    }

private:
    static std::shared_ptr<void> soft_owner(RingCompletionQueue& queue) { return queue.owner(); }

    std::shared_ptr<RingCompletionQueue> ring_queue(const std::shared_ptr<CompletionQueue>& queue, const char* call) {
        auto ring = std::dynamic_pointer_cast<RingCompletionQueue>(queue);
        if (ring == nullptr) throw Error(std::string(call) + " on " + device_->name() + ": the CQ is another device's");
        return ring;
    }

    // The device's deregistration, its refusal (a same-host peer stopped in a zero-hop write of
    // the region) as rdmachan::Error. `region` lives as long as the registration's owner.
    std::function<void()> deregister_hook(soft::MemoryRegion* region) const {
        return [region] {
            try {
                region->deregister();
            } catch (const soft::SoftDeviceError& error) {
                throw Error(std::string(error.what()));
            }
        };
    }

    std::shared_ptr<soft::Device> device_;
    std::shared_ptr<soft::ProtectionDomain> domain_;
    std::atomic<bool> arena_fallback_logged_{false};
};

class SoftDevice final : public Device {
public:
    explicit SoftDevice(std::shared_ptr<soft::Device> device) : device_(std::move(device)) {}
    DeviceKind kind() const noexcept override { return DeviceKind::soft; }
    std::string name() const override { return device_->name(); }

    PortIdentity port_identity(std::uint8_t port, std::optional<std::uint8_t> gid_index) const override {
        // One port, one GID: the device's IPv4-mapped address, as RoCE v2 would publish it.
        if (port != 1) throw Error("port " + std::to_string(port) + " does not exist on " + name() + " (it has port 1)");
        if (gid_index.has_value() && *gid_index != 0) {
            throw Error("GID index " + std::to_string(*gid_index) + " does not exist on " + name() + " (it has index 0)");
        }
        PortIdentity identity;
        identity.gid = device_->gid();
        identity.lid = device_->lid();
        identity.active_mtu = 4096;
        identity.port = port;
        identity.gid_index = 0;
        identity.ethernet = true;
        return identity;
    }

    std::shared_ptr<ProtectionDomain> allocate_protection_domain() override {
        return std::make_shared<SoftProtectionDomain>(device_, device_->allocate_protection_domain());
    }

    bool progress() noexcept override { return device_->progress() != 0; }
    void stop_progress() noexcept override { device_->stop_progress(); }

private:
    std::shared_ptr<soft::Device> device_;
};

}  // namespace

std::shared_ptr<Device> make_soft_device(std::shared_ptr<soft::Device> device) {
    return std::make_shared<SoftDevice>(std::move(device));
}

}  // namespace rdmachan::transport
