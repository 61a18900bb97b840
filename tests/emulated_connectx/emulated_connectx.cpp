// The emulated ConnectX: libibverbs' and libmlx5's entry points that rdmachan calls, served by
// the software mlx5 device (transport/soft). Preloaded (LD_PRELOAD) in front of the system's
// libibverbs/libmlx5, it shows one device, "mlx5_0", with an ACTIVE InfiniBand port, so that
// RDMACHAN_DEVICE=auto selects the mlx5 direct data path and the project's mlx5 binding
// (transport/verbs/mlx5_binding.cpp, mlx5_dc.cpp) and DC provider run unchanged.
//
// mlx5dv_init_obj hands out the software device's own rings, doorbell records, BlueFlame
// buffers and CQ doorbell registers (cq_uar). The device learns of doorbells as a NIC does,
// without being told: a thread per context polls every send doorbell record and the CQ doorbell
// register of every CQ with a completion channel, and wakes the device when one was written
// (plain memory cannot trap the data path's store). A completion channel is an epoll set over
// its CQs' eventfds (the software device's completion channel). Before touching the device,
// every call applies the rules the kernel and libmlx5 apply (qp_state_rules.hpp for
// ibv_modify_qp; creation and capability checks below) and fails with the errno they return.
//
// Not emulated: the generic verbs data path (ibv_post_send/recv, ibv_poll_cq, ibv_req_notify_cq
// through the context's ops return EOPNOTSUPP / an error), memory windows.
#include <fcntl.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <new>
#include <thread>
#include <vector>

#include "tests/emulated_connectx/emulated_connectx.hpp"
#include "tests/emulated_connectx/qp_state_rules.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/completion_ring.hpp"
#include "transport/soft/device.hpp"

#undef ibv_query_port
#undef ibv_reg_mr

namespace emulated = rdmachan::emulated;
namespace soft = rdmachan::soft;

namespace {

// The limits ibv_query_device reports: the software device's own (transport/soft/object_creation.hpp).
constexpr std::uint32_t kMaxQueuePairWorkRequests = 32768;
constexpr std::uint32_t kMaxScatterGather = 30;
constexpr std::uint32_t kMaxInlineData = 912;
constexpr std::uint32_t kMaxCompletionQueueEntries = 4194303;
constexpr std::uint32_t kMaxSharedReceiveWorkRequests = 32767;
constexpr std::uint64_t kSupportedDciSendOperations =
    IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
    IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

// Every refusal is also printed, so a test log shows why a call failed.
void report(const std::string& message) { std::fprintf(stderr, "emulated ConnectX: %s\n", message.c_str()); }

template <typename T>
T* refuse_pointer(int error, const std::string& message) {
    report(message);
    errno = error;
    return nullptr;
}

int refuse(int error, const std::string& message) {
    report(message);
    return error;
}

ibv_device& the_device() {
    static ibv_device device = [] {
        ibv_device value{};
        value.node_type = IBV_NODE_CA;
        value.transport_type = IBV_TRANSPORT_IB;
        std::snprintf(value.name, sizeof(value.name), "mlx5_0");
        std::snprintf(value.dev_name, sizeof(value.dev_name), "uverbs0");
        std::snprintf(value.dev_path, sizeof(value.dev_path), "/emulated/uverbs0");
        std::snprintf(value.ibdev_path, sizeof(value.ibdev_path), "/emulated/mlx5_0");
        return value;
    }();
    return device;
}

struct Context;

// One send queue the doorbell poller watches.
struct WatchedQueue {
    const void* owner;
    std::uint32_t* doorbell_record;  // the send word
    std::uint32_t last_seen;
    std::function<void()> ring;
};

// The CQ doorbell register (ring().uar + 0x20) of a CQ with a completion channel. What a
// register write carries (arm word << 32 | CQN) can repeat: an arm with the same sequence
// number, command and consumer index writes the same value again, and the NIC sees that write
// too. So the poller does not compare values: it takes the register, exchanging it for a value
// no write can hold (a CQN has 24 bits), as the NIC consumes each write. Every arm whose write
// came before the exchange is served by the ring_arm_doorbell() after it (which reads the
// newest arm word from the doorbell record, stored before the register); every later write
// leaves the register set for the next look.
inline constexpr std::uint64_t kCqDoorbellTaken = ~0ull;
std::atomic<std::uint64_t> arm_doorbells_seen{0};
std::atomic<std::uint64_t> arm_doorbells_with_completion_waiting{0};
struct WatchedArm {
    const void* owner;
    std::uint64_t* cq_doorbell;
    std::shared_ptr<soft::CompletionQueue> queue;
};

struct Context {
    verbs_context verbs{};  // must stay first: ibv_context is its last member
    std::shared_ptr<soft::Device> device;
    std::mutex mutex;  // control plane only: the watched lists
    std::vector<WatchedQueue> watched;
    std::vector<WatchedArm> watched_arms;
    std::atomic<bool> stopping{false};
    std::thread poller;
    std::uint32_t next_user_index = 1;

