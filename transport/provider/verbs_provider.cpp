#include "transport/provider/verbs_provider.hpp"

#include <fmt/format.h>

#include <mutex>

#include "rdmachan/error.hpp"
#include "common/logger.hpp"
#include "transport/provider/mlx5_dc_provider.hpp"
#include "transport/provider/mlx5_ring_queues.hpp"
#include "transport/verbs/completion_queue.hpp"
#include "transport/verbs/context.hpp"
#include "transport/verbs/gid_selection.hpp"
#include "transport/verbs/mlx5_binding.hpp"
#include "transport/verbs/mlx5_memory_key.hpp"
#include "transport/verbs/protection_domain.hpp"
#include "transport/verbs/queue_pair.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::transport {
namespace {

unsigned verbs_access(std::uint32_t access) {
    unsigned flags = 0;
    if ((access & kAccessLocalWrite) != 0) flags |= IBV_ACCESS_LOCAL_WRITE;
    if ((access & kAccessRemoteWrite) != 0) flags |= IBV_ACCESS_REMOTE_WRITE;
    if ((access & kAccessRemoteRead) != 0) flags |= IBV_ACCESS_REMOTE_READ;
    if ((access & kAccessRemoteAtomic) != 0) flags |= IBV_ACCESS_REMOTE_ATOMIC;
    return flags;
}

// What connect() needs to know about the local port, fixed when the QP is created.
struct LocalPort {
    std::uint8_t port = 1;
    bool ethernet = true;
    unsigned access = 0;
    // Soft-RoCE: its completer counts retry_cnt down only when it is not 7
    // (drivers/infiniband/sw/rxe/rxe_comp.c), so 7 retries without end there.
    bool endless_retries_at_seven = false;
    std::string device;  // for the log line
};

// The kernel's soft-RoCE reports this vendor id (RXE_VENDOR_ID in drivers/infiniband/sw/rxe).
constexpr std::uint32_t kSoftRoceVendorId = 0xffffff;

bool is_soft_roce(const verbs::Context& context) { return context.device_attributes().vendor_id == kSoftRoceVendorId; }

// The IB specification, and a ConnectX, give up after 7 retries; on soft-RoCE 7 would never
// give up, and a dead peer would hang its operations until the wait's deadline. 6 retries
// there (one try fewer) keep "a dead peer fails within the transport timeout". Said once.
std::uint8_t retry_count_for(const LocalPort& port, std::uint8_t requested) {
    if (requested != 7 || !port.endless_retries_at_seven) return requested;
    static std::once_flag said;
    std::call_once(said, [&] {
        detail::logger().info("verbs device {} is soft-RoCE (vendor id 0xffffff), whose completer retries without end at "
                              "retry_count 7: its queue pairs use 6 retries, so a dead peer fails within the transport timeout",
                              port.device);
    });
    return 6;
}

verbs::ConnectionParameters connection_parameters(const LocalPort& port, const ConnectSettings& settings) {
    verbs::ConnectionParameters parameters;
    parameters.port_num = port.port;
    parameters.path_mtu = settings.path_mtu;
    parameters.send_psn = settings.local_psn;
    // RoCE needs the GRH on every packet; on InfiniBand a GID is only needed across subnets,
    // which a LID of 0 from the peer implies.
    parameters.use_global_routing = port.ethernet || settings.remote_lid == 0;
    parameters.source_gid_index = settings.source_gid_index;
    parameters.access_flags = port.access;
    parameters.timeout = settings.ack_timeout;
    parameters.retry_count = retry_count_for(port, settings.retry_count);
    parameters.rnr_retry = settings.rnr_retry;
    parameters.min_rnr_timer = settings.min_rnr_timer;
    parameters.max_read_atomic = settings.max_rd_atomic;
    parameters.max_dest_read_atomic = settings.max_dest_rd_atomic;
    return parameters;
}

verbs::RcEndpoint remote_endpoint(const ConnectSettings& settings) {
    verbs::RcEndpoint remote;
    remote.qpn = settings.remote_qpn;
    remote.psn = settings.remote_psn;
    remote.lid = settings.remote_lid;
    remote.gid = settings.remote_gid;
    remote.mtu = settings.path_mtu;
    return remote;
}

// RTR and RTS (the QP was moved to INIT when it was created, so receives could be posted).
void connect_verbs_queue_pair(verbs::QueuePair& queue_pair, const LocalPort& port, const ConnectSettings& settings) {
    try {
        const verbs::ConnectionParameters parameters = connection_parameters(port, settings);
        queue_pair.modify(verbs::make_ready_to_receive_transition(parameters, remote_endpoint(settings)), "INIT->RTR");
        queue_pair.modify(verbs::make_ready_to_send_transition(parameters), "RTR->RTS");
    } catch (const verbs::VerbsError& error) {
        throw Error(error.what());
    }
}

void move_verbs_queue_pair_to_error(verbs::QueuePair& queue_pair) {
    verbs::QueuePairTransition transition;
    transition.attributes.qp_state = IBV_QPS_ERR;
    transition.mask = IBV_QP_STATE;
    try {
        queue_pair.modify(transition, "->ERR");
    } catch (const verbs::VerbsError& error) {
        throw Error(error.what());
    }
}

void move_to_init(verbs::QueuePair& queue_pair, const LocalPort& port) {
    verbs::ConnectionParameters parameters;
    parameters.port_num = port.port;
    parameters.access_flags = port.access;
    parameters.path_mtu = 1024;  // not used by INIT; the builder checks it
    queue_pair.modify(verbs::make_init_transition(parameters), "RESET->INIT");
}

// The generic verbs path's CQ; its events come from its completion channel, armed with
// ibv_req_notify_cq (verbs::CompletionQueue::arm).
class VerbsCompletionQueue final : public CompletionQueue {
public:
    explicit VerbsCompletionQueue(std::shared_ptr<verbs::CompletionQueue> queue) : queue_(std::move(queue)) {}
    std::uint32_t poll(mlx5::Completion* completions, std::uint32_t capacity) noexcept override {
        return queue_->poll(std::span<mlx5::Completion>(completions, capacity));
    }
    std::uint32_t depth() const noexcept override { return queue_->depth(); }
    int event_descriptor() const noexcept override { return queue_->event_descriptor(); }
    bool arm() noexcept override { return queue_->arm(); }
    void take_event() noexcept override { (void)queue_->take_event(); }
    const std::shared_ptr<verbs::CompletionQueue>& queue() const { return queue_; }

private:
    std::shared_ptr<verbs::CompletionQueue> queue_;
};

// A ConnectX CQ's events: its completion channel's descriptor. The arm is the data path's
// (arm doorbell record, then the CQ doorbell in the UAR page), a register write the NIC sees
// itself: nothing to tell it after. The CQ outlives this object (the ring CQ's owner holds it).
class Mlx5CompletionEvents final : public RingCompletionEvents {
public:
    explicit Mlx5CompletionEvents(std::shared_ptr<verbs::CompletionQueue> queue) : queue_(std::move(queue)) {}
    int descriptor() const noexcept override { return queue_->event_descriptor(); }
    void armed() noexcept override {}
    bool take() noexcept override { return queue_->take_event(); }

private:
    std::shared_ptr<verbs::CompletionQueue> queue_;
};

class VerbsQueuePair final : public QueuePair {
public:
    VerbsQueuePair(std::shared_ptr<verbs::QueuePair> queue_pair, LocalPort port)
        : queue_pair_(std::move(queue_pair)), port_(port) {}
    std::uint32_t qpn() const noexcept override { return queue_pair_->qpn(); }
    mlx5::PostResult post_send(const mlx5::SendWorkRequest* requests, std::uint32_t count,
                               std::uint32_t* posted) noexcept override {
        return queue_pair_->post_send(std::span<const mlx5::SendWorkRequest>(requests, count), posted);
    }
    mlx5::PostResult post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                  std::uint32_t* posted) noexcept override {
        return queue_pair_->post_receive(std::span<const mlx5::ReceiveWorkRequest>(requests, count), posted);
    }
    std::uint32_t max_send_wr() const noexcept override { return queue_pair_->capabilities().max_send_wr; }
    std::uint32_t max_recv_wr() const noexcept override { return queue_pair_->capabilities().max_recv_wr; }
    void connect(const ConnectSettings& settings) override { connect_verbs_queue_pair(*queue_pair_, port_, settings); }
    void move_to_error() override { move_verbs_queue_pair_to_error(*queue_pair_); }

private:
    std::shared_ptr<verbs::QueuePair> queue_pair_;
    LocalPort port_;
};