    void watch(const void* owner, std::uint32_t* doorbell_record, std::function<void()> ring) {
        std::lock_guard<std::mutex> lock(mutex);
        watched.push_back({owner, doorbell_record, __atomic_load_n(doorbell_record, __ATOMIC_ACQUIRE), std::move(ring)});
    }
    void unwatch(const void* owner) {
        std::lock_guard<std::mutex> lock(mutex);
        watched.erase(std::remove_if(watched.begin(), watched.end(), [&](const WatchedQueue& queue) { return queue.owner == owner; }),
                      watched.end());
        watched_arms.erase(std::remove_if(watched_arms.begin(), watched_arms.end(), [&](const WatchedArm& arm) { return arm.owner == owner; }),
                           watched_arms.end());
    }
    void watch_arms(const void* owner, std::shared_ptr<soft::CompletionQueue> queue) {
        auto* cq_doorbell = reinterpret_cast<std::uint64_t*>(queue->ring().uar + rdmachan::mlx5::kCqDoorbellOffset);
        std::lock_guard<std::mutex> lock(mutex);
        __atomic_store_n(cq_doorbell, kCqDoorbellTaken, __ATOMIC_RELEASE);
        watched_arms.push_back({owner, cq_doorbell, std::move(queue)});
    }
    static void count_arm(const rdmachan::mlx5::CompletionQueueRing& ring) {
        const std::uint32_t word = rdmachan::mlx5::big_to_host32(__atomic_load_n(ring.doorbell_record + rdmachan::mlx5::kCqArm, __ATOMIC_ACQUIRE));
        const std::uint32_t produced = __atomic_load_n(ring.doorbell_record + soft::kCqProducerIndexWord, __ATOMIC_ACQUIRE);
        arm_doorbells_seen.fetch_add(1, std::memory_order_relaxed);
        if (((produced - word) & rdmachan::mlx5::kCqConsumerIndexMask) != 0)
            arm_doorbells_with_completion_waiting.fetch_add(1, std::memory_order_relaxed);
    }
    // The NIC's view of the send doorbell records (a changed value is a doorbell) and of the CQ
    // doorbell registers (every write is an arm, WatchedArm).
    void poll_doorbells() {
        while (!stopping.load(std::memory_order_acquire)) {
            {
                std::lock_guard<std::mutex> lock(mutex);
                for (WatchedQueue& queue : watched) {
                    const std::uint32_t value = __atomic_load_n(queue.doorbell_record, __ATOMIC_ACQUIRE);
                    if (value != queue.last_seen) {
                        queue.last_seen = value;
                        queue.ring();
                    }
                }
                for (WatchedArm& arm : watched_arms) {
                    if (__atomic_exchange_n(arm.cq_doorbell, kCqDoorbellTaken, __ATOMIC_ACQ_REL) != kCqDoorbellTaken) {
                        count_arm(arm.queue->ring());
                        arm.queue->ring_arm_doorbell();
                    }
                }
            }
            std::this_thread::sleep_for(std::chrono::microseconds(20));
        }
    }
};

Context* context_of(ibv_context* context) {
    return reinterpret_cast<Context*>(reinterpret_cast<char*>(context) - offsetof(verbs_context, context));
}

struct ProtectionDomain {
    ibv_pd pd{};  // first
    std::shared_ptr<soft::ProtectionDomain> domain;
    bool parent = false;
};
ProtectionDomain* domain_of(ibv_pd* pd) { return reinterpret_cast<ProtectionDomain*>(pd); }

struct ThreadDomain {
    ibv_td td{};
};

struct MemoryRegion {
    ibv_mr mr{};
    std::shared_ptr<soft::MemoryRegion> region;
};

// An indirect memory key (mlx5dv_create_mkey), configured by UMR WQEs the software device executes.
struct IndirectKey {
    mlx5dv_mkey mkey{};  // first
    std::shared_ptr<soft::IndirectKey> key;
};

// A completion channel: an epoll set over the eventfds of its CQs (the software device's
// completion channel, soft::CompletionQueue::event_descriptor), so its descriptor is readable
// when one of them raised an event. refcnt counts its CQs, as libibverbs does.
struct CompletionChannel {
    ibv_comp_channel channel{};  // first
    std::mutex mutex;            // refcnt
};
CompletionChannel* channel_of(ibv_comp_channel* channel) { return reinterpret_cast<CompletionChannel*>(channel); }

struct CompletionQueue {
    ibv_cq_ex cq{};  // first: ibv_cq_ex_to_cq casts, and ibv_cq is its prefix
    std::shared_ptr<soft::CompletionQueue> queue;
    // Completion events handed out by ibv_get_cq_event and acknowledged by ibv_ack_cq_events:
    // ibv_destroy_cq waits until they are equal, as libibverbs waits for the count the kernel
    // reports (the kernel counts an event when it is read; one queued unread is dropped).
    std::mutex events_mutex;
    std::condition_variable events_acknowledged;
    std::uint64_t events_read = 0;
    std::uint64_t events_completed = 0;
};
CompletionQueue* queue_of(ibv_cq* cq) { return reinterpret_cast<CompletionQueue*>(cq); }

struct SharedReceiveQueue {
    ibv_srq srq{};
    std::shared_ptr<soft::SharedReceiveQueue> queue;
};
SharedReceiveQueue* shared_of(ibv_srq* srq) { return reinterpret_cast<SharedReceiveQueue*>(srq); }

struct AddressHandle {
    ibv_ah ah{};
    mlx5_wqe_av vector{};
};

struct QueuePair {
    ibv_qp qp{};  // first
    emulated::QueuePairKind kind = emulated::QueuePairKind::reliable_connected;
    ibv_qp_state state = IBV_QPS_RESET;
    ibv_qp_cap granted{};
    std::uint32_t user_index = 0;
    std::shared_ptr<soft::QueuePair> reliable;
    std::shared_ptr<soft::DcInitiator> initiator;
    std::shared_ptr<soft::DcTarget> target;
    // DCT: the software device creates the target when its access flags are known (INIT).
    std::shared_ptr<soft::ProtectionDomain> domain;
    soft::DcTargetInit target_init;
};
QueuePair* pair_of(ibv_qp* qp) { return reinterpret_cast<QueuePair*>(qp); }

// The generic verbs data path is not emulated: the project drives the rings directly.
int unsupported_post_send(ibv_qp*, ibv_send_wr*, ibv_send_wr** bad) {
    if (bad != nullptr) *bad = nullptr;
    return refuse(EOPNOTSUPP, "ibv_post_send: the generic verbs data path is not emulated (use the mlx5 rings)");
}
int unsupported_post_recv(ibv_qp*, ibv_recv_wr*, ibv_recv_wr** bad) {
    if (bad != nullptr) *bad = nullptr;
    return refuse(EOPNOTSUPP, "ibv_post_recv: the generic verbs data path is not emulated (use the mlx5 rings)");
}
int unsupported_post_srq_recv(ibv_srq*, ibv_recv_wr*, ibv_recv_wr** bad) {
    if (bad != nullptr) *bad = nullptr;
    return refuse(EOPNOTSUPP, "ibv_post_srq_recv: the generic verbs data path is not emulated (use the mlx5 rings)");
}
int unsupported_poll_cq(ibv_cq*, int, ibv_wc*) {
    report("ibv_poll_cq: the generic verbs data path is not emulated (poll the mlx5 CQ ring)");
    return -1;
}

// libmlx5's arm would carry libmlx5's consumer index, which a direct poller never advances: the
// project arms through the ring (mlx5::CompletionQueue::arm), and so must anything run here.
int unsupported_req_notify_cq(ibv_cq*, int) {
    return refuse(EOPNOTSUPP, "ibv_req_notify_cq: not emulated (arm through the mlx5 CQ ring: arm word, then the CQ doorbell on cq_uar)");
}

int query_port_op(ibv_context* context, std::uint8_t port, ibv_port_attr* attributes, size_t) {
    if (port != 1) return refuse(EINVAL, fmt::format("ibv_query_port: port {} does not exist (port 1 only)", port));
    std::memset(attributes, 0, sizeof(*attributes));
    attributes->state = IBV_PORT_ACTIVE;
    attributes->max_mtu = IBV_MTU_4096;
    attributes->active_mtu = IBV_MTU_4096;
    attributes->gid_tbl_len = 1;
    attributes->port_cap_flags = 0;
    attributes->max_msg_sz = 1u << 30;
    attributes->pkey_tbl_len = 1;
    // The LID is the software device's TCP port: within the subnet (this host) it names the device.
    attributes->lid = context_of(context)->device->lid();
    attributes->sm_lid = 1;
    attributes->lmc = 0;
    attributes->max_vl_num = 1;
    attributes->active_width = 2;   // 4X
    attributes->active_speed = 32;  // EDR
    attributes->phys_state = 5;     // LinkUp
    attributes->link_layer = IBV_LINK_LAYER_INFINIBAND;
    return 0;
}

// RDMACHAN_EMULATED_CONNECTX_REFUSE=alloc_td,alloc_parent_domain: behave like a provider without
// thread or parent domains (older libmlx5), which answers EOPNOTSUPP, so that the binding's
// fallback to shared BlueFlame registers runs too.
bool refused_by_request(const char* call) {
    const char* list = std::getenv("RDMACHAN_EMULATED_CONNECTX_REFUSE");
    if (list == nullptr) return false;
    const std::string names = std::string(",") + list + ",";
    return names.find(std::string(",") + call + ",") != std::string::npos;
}

ibv_td* alloc_td_op(ibv_context* context, ibv_td_init_attr* attributes) {
    if (refused_by_request("alloc_td")) return refuse_pointer<ibv_td>(EOPNOTSUPP, "ibv_alloc_td: refused on request (RDMACHAN_EMULATED_CONNECTX_REFUSE)");
    if (attributes != nullptr && attributes->comp_mask != 0) {
        return refuse_pointer<ibv_td>(EINVAL, fmt::format("ibv_alloc_td: comp_mask {:#x} is not supported", attributes->comp_mask));
    }
    auto* domain = new ThreadDomain();
    domain->td.context = context;
    return &domain->td;
}

int dealloc_td_op(ibv_td* td) {
    delete reinterpret_cast<ThreadDomain*>(td);
    return 0;
}

ibv_pd* alloc_parent_domain_op(ibv_context* context, ibv_parent_domain_init_attr* attributes) {
    if (refused_by_request("alloc_parent_domain"))
        return refuse_pointer<ibv_pd>(EOPNOTSUPP, "ibv_alloc_parent_domain: refused on request (RDMACHAN_EMULATED_CONNECTX_REFUSE)");
    if (attributes == nullptr || attributes->pd == nullptr) {
        return refuse_pointer<ibv_pd>(EINVAL, "ibv_alloc_parent_domain: attr.pd is required");
    }
    if (attributes->comp_mask != 0) {
        return refuse_pointer<ibv_pd>(EINVAL, fmt::format("ibv_alloc_parent_domain: comp_mask {:#x} (custom allocators) is not supported",
                                                          attributes->comp_mask));
    }
    auto* parent = new ProtectionDomain();
    parent->pd.context = context;
    parent->pd.handle = attributes->pd->handle;
    parent->domain = domain_of(attributes->pd)->domain;
    parent->parent = true;
    return &parent->pd;
}

void create_qp_fill(QueuePair& pair, ibv_context* context, ibv_qp_init_attr_ex* attributes, std::uint32_t qpn) {
    pair.qp.context = context;
    pair.qp.qp_context = attributes->qp_context;
    pair.qp.pd = attributes->pd;
    pair.qp.send_cq = attributes->send_cq;
    pair.qp.recv_cq = attributes->recv_cq;
    pair.qp.srq = attributes->srq;
    pair.qp.qp_num = qpn;
    pair.qp.handle = qpn;
    pair.qp.state = IBV_QPS_RESET;
    pair.qp.qp_type = attributes->qp_type;
}

// Capability limits as ibv_query_device reports them; libmlx5 and the kernel refuse more.
int check_capabilities(const char* call, const ibv_qp_cap& cap, bool has_receive_queue) {
    if (cap.max_send_wr == 0 || cap.max_send_wr > kMaxQueuePairWorkRequests)
        return refuse(EINVAL, fmt::format("{}: max_send_wr {} outside 1..{} (max_qp_wr)", call, cap.max_send_wr, kMaxQueuePairWorkRequests));
    if (cap.max_send_sge > kMaxScatterGather)
        return refuse(EINVAL, fmt::format("{}: max_send_sge {} above max_sge {}", call, cap.max_send_sge, kMaxScatterGather));
    if (cap.max_inline_data > kMaxInlineData)
        return refuse(EINVAL, fmt::format("{}: max_inline_data {} above {}", call, cap.max_inline_data, kMaxInlineData));
    if (has_receive_queue) {
        if (cap.max_recv_wr > kMaxQueuePairWorkRequests)
            return refuse(EINVAL, fmt::format("{}: max_recv_wr {} above max_qp_wr {}", call, cap.max_recv_wr, kMaxQueuePairWorkRequests));
        if (cap.max_recv_sge > kMaxScatterGather)
            return refuse(EINVAL, fmt::format("{}: max_recv_sge {} above max_sge {}", call, cap.max_recv_sge, kMaxScatterGather));
    }
    return 0;
}

soft::QueuePairCapabilities soft_capabilities(const ibv_qp_cap& cap) {
    soft::QueuePairCapabilities capabilities;
    capabilities.max_send_wr = cap.max_send_wr;
    capabilities.max_recv_wr = std::max<std::uint32_t>(cap.max_recv_wr, 1);
    capabilities.max_send_sge = std::max<std::uint32_t>(cap.max_send_sge, 1);
    capabilities.max_recv_sge = std::max<std::uint32_t>(cap.max_recv_sge, 1);
    capabilities.max_inline_data = cap.max_inline_data;
    return capabilities;
}

ibv_qp* create_reliable_connected(Context& context, ibv_context* verbs_context, ibv_qp_init_attr_ex* attributes) {
    const char* call = "mlx5dv_create_qp(RC)";
    if (attributes->send_cq == nullptr || attributes->recv_cq == nullptr)
        return refuse_pointer<ibv_qp>(EINVAL, fmt::format("{}: send_cq and recv_cq are required", call));
    const bool has_receive_queue = attributes->srq == nullptr;
    if (const int error = check_capabilities(call, attributes->cap, has_receive_queue)) {
        errno = error;
        return nullptr;
    }
    auto pair = std::make_unique<QueuePair>();
    pair->kind = emulated::QueuePairKind::reliable_connected;
    pair->user_index = context.next_user_index++;
    soft::QueuePairInit init;
    init.send_cq = queue_of(attributes->send_cq)->queue;
    init.recv_cq = queue_of(attributes->recv_cq)->queue;
    if (!has_receive_queue) init.srq = shared_of(attributes->srq)->queue;
    init.capabilities = soft_capabilities(attributes->cap);
    init.user_index = pair->user_index;
    pair->reliable = context.device->create_queue_pair(domain_of(attributes->pd)->domain, init);
    attributes->cap.max_send_sge = pair->reliable->max_send_sge();
    attributes->cap.max_inline_data = pair->reliable->max_inline_data();
    if (!has_receive_queue) {
        attributes->cap.max_recv_wr = 0;
        attributes->cap.max_recv_sge = 0;
    }
    pair->granted = attributes->cap;
    create_qp_fill(*pair, verbs_context, attributes, pair->reliable->qpn());
    std::shared_ptr<soft::QueuePair> queue_pair = pair->reliable;
    context.watch(pair.get(), queue_pair->send_ring().doorbell_record + rdmachan::mlx5::kSendDoorbell,
                  [queue_pair] { queue_pair->ring_send_doorbell(); });
    return &pair.release()->qp;
}

ibv_qp* create_dc_initiator(Context& context, ibv_context* verbs_context, ibv_qp_init_attr_ex* attributes) {
    const char* call = "mlx5dv_create_qp(DCI)";
    if (attributes->send_cq == nullptr) return refuse_pointer<ibv_qp>(EINVAL, fmt::format("{}: send_cq is required", call));
    if (attributes->srq != nullptr || attributes->cap.max_recv_wr != 0) {
        return refuse_pointer<ibv_qp>(EINVAL, fmt::format("{}: a DCI has no receive queue (srq {}, max_recv_wr {})", call,
                                                          attributes->srq != nullptr ? "given" : "none", attributes->cap.max_recv_wr));
    }
    if ((attributes->comp_mask & IBV_QP_INIT_ATTR_SEND_OPS_FLAGS) != 0 &&
        (attributes->send_ops_flags & ~kSupportedDciSendOperations) != 0) {
        return refuse_pointer<ibv_qp>(EOPNOTSUPP, fmt::format("{}: send_ops_flags {:#x} include operations a DCI does not support",
                                                              call, attributes->send_ops_flags));
    }
    if (const int error = check_capabilities(call, attributes->cap, false)) {
        errno = error;
        return nullptr;
    }
    auto pair = std::make_unique<QueuePair>();
    pair->kind = emulated::QueuePairKind::dc_initiator;
    pair->user_index = context.next_user_index++;
    soft::DcInitiatorInit init;
    init.send_cq = queue_of(attributes->send_cq)->queue;
    init.capabilities = soft_capabilities(attributes->cap);
    init.user_index = pair->user_index;
    pair->initiator = context.device->create_dc_initiator(domain_of(attributes->pd)->domain, init);
    attributes->cap.max_send_sge = pair->initiator->max_send_sge();
    attributes->cap.max_inline_data = pair->initiator->max_inline_data();
    pair->granted = attributes->cap;
    create_qp_fill(*pair, verbs_context, attributes, pair->initiator->qpn());
    std::shared_ptr<soft::DcInitiator> initiator = pair->initiator;
    context.watch(pair.get(), initiator->send_ring().doorbell_record + rdmachan::mlx5::kSendDoorbell,
                  [initiator] { initiator->ring_send_doorbell(); });
    return &pair.release()->qp;
}

ibv_qp* create_dc_target(Context& context, ibv_context* verbs_context, ibv_qp_init_attr_ex* attributes,
                         std::uint64_t access_key) {
    const char* call = "mlx5dv_create_qp(DCT)";
    if (attributes->srq == nullptr) return refuse_pointer<ibv_qp>(EINVAL, fmt::format("{}: a DCT receives through an SRQ: srq is required", call));
    if (attributes->recv_cq == nullptr) return refuse_pointer<ibv_qp>(EINVAL, fmt::format("{}: recv_cq is required", call));
    auto pair = std::make_unique<QueuePair>();
    pair->kind = emulated::QueuePairKind::dc_target;
    pair->user_index = context.next_user_index++;
    pair->domain = domain_of(attributes->pd)->domain;
    pair->target_init.srq = shared_of(attributes->srq)->queue;
    pair->target_init.recv_cq = queue_of(attributes->recv_cq)->queue;
    if (attributes->send_cq != nullptr) pair->target_init.send_cq = queue_of(attributes->send_cq)->queue;
    pair->target_init.dc_access_key = access_key;
    pair->target_init.user_index = pair->user_index;
    // libmlx5 gives a DCT a placeholder number until RTR, when the firmware assigns the DCT number.
    create_qp_fill(*pair, verbs_context, attributes, 0xffffff & (0x800000u | pair->user_index));
    return &pair.release()->qp;
}

std::uint32_t mtu_bytes(ibv_mtu mtu) { return 128u << static_cast<unsigned>(mtu); }

soft::RemoteQueuePair remote_of(Context& context, const ibv_ah_attr& address, std::uint32_t qpn) {
    soft::RemoteQueuePair remote;
    remote.lid = address.dlid;
    remote.qpn = qpn;
    // Without a GRH the packet stays in the subnet: this host, where every emulated device listens.
    if (address.is_global != 0)
        std::memcpy(remote.gid.data(), address.grh.dgid.raw, 16);
    else
        remote.gid = context.device->gid();
    return remote;
}

soft::ReadyToSendAttributes ready_to_send_of(const ibv_qp_attr& attributes) {
    soft::ReadyToSendAttributes ready;
    ready.sq_psn = attributes.sq_psn;
    ready.timeout = attributes.timeout;
    ready.retry_cnt = attributes.retry_cnt;
    ready.rnr_retry = attributes.rnr_retry;
    ready.max_rd_atomic = attributes.max_rd_atomic;
    return ready;
}

// `next` as the kernel derived it (check_modify): attributes.qp_state only when IBV_QP_STATE is in
// the mask.
int apply_transition(QueuePair& pair, Context& context, const ibv_qp_attr& attributes, int mask, ibv_qp_state next) {
    const std::uint8_t port = (mask & IBV_QP_PORT) != 0 ? attributes.port_num : 1;
    if ((mask & IBV_QP_PORT) != 0 && attributes.port_num != 1)
        return refuse(EINVAL, fmt::format("ibv_modify_qp(QP {:#x}): port_num {} does not exist (port 1 only)", pair.qp.qp_num, attributes.port_num));
    if ((mask & IBV_QP_PATH_MTU) != 0 && (attributes.path_mtu < IBV_MTU_256 || attributes.path_mtu > IBV_MTU_4096))
        return refuse(EINVAL, fmt::format("ibv_modify_qp(QP {:#x}): path_mtu {} is not an IB MTU", pair.qp.qp_num, static_cast<int>(attributes.path_mtu)));
    if ((mask & IBV_QP_PKEY_INDEX) != 0 && attributes.pkey_index != 0)
        return refuse(EINVAL, fmt::format("ibv_modify_qp(QP {:#x}): pkey_index {} outside the 1-entry P_Key table", pair.qp.qp_num, attributes.pkey_index));
    switch (pair.kind) {
        case emulated::QueuePairKind::reliable_connected: {
            soft::QueuePair& queue_pair = *pair.reliable;
            if (next == IBV_QPS_INIT && pair.state == IBV_QPS_RESET) queue_pair.modify_to_init(port, attributes.qp_access_flags);
            else if (next == IBV_QPS_RTR) {
                soft::ReadyToReceiveAttributes ready;
                ready.remote = remote_of(context, attributes.ah_attr, attributes.dest_qp_num);
                ready.rq_psn = attributes.rq_psn;
                ready.path_mtu_bytes = mtu_bytes(attributes.path_mtu);
                ready.max_dest_rd_atomic = attributes.max_dest_rd_atomic;
                ready.min_rnr_timer = attributes.min_rnr_timer;
                queue_pair.modify_to_ready_to_receive(ready);
            } else if (next == IBV_QPS_RTS && pair.state == IBV_QPS_RTR) {
                queue_pair.modify_to_ready_to_send(ready_to_send_of(attributes));
            } else if (next == IBV_QPS_ERR) queue_pair.modify_to_error();
            else if (next == IBV_QPS_RESET) queue_pair.modify_to_reset();
            else if (next != pair.state)
                return refuse(EOPNOTSUPP, fmt::format("ibv_modify_qp(QP {:#x}): {} -> {} is valid but not emulated",
                                                      pair.qp.qp_num, emulated::state_name(pair.state), emulated::state_name(next)));
            return 0;
        }
        case emulated::QueuePairKind::dc_initiator: {
            soft::DcInitiator& initiator = *pair.initiator;
            if (next == IBV_QPS_INIT && pair.state == IBV_QPS_RESET) initiator.modify_to_init(port, 0);
            else if (next == IBV_QPS_RTR) initiator.modify_to_ready_to_receive(mtu_bytes(attributes.path_mtu));
            else if (next == IBV_QPS_RTS && pair.state == IBV_QPS_RTR) {
                initiator.modify_to_ready_to_send(ready_to_send_of(attributes));
            } else if (next == IBV_QPS_ERR) initiator.modify_to_error();
            else if (next == IBV_QPS_RESET) initiator.modify_to_reset();
            else if (next != pair.state)
                return refuse(EOPNOTSUPP, fmt::format("ibv_modify_qp(DCI {:#x}): {} -> {} is valid but not emulated",
                                                      pair.qp.qp_num, emulated::state_name(pair.state), emulated::state_name(next)));
            return 0;
        }
        case emulated::QueuePairKind::dc_target: {
            if (next == IBV_QPS_INIT) {
                pair.target_init.access_flags = attributes.qp_access_flags;
                pair.target = context.device->create_dc_target(pair.domain, pair.target_init);
                pair.target->modify_to_init(port);
            } else {
                soft::DcTargetReadyAttributes ready;
                ready.path_mtu_bytes = mtu_bytes(attributes.path_mtu);
                ready.min_rnr_timer = attributes.min_rnr_timer;
                pair.target->modify_to_ready_to_receive(ready);
                // As libmlx5 does at RTR: qp_num becomes the DCT number the firmware assigned.
                pair.qp.qp_num = pair.target->dctn();
            }
            return 0;
        }
    }
    return EINVAL;
}

void fill_address_vector(Context& context, const ibv_ah_attr& attributes, mlx5_wqe_av& vector) {
    // The software device's own form (soft::Device::address_vector), pointed at the peer: rlid
    // is its LID; with a GRH, rgid is its GID; without, the peer is on this host.
    const std::array<std::uint8_t, 48> base = context.device->address_vector();
    auto* bytes = reinterpret_cast<std::uint8_t*>(&vector);
    std::memcpy(bytes, base.data(), base.size());
    bytes[rdmachan::mlx5::kAvRlid] = static_cast<std::uint8_t>(attributes.dlid >> 8);
    bytes[rdmachan::mlx5::kAvRlid + 1] = static_cast<std::uint8_t>(attributes.dlid);
    if (attributes.is_global != 0) {
        std::memcpy(bytes + rdmachan::mlx5::kAvRgid, attributes.grh.dgid.raw, 16);
        bytes[rdmachan::mlx5::kAvHopLimit] = attributes.grh.hop_limit;
    } else {
        // No GRH: clear the GRH-present bit; the device then addresses its own host.
        bytes[rdmachan::mlx5::kAvGrhGidFl] &= static_cast<std::uint8_t>(~0x40u);
    }
}

template <typename Call>
auto guarded(const char* name, Call&& call, decltype(call()) failed) -> decltype(call()) {
    try {
        return call();
    } catch (const soft::SoftDeviceError& error) {
        report(fmt::format("{}: refused by the software device: {}", name, error.what()));
        errno = EINVAL;
    } catch (const std::bad_alloc&) {
        report(fmt::format("{}: out of memory", name));
        errno = ENOMEM;
    } catch (const std::exception& error) {
        report(fmt::format("{}: {}", name, error.what()));
        errno = EINVAL;
    }
    return failed;
}

}  // namespace