class Mlx5RingQueuePair final : public RingQueuePair {
public:
    Mlx5RingQueuePair(RingQueuePairInit init, std::shared_ptr<verbs::QueuePair> queue_pair, LocalPort port)
        : RingQueuePair(std::move(init)), queue_pair_(std::move(queue_pair)), port_(port) {}
    void connect(const ConnectSettings& settings) override { connect_verbs_queue_pair(*queue_pair_, port_, settings); }
    void move_to_error() override { move_verbs_queue_pair_to_error(*queue_pair_); }

private:
    std::shared_ptr<verbs::QueuePair> queue_pair_;
    LocalPort port_;
};


// Control-plane calls of the verbs layer report VerbsError; the interface promises rdmachan::Error.
template <typename Call>
auto guarded(Call call) -> decltype(call()) {
    try {
        return call();
    } catch (const verbs::VerbsError& error) {
        throw Error(error.what());
    }
}

class VerbsProtectionDomain final : public ProtectionDomain {
public:
    VerbsProtectionDomain(std::shared_ptr<verbs::ProtectionDomain> domain, bool direct)
        : domain_(std::move(domain)), direct_(direct) {
        if (direct_) parent_domain_ = verbs::Mlx5ParentDomain::try_allocate(domain_);
    }

    Registration register_memory(void* data, std::size_t length, std::uint32_t access) override {
        try {
            auto region = verbs::MemoryRegion::register_memory(domain_, data, length, verbs_access(access));
            Registration registration;
            registration.lkey = region->lkey();
            registration.rkey = region->rkey();
            registration.deregister = [region = region.get()] {
                try {
                    region->deregister();
                } catch (const verbs::VerbsError& error) {
                    throw Error(std::string("deregister_memory: ") + error.what());
                }
            };
            registration.owner = std::move(region);
            return registration;
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

    // mlx5dv_create_mkey on a ConnectX; the generic verbs path has no UMR and says so by name.
    IndirectKeyRegistration create_indirect_key(std::uint32_t max_entries) override {
        try {
            if (!direct_) verbs::throw_layouts_unavailable(domain_->context()->name());
            std::shared_ptr<verbs::Mlx5IndirectKey> key = verbs::Mlx5IndirectKey::create(domain_, max_entries);
            IndirectKeyRegistration registration;
            registration.lkey = key->lkey();
            registration.rkey = key->rkey();
            registration.max_entries = key->max_entries();
            registration.owner = std::move(key);
            return registration;
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

    std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth) override {
        try {
            if (direct_) return create_direct_completion_queue(depth, 0);
            return std::make_shared<VerbsCompletionQueue>(verbs::CompletionQueue::create(
                domain_->context(), depth, verbs::CompletionChannel::try_create(domain_->context())));
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

    // CQE compression: a ConnectX that has the format, through mlx5dv; the generic verbs path
    // reads completions through ibv_poll_cq and has no say in their format.
    std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth, CqeCompression compression) override {
        if (compression == CqeCompression::off) return create_completion_queue(depth);
        if (!direct_) {
            throw Error(std::string("cqe_compression = ") + to_string(compression) + ": device '" +
                        domain_->context()->name() + "' is driven through generic verbs, which cannot ask for it (an mlx5 "
                        "device on the direct data path can)");
        }
        try {
            return create_direct_completion_queue(depth, mlx5_compression_format(compression));
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

    std::shared_ptr<QueuePair> create_queue_pair(const QueuePairSettings& settings,
                                                 std::shared_ptr<CompletionQueue> send_queue,
                                                 std::shared_ptr<CompletionQueue> receive_queue) override {
        if (settings.scatter_to_cqe && !direct_) {
            throw Error("scatter_to_cqe: device '" + domain_->context()->name() +
                        "' is driven through generic verbs, which cannot ask for it (an mlx5 device on the direct data "
                        "path can)");
        }
        const verbs::QueuePairCapabilities capabilities{settings.max_send_wr, settings.max_recv_wr,
                                                        settings.max_send_sge, settings.max_recv_sge,
                                                        settings.max_inline_data};
        LocalPort port;
        port.port = settings.port;
        port.access = verbs_access(settings.access);
        port.device = domain_->context()->name();
        port.endless_retries_at_seven = is_soft_roce(*domain_->context());
        try {
            port.ethernet = domain_->context()->query_port(settings.port).link_layer == verbs::LinkLayer::ethernet;
            if (direct_) return create_direct(capabilities, port, settings.scatter_to_cqe, send_queue, receive_queue);
            auto send = std::dynamic_pointer_cast<VerbsCompletionQueue>(send_queue);
            auto receive = std::dynamic_pointer_cast<VerbsCompletionQueue>(receive_queue);
            if (send == nullptr || receive == nullptr) {
                throw Error("create_queue_pair on " + domain_->context()->name() +
                            ": completion queues come from another device");
            }
            verbs::QueuePairParents parents;
            parents.protection_domain = domain_;
            parents.send_completion_queue = send->queue();
            parents.receive_completion_queue = receive->queue();
            auto queue_pair = verbs::QueuePair::create_reliable_connected(std::move(parents), capabilities);
            move_to_init(*queue_pair, port);
            return std::make_shared<VerbsQueuePair>(std::move(queue_pair), port);
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

    // DC: only on a ConnectX driven through the direct data path.
    std::shared_ptr<QueuePair> create_dc_initiator(const QueuePairSettings& settings,
                                                   std::shared_ptr<CompletionQueue> send_queue) override {
        require_dc("create_dc_initiator");
        return guarded([&] { return mlx5_dc::create_initiator(domain_, parent_domain_, settings, ring_of(send_queue)); });
    }
    void recover_dc_initiator(QueuePair& initiator) override {
        require_dc("recover_dc_initiator");
        guarded([&] {
            mlx5_dc::recover_initiator(initiator);
            return 0;
        });
    }
    std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(std::uint32_t max_wr,
                                                                    std::shared_ptr<CompletionQueue>) override {
        require_dc("create_shared_receive_queue");
        return guarded([&] { return mlx5_dc::create_shared_receive_queue(domain_, max_wr); });
    }
    std::shared_ptr<DcTarget> create_dc_target(std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                               std::shared_ptr<CompletionQueue> receive_queue, std::uint64_t access_key,
                                               std::uint32_t access) override {
        require_dc("create_dc_target");
        return guarded([&] {
            return mlx5_dc::create_target(domain_, std::move(shared_receive_queue), ring_of(receive_queue), access_key,
                                          verbs_access(access));
        });
    }
    std::array<std::uint8_t, 48> dc_address_vector(const PortIdentity& local, const Gid& gid, std::uint16_t lid,
                                                   std::uint32_t dctn, std::uint64_t key) override {
        require_dc("dc_address_vector");
        return guarded([&] { return mlx5_dc::address_vector(domain_, local, gid, lid, dctn, key); });
    }

private:
    void require_dc(const char* call) const {
        if (!direct_) {
            throw Error(std::string(call) + ": DC (dynamically connected) mode needs an mlx5 device (ConnectX); '" +
                        domain_->context()->name() + "' is driven through the generic verbs path");
        }
    }
    std::shared_ptr<RingCompletionQueue> ring_of(const std::shared_ptr<CompletionQueue>& queue) const {
        auto ring = std::dynamic_pointer_cast<RingCompletionQueue>(queue);
        if (ring == nullptr) throw Error("DC on " + domain_->context()->name() + ": the CQ is another device's");
        return ring;
    }

    static std::uint8_t mlx5_compression_format(CqeCompression compression) {
        switch (compression) {
            case CqeCompression::off: return 0;
            case CqeCompression::hash: return MLX5DV_CQE_RES_FORMAT_HASH;
            case CqeCompression::checksum: return MLX5DV_CQE_RES_FORMAT_CSUM;
            case CqeCompression::checksum_stride_index: return MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX;
        }
        throw Error("cqe_compression: " + std::to_string(static_cast<int>(compression)) + " is no format");
    }

    std::shared_ptr<CompletionQueue> create_direct_completion_queue(std::uint32_t depth, std::uint8_t compression_format) {
        verbs::Mlx5CompletionQueue created =
            verbs::create_mlx5_completion_queue(domain_->context(), depth, compression_format);
        auto owner = std::make_shared<Mlx5CompletionQueueOwner>(Mlx5CompletionQueueOwner{created.completion_queue});
        // Events need the channel and the UAR page the arm rings; without either, none.
        std::unique_ptr<RingCompletionEvents> events;
        if (created.completion_queue->event_descriptor() >= 0 && created.ring.uar != nullptr)
            events = std::make_unique<Mlx5CompletionEvents>(created.completion_queue);
        return std::make_shared<RingCompletionQueue>(created.ring, std::move(owner), std::move(events));
    }

    std::shared_ptr<QueuePair> create_direct(const verbs::QueuePairCapabilities& capabilities, const LocalPort& port,
                                             bool scatter_to_cqe, const std::shared_ptr<CompletionQueue>& send_queue,
                                             const std::shared_ptr<CompletionQueue>& receive_queue) {
        auto send = std::dynamic_pointer_cast<RingCompletionQueue>(send_queue);
        auto receive = std::dynamic_pointer_cast<RingCompletionQueue>(receive_queue);
        if (send == nullptr || receive == nullptr) {
            throw Error("create_queue_pair on " + domain_->context()->name() + ": completion queues come from another device");
        }
        verbs::QueuePairParents parents;
        parents.protection_domain = domain_;
        parents.send_completion_queue = std::static_pointer_cast<Mlx5CompletionQueueOwner>(send->owner())->queue;
        parents.receive_completion_queue = std::static_pointer_cast<Mlx5CompletionQueueOwner>(receive->owner())->queue;
        verbs::Mlx5QueuePair created =
            verbs::create_mlx5_queue_pair(std::move(parents), capabilities, parent_domain_, scatter_to_cqe);
        move_to_init(*created.queue_pair, port);
        RingQueuePairInit ring;
        ring.send_ring = created.rings.send;
        ring.receive_ring = created.rings.receive;
        const verbs::QueuePairCapabilities& granted = created.queue_pair->capabilities();
        ring.max_send_wr = granted.max_send_wr;
        ring.max_recv_wr = granted.max_recv_wr;
        ring.max_send_sge = granted.max_send_sge;
        ring.max_inline_data = granted.max_inline_data;
        ring.scatter_to_cqe = scatter_to_cqe;
        ring.send_queue = std::move(send);
        ring.receive_queue = std::move(receive);
        return std::make_shared<Mlx5RingQueuePair>(std::move(ring), std::move(created.queue_pair), port);
    }

    std::shared_ptr<verbs::ProtectionDomain> domain_;
    bool direct_;
    std::shared_ptr<verbs::Mlx5ParentDomain> parent_domain_;
};

class VerbsDevice final : public Device {
public:
    VerbsDevice(std::shared_ptr<verbs::Context> context, bool direct) : context_(std::move(context)), direct_(direct) {}
    DeviceKind kind() const noexcept override { return direct_ ? DeviceKind::mlx5 : DeviceKind::verbs; }
    std::string name() const override { return context_->name(); }

    PortIdentity port_identity(std::uint8_t port, std::optional<std::uint8_t> gid_index) const override {
        try {
            if (port == 0 || port > context_->port_count()) {
                throw Error(fmt::format("port {} does not exist on {} (ports 1..{})", port, name(), context_->port_count()));
            }
            const verbs::PortAttributes attributes = context_->query_port(port);
            if (!attributes.active) throw Error(fmt::format("port {} of {} is not active", port, name()));
            const std::optional<std::uint32_t> override_index =
                gid_index.has_value() ? std::optional<std::uint32_t>(*gid_index) : std::nullopt;
            const verbs::GidChoice choice = verbs::select_gid(attributes.gid_table, attributes.link_layer, override_index);
            PortIdentity identity;
            identity.gid = choice.entry.gid;
            identity.lid = attributes.lid;
            identity.active_mtu = attributes.active_mtu;
            identity.port = port;
            identity.gid_index = static_cast<std::uint8_t>(choice.entry.index);
            identity.ethernet = attributes.link_layer == verbs::LinkLayer::ethernet;
            return identity;
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

    std::shared_ptr<ProtectionDomain> allocate_protection_domain() override {
        try {
            return std::make_shared<VerbsProtectionDomain>(verbs::ProtectionDomain::allocate(context_), direct_);
        } catch (const verbs::VerbsError& error) {
            throw Error(error.what());
        }
    }

private:
    std::shared_ptr<verbs::Context> context_;
    bool direct_;
};

}  // namespace

std::shared_ptr<Device> open_verbs_device(std::string_view name, bool direct) {
    try {
        return std::make_shared<VerbsDevice>(verbs::Context::open(name), direct);
    } catch (const verbs::VerbsError& error) {
        throw Error(error.what());
    }
}

}  // namespace rdmachan::transport