namespace rdmachan::emulated {
const char* device_name() noexcept { return "mlx5_0"; }
ArmDoorbellCounts arm_doorbell_counts() noexcept {
    return {arm_doorbells_seen.load(std::memory_order_relaxed), arm_doorbells_with_completion_waiting.load(std::memory_order_relaxed)};
}
}  // namespace rdmachan::emulated

extern "C" {

ibv_device** ibv_get_device_list(int* count) {
    auto** list = static_cast<ibv_device**>(std::calloc(2, sizeof(ibv_device*)));
    if (list == nullptr) {
        errno = ENOMEM;
        return nullptr;
    }
    list[0] = &the_device();
    if (count != nullptr) *count = 1;
    return list;
}

void ibv_free_device_list(ibv_device** list) { std::free(list); }

const char* ibv_get_device_name(ibv_device* device) { return device != nullptr ? device->name : nullptr; }

bool mlx5dv_is_supported(ibv_device* device) { return device == &the_device(); }

ibv_context* ibv_open_device(ibv_device* device) {
    if (device != &the_device()) return refuse_pointer<ibv_context>(ENODEV, "ibv_open_device: not the emulated device");
    return guarded("ibv_open_device", [&]() -> ibv_context* {
        auto* context = new Context();
        context->device = soft::Device::open();
        verbs_context& verbs = context->verbs;
        verbs.sz = sizeof(verbs_context);
        verbs.query_port = query_port_op;
        verbs.alloc_td = alloc_td_op;
        verbs.dealloc_td = dealloc_td_op;
        verbs.alloc_parent_domain = alloc_parent_domain_op;
        verbs.context.device = device;
        verbs.context.abi_compat = __VERBS_ABI_IS_EXTENDED;
        verbs.context.cmd_fd = -1;
        verbs.context.async_fd = -1;
        verbs.context.num_comp_vectors = 1;
        verbs.context.ops.post_send = unsupported_post_send;
        verbs.context.ops.post_recv = unsupported_post_recv;
        verbs.context.ops.post_srq_recv = unsupported_post_srq_recv;
        verbs.context.ops.poll_cq = unsupported_poll_cq;
        verbs.context.ops.req_notify_cq = unsupported_req_notify_cq;
        pthread_mutex_init(&verbs.context.mutex, nullptr);
        context->poller = std::thread([context] { context->poll_doorbells(); });
        return &verbs.context;
    }, nullptr);
}

int ibv_close_device(ibv_context* verbs_context) {
    Context* context = context_of(verbs_context);
    context->stopping.store(true, std::memory_order_release);
    context->poller.join();
    pthread_mutex_destroy(&verbs_context->mutex);
    delete context;
    return 0;
}

int ibv_query_device(ibv_context* context, ibv_device_attr* attributes) {
    std::memset(attributes, 0, sizeof(*attributes));
    std::snprintf(attributes->fw_ver, sizeof(attributes->fw_ver), "emulated");
    attributes->node_guid = 0;
    attributes->vendor_id = 0x02c9;        // Mellanox
    attributes->vendor_part_id = 4123;     // ConnectX-6
    attributes->max_mr_size = ~0ull;
    attributes->page_size_cap = 0xfffff000;
    attributes->max_qp = 65536;
    attributes->max_qp_wr = static_cast<int>(kMaxQueuePairWorkRequests);
    attributes->max_sge = static_cast<int>(kMaxScatterGather);
    attributes->max_sge_rd = static_cast<int>(kMaxScatterGather);
    attributes->max_cq = 65536;
    attributes->max_cqe = static_cast<int>(kMaxCompletionQueueEntries);
    attributes->max_mr = 1 << 24;
    attributes->max_pd = 1 << 24;
    attributes->max_qp_rd_atom = 16;
    attributes->max_qp_init_rd_atom = 16;
    attributes->max_res_rd_atom = 1 << 20;
    attributes->atomic_cap = IBV_ATOMIC_HCA;
    attributes->max_srq = 1 << 20;
    attributes->max_srq_wr = static_cast<int>(kMaxSharedReceiveWorkRequests);
    attributes->max_srq_sge = static_cast<int>(kMaxScatterGather);
    attributes->max_pkeys = 1;
    attributes->phys_port_cnt = 1;
    (void)context;
    return 0;
}

int ibv_query_port(ibv_context* context, std::uint8_t port, struct _compat_ibv_port_attr* attributes) {
    return query_port_op(context, port, reinterpret_cast<ibv_port_attr*>(attributes), sizeof(ibv_port_attr));
}

int _ibv_query_gid_ex(ibv_context* context, std::uint32_t port, std::uint32_t index, ibv_gid_entry* entry,
                      std::uint32_t flags, size_t) {
    if (flags != 0) return refuse(EINVAL, fmt::format("ibv_query_gid_ex: flags {:#x} must be 0", flags));
    if (port != 1) return refuse(EINVAL, fmt::format("ibv_query_gid_ex: port {} does not exist", port));
    if (index != 0) return refuse(ENODATA, fmt::format("ibv_query_gid_ex: GID index {} is empty (1-entry table)", index));
    std::memset(entry, 0, sizeof(*entry));
    const std::array<std::uint8_t, 16> gid = context_of(context)->device->gid();
    std::memcpy(entry->gid.raw, gid.data(), gid.size());
    entry->gid_index = 0;
    entry->port_num = 1;
    entry->gid_type = IBV_GID_TYPE_IB;
    entry->ndev_ifindex = 0;
    return 0;
}

ssize_t _ibv_query_gid_table(ibv_context* context, ibv_gid_entry* entries, size_t max_entries, std::uint32_t flags,
                             size_t entry_size) {
    if (flags != 0) {
        errno = EINVAL;
        return -EINVAL;
    }
    if (max_entries < 1) return -EINVAL;
    const int result = _ibv_query_gid_ex(context, 1, 0, entries, 0, entry_size);
    return result == 0 ? 1 : -result;
}

ibv_pd* ibv_alloc_pd(ibv_context* verbs_context) {
    return guarded("ibv_alloc_pd", [&]() -> ibv_pd* {
        auto* domain = new ProtectionDomain();
        domain->domain = context_of(verbs_context)->device->allocate_protection_domain();
        domain->pd.context = verbs_context;
        domain->pd.handle = domain->domain->handle();
        return &domain->pd;
    }, nullptr);
}

int ibv_dealloc_pd(ibv_pd* pd) {
    delete domain_of(pd);
    return 0;
}

ibv_mr* ibv_reg_mr(ibv_pd* pd, void* addr, size_t length, int access) {
    // The kernel (ib_check_mr_access): remote write or atomic without local write is refused.
    if ((access & (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_ATOMIC)) != 0 && (access & IBV_ACCESS_LOCAL_WRITE) == 0) {
        return refuse_pointer<ibv_mr>(EINVAL, fmt::format("ibv_reg_mr: access {:#x} asks for remote write or atomic without local write", access));
    }
    if (length == 0) return refuse_pointer<ibv_mr>(EINVAL, "ibv_reg_mr: length 0");
    return guarded("ibv_reg_mr", [&]() -> ibv_mr* {
        auto* region = new MemoryRegion();
        const std::uint32_t soft_access = static_cast<std::uint32_t>(access) & (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                                                               IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
        region->region = context_of(pd->context)->device->register_memory(domain_of(pd)->domain, addr, length, soft_access);
        region->mr.context = pd->context;
        region->mr.pd = pd;
        region->mr.addr = addr;
        region->mr.length = length;
        region->mr.lkey = region->region->lkey();
        region->mr.rkey = region->region->rkey();
        region->mr.handle = region->region->lkey();
        return &region->mr;
    }, nullptr);
}

ibv_mr* ibv_reg_mr_iova2(ibv_pd* pd, void* addr, size_t length, std::uint64_t iova, unsigned int access) {
    if (iova != reinterpret_cast<std::uintptr_t>(addr))
        return refuse_pointer<ibv_mr>(EOPNOTSUPP, "ibv_reg_mr_iova2: an iova other than the address is not emulated");
    return ibv_reg_mr(pd, addr, length, static_cast<int>(access & ~static_cast<unsigned>(IBV_ACCESS_RELAXED_ORDERING)));
}

int ibv_dereg_mr(ibv_mr* mr) {
    delete reinterpret_cast<MemoryRegion*>(mr);
    return 0;
}

mlx5dv_mkey* mlx5dv_create_mkey(mlx5dv_mkey_init_attr* attributes) {
    if (attributes == nullptr || attributes->pd == nullptr)
        return refuse_pointer<mlx5dv_mkey>(EINVAL, "mlx5dv_create_mkey: no protection domain");
    // As _mlx5dv_create_mkey (verbs.c): create_flags non-zero and known; only a plain indirect
    // key is emulated (no signature, crypto or remote-invalidate keys).
    if (attributes->create_flags != MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT) {
        return refuse_pointer<mlx5dv_mkey>(EOPNOTSUPP, fmt::format("mlx5dv_create_mkey: create_flags {:#x} (only "
                                                                   "MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT is emulated)",
                                                                   attributes->create_flags));
    }
    return guarded("mlx5dv_create_mkey", [&]() -> mlx5dv_mkey* {
        auto* key = new IndirectKey();
        key->key = context_of(attributes->pd->context)->device->create_indirect_key(domain_of(attributes->pd)->domain,
                                                                                   attributes->max_entries);
        key->mkey.lkey = key->key->lkey();
        key->mkey.rkey = key->key->rkey();
        // libmlx5 returns the capacity it created: the request rounded up to a multiple of 4.
        attributes->max_entries = static_cast<std::uint16_t>(key->key->max_entries());
        return &key->mkey;
    }, nullptr);
}

int mlx5dv_destroy_mkey(mlx5dv_mkey* mkey) {
    delete reinterpret_cast<IndirectKey*>(mkey);
    return 0;
}

ibv_cq_ex* mlx5dv_create_cq(ibv_context* verbs_context, ibv_cq_init_attr_ex* attributes, mlx5dv_cq_init_attr* dv_attributes) {
    if (attributes->cqe == 0 || attributes->cqe > kMaxCompletionQueueEntries)
        return refuse_pointer<ibv_cq_ex>(EINVAL, fmt::format("mlx5dv_create_cq: cqe {} outside 1..{} (max_cqe)", attributes->cqe, kMaxCompletionQueueEntries));
    std::uint32_t cqe_size = 64;
    if (dv_attributes != nullptr) {
        if ((dv_attributes->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE) != 0)
            return refuse_pointer<ibv_cq_ex>(EOPNOTSUPP, "mlx5dv_create_cq: CQE compression is not emulated");
        if ((dv_attributes->comp_mask & MLX5DV_CQ_INIT_ATTR_MASK_CQE_SIZE) != 0) {
            cqe_size = dv_attributes->cqe_size;
            if (cqe_size != 64 && cqe_size != 128)
                return refuse_pointer<ibv_cq_ex>(EINVAL, fmt::format("mlx5dv_create_cq: cqe_size {} is not 64 or 128", cqe_size));
        }
    }
    ibv_comp_channel* channel = attributes->channel;
    if (channel != nullptr && channel->context != verbs_context)
        return refuse_pointer<ibv_cq_ex>(EINVAL, "mlx5dv_create_cq: the completion channel belongs to another context");
    // The kernel (ib_uverbs create_cq): comp_vector below num_comp_vectors.
    if (attributes->comp_vector >= static_cast<std::uint32_t>(verbs_context->num_comp_vectors))
        return refuse_pointer<ibv_cq_ex>(EINVAL, fmt::format("mlx5dv_create_cq: comp_vector {} outside 0..{}", attributes->comp_vector,
                                                             verbs_context->num_comp_vectors - 1));
    return guarded("mlx5dv_create_cq", [&]() -> ibv_cq_ex* {
        auto queue = std::make_unique<CompletionQueue>();
        Context& context = *context_of(verbs_context);
        queue->queue = context.device->create_completion_queue(attributes->cqe, cqe_size);
        queue->cq.context = verbs_context;
        queue->cq.channel = channel;
        queue->cq.cq_context = attributes->cq_context;
        queue->cq.cqe = static_cast<int>(queue->queue->ring().cqe_count - 1);
        queue->cq.handle = queue->queue->cqn();
        if (channel != nullptr) {
            epoll_event entry{};
            entry.events = EPOLLIN;
            entry.data.ptr = queue.get();
            if (::epoll_ctl(channel->fd, EPOLL_CTL_ADD, queue->queue->event_descriptor(), &entry) != 0) {
                const int error = errno;
                return refuse_pointer<ibv_cq_ex>(error, fmt::format("mlx5dv_create_cq: epoll_ctl(ADD) of the CQ's eventfd: {}", std::strerror(error)));
            }
            {
                std::lock_guard<std::mutex> lock(channel_of(channel)->mutex);
                ++channel->refcnt;
            }
            context.watch_arms(queue.get(), queue->queue);
        }
        return &queue.release()->cq;
    }, nullptr);
}

// The channel's descriptor is an epoll set: readable while one of its CQs' eventfds is. Blocking
// unless the caller makes it O_NONBLOCK (ibv_get_cq_event then answers EAGAIN), as the kernel's.
ibv_comp_channel* ibv_create_comp_channel(ibv_context* context) {
    const int descriptor = ::epoll_create1(EPOLL_CLOEXEC);
    if (descriptor < 0) return refuse_pointer<ibv_comp_channel>(errno, fmt::format("ibv_create_comp_channel: epoll_create1: {}", std::strerror(errno)));
    auto* channel = new (std::nothrow) CompletionChannel();
    if (channel == nullptr) {
        ::close(descriptor);
        return refuse_pointer<ibv_comp_channel>(ENOMEM, "ibv_create_comp_channel: out of memory");
    }
    channel->channel.context = context;
    channel->channel.fd = descriptor;
    channel->channel.refcnt = 0;
    return &channel->channel;
}

// libibverbs refuses while a CQ still uses the channel (ibv_destroy_comp_channel(3)): EBUSY.
int ibv_destroy_comp_channel(ibv_comp_channel* channel) {
    {
        std::lock_guard<std::mutex> lock(channel_of(channel)->mutex);
        if (channel->refcnt != 0) return refuse(EBUSY, fmt::format("ibv_destroy_comp_channel: {} CQ(s) still use the channel", channel->refcnt));
    }
    ::close(channel->fd);
    delete channel_of(channel);
    return 0;
}

// One event, of whichever CQ of the channel raised one: its eventfd is read, and what it counted
// beyond one is written back, so that each event the device raised is handed out once, as the
// kernel queues one per event.
int ibv_get_cq_event(ibv_comp_channel* channel, ibv_cq** cq, void** cq_context) {
    const int flags = ::fcntl(channel->fd, F_GETFL);
    const int timeout = flags >= 0 && (flags & O_NONBLOCK) != 0 ? 0 : -1;
    for (;;) {
        epoll_event entry{};
        const int ready = ::epoll_wait(channel->fd, &entry, 1, timeout);
        if (ready < 0 && errno == EINTR) continue;
        if (ready < 0) return -1;
        if (ready == 0) {
            errno = EAGAIN;
            return -1;
        }
        CompletionQueue& queue = *static_cast<CompletionQueue*>(entry.data.ptr);
        std::uint64_t count = 0;
        const int descriptor = queue.queue->event_descriptor();
        // Another thread may have taken it since epoll_wait said so: look again.
        if (::read(descriptor, &count, sizeof count) != static_cast<ssize_t>(sizeof count)) continue;
        if (count > 1) {
            const std::uint64_t rest = count - 1;
            [[maybe_unused]] const ssize_t written = ::write(descriptor, &rest, sizeof rest);
        }
        {
            std::lock_guard<std::mutex> lock(queue.events_mutex);
            ++queue.events_read;
        }
        *cq = ibv_cq_ex_to_cq(&queue.cq);
        *cq_context = queue.cq.cq_context;
        return 0;
    }
}

void ibv_ack_cq_events(ibv_cq* cq, unsigned int nevents) {
    CompletionQueue& queue = *queue_of(cq);
    std::lock_guard<std::mutex> lock(queue.events_mutex);
    queue.events_completed += nevents;
    queue.events_acknowledged.notify_all();
}

ibv_cq* ibv_create_cq(ibv_context* verbs_context, int cqe, void* cq_context, ibv_comp_channel* channel, int comp_vector) {
    if (cqe <= 0) return refuse_pointer<ibv_cq>(EINVAL, fmt::format("ibv_create_cq: cqe {}", cqe));
    if (comp_vector < 0) return refuse_pointer<ibv_cq>(EINVAL, fmt::format("ibv_create_cq: comp_vector {}", comp_vector));
    ibv_cq_init_attr_ex attributes{};
    attributes.cqe = static_cast<std::uint32_t>(cqe);
    attributes.cq_context = cq_context;
    attributes.channel = channel;
    attributes.comp_vector = static_cast<std::uint32_t>(comp_vector);
    return reinterpret_cast<ibv_cq*>(mlx5dv_create_cq(verbs_context, &attributes, nullptr));
}

// As libibverbs over the kernel: an event queued unread is dropped with the CQ
// (ib_uverbs_release_ucq), and destruction waits until every event read was acknowledged.
int ibv_destroy_cq(ibv_cq* cq) {
    CompletionQueue* queue = queue_of(cq);
    if (cq->channel != nullptr) {
        context_of(cq->context)->unwatch(queue);
        ::epoll_ctl(cq->channel->fd, EPOLL_CTL_DEL, queue->queue->event_descriptor(), nullptr);
        {
            std::unique_lock<std::mutex> lock(queue->events_mutex);
            queue->events_acknowledged.wait(lock, [&] { return queue->events_completed == queue->events_read; });
        }
        std::lock_guard<std::mutex> lock(channel_of(cq->channel)->mutex);
        --cq->channel->refcnt;
    }
    delete queue;
    return 0;
}

ibv_srq* ibv_create_srq(ibv_pd* pd, ibv_srq_init_attr* attributes) {
    if (attributes->attr.max_wr == 0 || attributes->attr.max_wr > kMaxSharedReceiveWorkRequests)
        return refuse_pointer<ibv_srq>(EINVAL, fmt::format("ibv_create_srq: max_wr {} outside 1..{} (max_srq_wr)", attributes->attr.max_wr, kMaxSharedReceiveWorkRequests));
    if (attributes->attr.max_sge == 0 || attributes->attr.max_sge > kMaxScatterGather)
        return refuse_pointer<ibv_srq>(EINVAL, fmt::format("ibv_create_srq: max_sge {} outside 1..{} (max_srq_sge)", attributes->attr.max_sge, kMaxScatterGather));
    return guarded("ibv_create_srq", [&]() -> ibv_srq* {
        auto* shared = new SharedReceiveQueue();
        shared->queue = context_of(pd->context)->device->create_shared_receive_queue(domain_of(pd)->domain, attributes->attr.max_wr,
                                                                                     attributes->attr.max_sge);
        shared->srq.context = pd->context;
        shared->srq.srq_context = attributes->srq_context;
        shared->srq.pd = pd;
        shared->srq.handle = shared->queue->srqn();
        // As libmlx5 reports it: what the application may post (the ring less one WQE).
        attributes->attr.max_wr = shared->queue->initial_tail();
        attributes->attr.max_sge = (shared->queue->ring().stride - 16) / 16;
        return &shared->srq;
    }, nullptr);
}

int ibv_query_srq(ibv_srq* srq, ibv_srq_attr* attributes) {
    const soft::SharedReceiveQueue& queue = *shared_of(srq)->queue;
    attributes->max_wr = queue.ring().wqe_count - 1;
    attributes->max_sge = (queue.ring().stride - 16) / 16;
    attributes->srq_limit = 0;
    return 0;
}

int ibv_destroy_srq(ibv_srq* srq) {
    delete shared_of(srq);
    return 0;
}

ibv_qp* mlx5dv_create_qp(ibv_context* verbs_context, ibv_qp_init_attr_ex* attributes, mlx5dv_qp_init_attr* dv_attributes) {
    Context& context = *context_of(verbs_context);
    if ((attributes->comp_mask & IBV_QP_INIT_ATTR_PD) == 0 || attributes->pd == nullptr)
        return refuse_pointer<ibv_qp>(EINVAL, "mlx5dv_create_qp: a protection domain (IBV_QP_INIT_ATTR_PD) is required");
    const std::uint64_t dv_mask = dv_attributes != nullptr ? dv_attributes->comp_mask : 0;
    constexpr std::uint64_t kKnownMask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS | MLX5DV_QP_INIT_ATTR_MASK_DC;
    if ((dv_mask & ~kKnownMask) != 0)
        return refuse_pointer<ibv_qp>(EOPNOTSUPP, fmt::format("mlx5dv_create_qp: mlx5dv comp_mask {:#x} is not emulated", dv_mask));
    if ((dv_mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) != 0 &&
        (dv_attributes->create_flags & ~static_cast<std::uint32_t>(MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE)) != 0) {
        return refuse_pointer<ibv_qp>(EOPNOTSUPP, fmt::format("mlx5dv_create_qp: create_flags {:#x} are not emulated", dv_attributes->create_flags));
    }
    const bool dc = (dv_mask & MLX5DV_QP_INIT_ATTR_MASK_DC) != 0;
    // mlx5dv_create_qp(3): DC QPs are created with qp_type IBV_QPT_DRIVER and the DC mask.
    if (dc != (attributes->qp_type == IBV_QPT_DRIVER)) {
        return refuse_pointer<ibv_qp>(EINVAL, fmt::format("mlx5dv_create_qp: qp_type {} {} MLX5DV_QP_INIT_ATTR_MASK_DC: DC needs IBV_QPT_DRIVER and the DC mask together",
                                                          static_cast<int>(attributes->qp_type), dc ? "with" : "without"));
    }
    if (!dc && attributes->qp_type != IBV_QPT_RC)
        return refuse_pointer<ibv_qp>(EOPNOTSUPP, fmt::format("mlx5dv_create_qp: qp_type {} is not emulated (RC and DC only)", static_cast<int>(attributes->qp_type)));
    return guarded("mlx5dv_create_qp", [&]() -> ibv_qp* {
        if (!dc) return create_reliable_connected(context, verbs_context, attributes);
        if ((dv_mask & MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS) != 0 && dv_attributes->create_flags != 0)
            return refuse_pointer<ibv_qp>(EINVAL, "mlx5dv_create_qp: a DC QP takes no create_flags");
        switch (dv_attributes->dc_init_attr.dc_type) {
            case MLX5DV_DCTYPE_DCI: return create_dc_initiator(context, verbs_context, attributes);
            case MLX5DV_DCTYPE_DCT: return create_dc_target(context, verbs_context, attributes, dv_attributes->dc_init_attr.dct_access_key);
            default:
                return refuse_pointer<ibv_qp>(EINVAL, fmt::format("mlx5dv_create_qp: dc_type {} is neither DCI nor DCT",
                                                                  static_cast<int>(dv_attributes->dc_init_attr.dc_type)));
        }
    }, nullptr);
}

ibv_qp* ibv_create_qp(ibv_pd* pd, ibv_qp_init_attr* attributes) {
    ibv_qp_init_attr_ex extended{};
    extended.qp_context = attributes->qp_context;
    extended.send_cq = attributes->send_cq;
    extended.recv_cq = attributes->recv_cq;
    extended.srq = attributes->srq;
    extended.cap = attributes->cap;
    extended.qp_type = attributes->qp_type;
    extended.sq_sig_all = attributes->sq_sig_all;
    extended.comp_mask = IBV_QP_INIT_ATTR_PD;
    extended.pd = pd;
    ibv_qp* qp = mlx5dv_create_qp(pd->context, &extended, nullptr);
    if (qp != nullptr) attributes->cap = extended.cap;
    return qp;
}

int ibv_modify_qp(ibv_qp* qp, ibv_qp_attr* attributes, int mask) {
    QueuePair& pair = *pair_of(qp);
    const emulated::ModifyCheck modify =
        emulated::check_modify(pair.kind, pair.state, mask, attributes->qp_state, attributes->cur_qp_state);
    const emulated::TransitionCheck& check = modify.check;
    const ibv_qp_state next = modify.next;
    if (check.error != 0) return refuse(check.error, fmt::format("ibv_modify_qp(QP {:#x}): {}", qp->qp_num, check.reason));
    int result = 0;
    try {
        result = apply_transition(pair, *context_of(qp->context), *attributes, mask, next);
    } catch (const soft::SoftDeviceError& error) {
        return refuse(EINVAL, fmt::format("ibv_modify_qp(QP {:#x}): refused by the software device: {}", qp->qp_num, error.what()));
    }
    if (result == 0) {
        pair.state = next;
        qp->state = next;
    }
    return result;
}

int ibv_query_qp(ibv_qp* qp, ibv_qp_attr* attributes, int, ibv_qp_init_attr* init_attributes) {
    const QueuePair& pair = *pair_of(qp);
    std::memset(attributes, 0, sizeof(*attributes));
    // The device moves a QP to ERR by itself (a completion with error): ask it.
    ibv_qp_state state = pair.state;
    soft::QueuePairState device_state = soft::QueuePairState::reset;
    bool known = true;
    if (pair.reliable) device_state = pair.reliable->state();
    else if (pair.initiator) device_state = pair.initiator->state();
    else if (pair.target) device_state = pair.target->state();
    else known = false;
    if (known && device_state == soft::QueuePairState::error) state = IBV_QPS_ERR;
    attributes->qp_state = state;
    attributes->cur_qp_state = state;
    attributes->cap = pair.granted;
    if (init_attributes != nullptr) {
        std::memset(init_attributes, 0, sizeof(*init_attributes));
        init_attributes->send_cq = qp->send_cq;
        init_attributes->recv_cq = qp->recv_cq;
        init_attributes->srq = qp->srq;
        init_attributes->cap = pair.granted;
        init_attributes->qp_type = qp->qp_type;
    }
    return 0;
}

int ibv_destroy_qp(ibv_qp* qp) {
    Context& context = *context_of(qp->context);
    context.unwatch(pair_of(qp));
    delete pair_of(qp);
    return 0;
}

ibv_ah* ibv_create_ah(ibv_pd* pd, ibv_ah_attr* attributes) {
    if (attributes->port_num != 1) return refuse_pointer<ibv_ah>(EINVAL, fmt::format("ibv_create_ah: port_num {} does not exist", attributes->port_num));
    if (attributes->is_global == 0 && attributes->dlid == 0)
        return refuse_pointer<ibv_ah>(EINVAL, "ibv_create_ah: no GRH and dlid 0 address nothing on InfiniBand");
    if (attributes->is_global != 0 && attributes->grh.sgid_index != 0)
        return refuse_pointer<ibv_ah>(EINVAL, fmt::format("ibv_create_ah: sgid_index {} outside the 1-entry GID table", attributes->grh.sgid_index));
    auto* handle = new AddressHandle();
    handle->ah.context = pd->context;
    handle->ah.pd = pd;
    fill_address_vector(*context_of(pd->context), *attributes, handle->vector);
    return &handle->ah;
}

int ibv_destroy_ah(ibv_ah* ah) {
    delete reinterpret_cast<AddressHandle*>(ah);
    return 0;
}

int mlx5dv_init_obj(mlx5dv_obj* object, std::uint64_t types) {
    constexpr std::uint64_t kKnown = MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ | MLX5DV_OBJ_SRQ | MLX5DV_OBJ_AH;
    if ((types & ~kKnown) != 0) return refuse(EOPNOTSUPP, fmt::format("mlx5dv_init_obj: object types {:#x} are not emulated", types));
    if ((types & MLX5DV_OBJ_QP) != 0) {
        const QueuePair& pair = *pair_of(object->qp.in);
        mlx5dv_qp& out = *object->qp.out;
        const rdmachan::mlx5::SendQueueRing* send = pair.reliable ? &pair.reliable->send_ring()
                                                   : pair.initiator ? &pair.initiator->send_ring()
                                                                    : nullptr;
        if (send == nullptr) return refuse(EINVAL, fmt::format("mlx5dv_init_obj(QP {:#x}): a DCT has no rings", object->qp.in->qp_num));
        std::memset(&out, 0, sizeof(out));
        out.dbrec = reinterpret_cast<__be32*>(send->doorbell_record);
        out.sq.buf = send->buffer;
        out.sq.wqe_cnt = send->wqe_count;
        out.sq.stride = 64;
        if (pair.reliable && pair.reliable->receive_ring().wqe_count != 0 && object->qp.in->srq == nullptr) {
            const rdmachan::mlx5::ReceiveQueueRing& receive = pair.reliable->receive_ring();
            out.rq.buf = receive.buffer;
            out.rq.wqe_cnt = receive.wqe_count;
            out.rq.stride = receive.stride;
        }
        out.bf.reg = send->blueflame_register;
        out.bf.size = send->blueflame_size;
    }
    if ((types & MLX5DV_OBJ_CQ) != 0) {
        const rdmachan::mlx5::CompletionQueueRing& ring = queue_of(object->cq.in)->queue->ring();
        mlx5dv_cq& out = *object->cq.out;
        std::memset(&out, 0, sizeof(out));
        out.buf = ring.buffer;
        out.dbrec = reinterpret_cast<__be32*>(ring.doorbell_record);
        out.cqe_cnt = ring.cqe_count;
        out.cqe_size = ring.cqe_size;
        out.cqn = ring.cqn;
        // The UAR page whose CQ doorbell (+0x20) an arm writes; the poller watches it for a CQ
        // with a completion channel.
        out.cq_uar = ring.uar;
    }
    if ((types & MLX5DV_OBJ_SRQ) != 0) {
        const soft::SharedReceiveQueue& queue = *shared_of(object->srq.in)->queue;
        mlx5dv_srq& out = *object->srq.out;
        std::memset(&out, 0, sizeof(out));
        out.buf = queue.ring().buffer;
        out.dbrec = reinterpret_cast<__be32*>(queue.ring().doorbell_record);
        out.stride = queue.ring().stride;
        out.head = 0;
        out.tail = queue.initial_tail();
        out.comp_mask = MLX5DV_SRQ_MASK_SRQN;
        out.srqn = queue.srqn();
    }
    if ((types & MLX5DV_OBJ_AH) != 0) {
        object->ah.out->av = &reinterpret_cast<AddressHandle*>(object->ah.in)->vector;
        object->ah.out->comp_mask = 0;
    }
    return 0;
}

}  // extern "C"
