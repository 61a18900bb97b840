// The software device's control plane: object creation with mlx5 ring layouts, memory
// registration, and the QP state machine.
#include "transport/soft/device.hpp"

#include <arpa/inet.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "transport/soft/flight_events.hpp"
#include "common/logger.hpp"
#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/memory_lock.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {
namespace {

constexpr std::uint32_t kMaxQueueEntries = 32768;
constexpr std::uint32_t kMaxScatterGatherElements = 30;
constexpr std::uint32_t kMaxInlineData = 912;
constexpr std::uint32_t kBlueFlameSize = 256;
// The records after a ring (completion_ring.hpp names its words).
constexpr std::size_t kDoorbellBlockBytes = 64;

// Peers learn the arena, and its new size, before any region or ring in it is published
// (caller holds the device mutex).
void publish_ring_memory(DeviceCore& core) {
    if (core.arena.base() != nullptr) core.published_table.publish_arena(core.arena);
}

std::uint32_t round_up_power_of_two(std::uint32_t value) {
    std::uint32_t result = 1;
    while (result < value) result <<= 1;
    return result;
}

[[noreturn]] void fail(const std::string& message) { throw SoftDeviceError(message); }

// Bytes pinned by every software device's registrations in this process, the figure the
// kernel checks against RLIMIT_MEMLOCK.
std::atomic<std::uint64_t> process_pinned_bytes{0};

std::string hex_address(const void* address) {
    char text[32];
    std::snprintf(text, sizeof text, "%p", address);
    return text;
}

void check_range(const char* call, const char* field, std::uint64_t value, std::uint64_t low, std::uint64_t high) {
    if (value < low || value > high) {
        fail(std::string(call) + ": " + field + " = " + std::to_string(value) + " is out of range [" +
             std::to_string(low) + ", " + std::to_string(high) + "]");
    }
}

}  // namespace

const char* to_string(QueuePairState state) {
    switch (state) {
        case QueuePairState::reset: return "RESET";
        case QueuePairState::init: return "INIT";
        case QueuePairState::ready_to_receive: return "RTR";
        case QueuePairState::ready_to_send: return "RTS";
        case QueuePairState::error: return "ERR";
    }
    return "unknown";
}

std::shared_ptr<Device> Device::open(const DeviceOptions& options) {
    std::shared_ptr<Device> device(new Device());
    device->core_ = std::make_unique<DeviceCore>(*device, options);
    detail::logger().info("software mlx5 device {} opened", device->name());
    return device;
}

Device::~Device() = default;

std::array<std::uint8_t, 16> Device::gid() const { return core_->gid; }
std::uint64_t Device::transfers_by_reference() const { return core_->transfers_by_reference.load(std::memory_order_relaxed); }
std::uint64_t Device::connects_started() const { return core_->connects_started.load(std::memory_order_relaxed); }
std::uint64_t Device::connects_failed() const { return core_->connects_failed.load(std::memory_order_relaxed); }
std::uint64_t Device::answered_hellos() const { return core_->answered_hellos.load(std::memory_order_acquire); }
std::uint64_t Device::zero_hop_writes() const { return core_->zero_hop_writes.load(std::memory_order_relaxed); }
std::uint64_t Device::doorbells_left_to_progress() const {
    return core_->doorbells_left_to_progress.load(std::memory_order_relaxed);
}
std::uint64_t Device::zero_hop_arena_writes() const { return core_->zero_hop_arena_writes.load(std::memory_order_relaxed); }
std::uint64_t Device::zero_hop_reads() const { return core_->zero_hop_reads.load(std::memory_order_relaxed); }
std::uint64_t Device::zero_hop_arena_reads() const { return core_->zero_hop_arena_reads.load(std::memory_order_relaxed); }
std::uint64_t Device::zero_hop_atomics() const { return core_->zero_hop_atomics.load(std::memory_order_relaxed); }
std::uint64_t Device::zero_hop_receives() const { return core_->zero_hop_receives.load(std::memory_order_relaxed); }
std::uint64_t Device::acknowledgements_coalesced() const {
    return core_->coalesced_acknowledgements.load(std::memory_order_relaxed);
}
std::uint64_t Device::compressed_sessions() const { return core_->compressed_sessions.load(std::memory_order_relaxed); }
std::uint64_t Device::compressed_cqes() const { return core_->compressed_cqes.load(std::memory_order_relaxed); }
int Device::progress() { return core_->progress_from_caller(); }
void Device::stop_progress() { core_->stop_progress_from_caller(); }
std::uint64_t Device::caller_progress_turns() const { return core_->caller_progress_turns.load(std::memory_order_relaxed); }
std::uint32_t Device::zero_hop_holder(std::uint32_t key) const { return core_->published_table.holder_of(key); }
std::uint32_t Device::receive_lock_holder() const { return core_->published_table.receive_lock_holder(); }
std::uint64_t Device::receive_lock_takeovers() const { return core_->published_table.receive_lock_takeovers(); }
std::uint16_t Device::lid() const { return core_->lid; }

std::string Device::name() const {
    char address[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &core_->ipv4, address, sizeof address);
    return std::string("soft:") + address + ":" + std::to_string(core_->lid);
}

std::shared_ptr<ProtectionDomain> Device::allocate_protection_domain() {
    std::lock_guard lock(core_->mutex);
    return std::shared_ptr<ProtectionDomain>(new ProtectionDomain(shared_from_this(), core_->next_handle++));
}

ProtectionDomain::~ProtectionDomain() = default;

std::shared_ptr<MemoryRegion> Device::register_memory(const std::shared_ptr<ProtectionDomain>& domain, void* addr,
                                                      std::size_t length, std::uint32_t access_flags) {
    return register_range("register_memory", domain, addr, length, access_flags, 0);
}

std::shared_ptr<MemoryRegion> Device::allocate_memory(const std::shared_ptr<ProtectionDomain>& domain, std::size_t length,
                                                      std::uint32_t access_flags) {
    if (domain == nullptr || domain->device().get() != this) fail("allocate_memory: the protection domain belongs to another device");
    if (length == 0) fail("allocate_memory: length is 0");
    SharedArena& arena = core_->arena;
    const std::optional<std::uint64_t> offset = arena.allocate(length);
    if (!offset) return nullptr;
    {
        std::lock_guard lock(core_->mutex);
        publish_ring_memory(*core_);
    }
    try {
        return register_range("allocate_memory", domain, arena.base() + *offset, length, access_flags, *offset + 1);
    } catch (...) {
        arena.release(*offset, length);
        throw;
    }
}

std::string Device::arena_refusal() const {
    if (const char* why = core_->arena.why_not(); why != nullptr) return why;
    return "its reservation of " + std::to_string(kArenaReserveBytes >> 30) + " GiB has no room for it";
}

std::shared_ptr<MemoryRegion> Device::register_range(const char* call, const std::shared_ptr<ProtectionDomain>& domain,
                                                     void* addr, std::size_t length, std::uint32_t access_flags,
                                                     std::uint64_t arena_offset) {
    const std::string name = call;
    if (domain == nullptr || domain->device().get() != this) fail(name + ": the protection domain belongs to another device");
    if (addr == nullptr) fail(name + ": addr is null");
    if (length == 0) fail(name + ": length is 0");
    if ((access_flags & ~(kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic)) != 0) {
        fail(name + ": unknown access flags 0x" + std::to_string(access_flags));
    }
    // As verbs requires: remote write or atomic access needs local write access too.
    if ((access_flags & (kRemoteWrite | kRemoteAtomic)) != 0 && (access_flags & kLocalWrite) == 0) {
        fail(name + ": remote write/atomic access requires local write access (access flags " +
             std::to_string(access_flags) + ")");
    }
    // Pinning is accounted per process, in whole pages, as the kernel does for ibv_reg_mr.
    const std::uint64_t pinned = transport::pinned_bytes(addr, length);
    const transport::MemoryLockLimit limit = transport::memory_lock_limit();
    if (!limit.exempt && limit.bytes) {
        std::uint64_t held = process_pinned_bytes.load();
        do {
            if (held + pinned > *limit.bytes) {
                fail(name + ": " + std::to_string(length) + " bytes at " + hex_address(addr) + " pin " +
                     std::to_string(pinned) + " bytes, " + std::to_string(held) +
                     " already pinned by this process; that exceeds the limit: " + transport::describe(limit) +
                     " (a ConnectX's driver refuses it with ENOMEM too)");
            }
        } while (!process_pinned_bytes.compare_exchange_weak(held, held + pinned));
    } else {
        process_pinned_bytes.fetch_add(pinned);
    }
    std::lock_guard lock(core_->mutex);
    // The low byte is a per-registration tag, so a stale key of a freed region is not accepted
    // by the region that reuses its index.
    static thread_local std::mt19937 random(std::random_device{}());
    const std::uint32_t key = (core_->next_key_index++ << 8) | (random() & 0xff);
    core_->memory_regions[key] = MemoryRegionState{domain->handle(), reinterpret_cast<std::uint64_t>(addr), length, access_flags};
    core_->published_table.publish_region(key, domain->handle(), reinterpret_cast<std::uint64_t>(addr), length, access_flags,
                                          arena_offset);
    return std::shared_ptr<MemoryRegion>(new MemoryRegion(domain, reinterpret_cast<std::uint64_t>(addr), length, key, arena_offset));
}

namespace {
// How long deregistration waits for a peer's zero-hop write that checked the key before it was
// withdrawn. A write holds it for one process_vm_writev; only a peer stopped between its check and
// the end of its write (SIGSTOP, a debugger) holds it longer, and one that exited is reclaimed.
constexpr int kDeregistrationDeadlineMs = 2000;
}  // namespace

std::uint32_t MemoryRegion::withdraw(bool restore_when_busy) {
    DeviceCore& core = domain_->device()->core();
    MemoryRegionState state{};
    bool published = false;
    {
        std::lock_guard lock(core.mutex);
        if (const auto found = core.memory_regions.find(key_); found != core.memory_regions.end()) state = found->second;
        core.memory_regions.erase(key_);
        published = core.published_table.unpublish_region(key_);
    }
    // Outside the mutex, so the device goes on while we wait.
    const std::uint32_t holder = published ? core.published_table.wait_unused(key_, kDeregistrationDeadlineMs) : 0;
    if (holder != 0 && restore_when_busy) {
        std::lock_guard lock(core.mutex);
        core.memory_regions[key_] = state;
        core.published_table.publish_region(key_, state.protection_domain, state.addr, state.length, state.access,
                                            arena_offset_);
        return holder;
    }
    deregistered_ = true;
    process_pinned_bytes.fetch_sub(transport::pinned_bytes(reinterpret_cast<const void*>(addr_), length_));
    return holder;
}

void MemoryRegion::release_memory() {
    if (arena_offset_ != 0) domain_->device()->core().arena.release(arena_offset_ - 1, length_);
    arena_offset_ = 0;
}

void MemoryRegion::deregister() {
    if (deregistered_) return;
    // An arena region's memory stays until the destructor: the caller may still hold it.
    if (const std::uint32_t holder = withdraw(true); holder != 0) {
        throw SoftDeviceError("deregister_memory on " + domain_->device()->name() + ": memory region key " + hex_address(reinterpret_cast<const void*>(std::uintptr_t{key_})) +
                              " is busy: process " + std::to_string(holder) + " (a peer stopped in a zero-hop write of it) still held it " +
                              std::to_string(kDeregistrationDeadlineMs) +
                              " ms after deregistration began; the region stays registered (as ibv_dereg_mr's EBUSY): "
                              "try again once that process runs again or has exited");
    }
}

MemoryRegion::~MemoryRegion() {
    if (deregistered_) {  // by deregister(), with no peer holding it: the memory is free to go
        release_memory();
        return;
    }
    // A destructor cannot fail: the key is withdrawn either way (no new access starts), and a
    // peer still holding it is named. deregister() is the call that fails instead.
    if (const std::uint32_t holder = withdraw(false); holder != 0) {
        // An arena region's memory is kept out of the arena then (leaked until the device
        // closes), so that write cannot land in another region that reuses it.
        detail::logger().error("software device {}: memory region key {:#x}: process {} (a peer stopped in a zero-hop write of it) "
                               "still held it {} ms after deregistration began; destroyed anyway, so that process may still "
                               "complete one write into this memory when it runs again (MemoryRegion::deregister() fails instead)",
                               domain_->device()->name(), key_, holder, kDeregistrationDeadlineMs);
    } else {
        release_memory();
    }
}

std::shared_ptr<CompletionQueue> Device::create_completion_queue(std::uint32_t entries, std::uint32_t cqe_size,
                                                                 bool compressed) {
    check_range("create_completion_queue", "entries", entries, 1, 4u << 20);
    if (cqe_size != 64 && cqe_size != 128) fail("create_completion_queue: cqe_size = " + std::to_string(cqe_size) + " (64 or 128)");
    auto context = std::make_unique<CompletionQueueContext>();
    const std::uint32_t count = round_up_power_of_two(entries + 1);
    const std::size_t entry_bytes = static_cast<std::size_t>(count) * cqe_size;
    context->buffer = std::make_unique<AlignedBuffer>(entry_bytes + kDoorbellBlockBytes, core_->arena);
    // Every entry starts invalid and owned by hardware, as libmlx5 initialises it.
    for (std::uint32_t i = 0; i < count; ++i) {
        context->buffer->data[static_cast<std::size_t>(i) * cqe_size + cqe_size - 1] = mlx5::kCqeInvalid << 4;
    }
    context->ring.buffer = context->buffer->data;
    context->ring.cqe_count = count;
    context->ring.cqe_size = cqe_size;
    context->ring.doorbell_record = reinterpret_cast<std::uint32_t*>(context->buffer->data + entry_bytes);
    context->ring.uar = context->uar;
    context->ring.compressed_cqes = compressed;
    context->compressed = compressed;
    context->event_descriptor = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (context->event_descriptor < 0) {
        fail("create_completion_queue: eventfd for its completion events: " + std::string(std::strerror(errno)));
    }
    const int event_descriptor = context->event_descriptor;
    std::lock_guard lock(core_->mutex);
    publish_ring_memory(*core_);
    context->ring.cqn = core_->next_handle++;
    const mlx5::CompletionQueueRing ring = context->ring;
    core_->completion_queues[ring.cqn] = std::move(context);
    return std::shared_ptr<CompletionQueue>(new CompletionQueue(shared_from_this(), ring, event_descriptor));
}

CompletionQueueContext::~CompletionQueueContext() {
    if (event_descriptor >= 0) ::close(event_descriptor);
}

void CompletionQueue::ring_arm_doorbell() {
    const std::uint32_t word = mlx5::big_to_host32(mlx5::load_acquire32(ring_.doorbell_record + mlx5::kCqArm));
    // The arm word: sequence number, command (next or solicited), consumer index.
    const bool solicited_only = (word & mlx5::kCqArmSolicited) != 0;
    CompletionRingView::of(ring_, event_descriptor_).take_arm(solicited_only, word & mlx5::kCqConsumerIndexMask);
}

bool CompletionQueue::take_event() {
    std::uint64_t count = 0;
    return ::read(event_descriptor_, &count, sizeof count) == static_cast<ssize_t>(sizeof count);
}

CompletionQueue::~CompletionQueue() {
    std::lock_guard lock(device_->core().mutex);
    device_->core().completion_queues.erase(ring_.cqn);
}

bool CompletionQueue::overrun() const {
    std::lock_guard lock(device_->core().mutex);
    auto found = device_->core().completion_queues.find(ring_.cqn);
    return found != device_->core().completion_queues.end() && found->second->overrun.load();
}

std::shared_ptr<SharedReceiveQueue> Device::create_shared_receive_queue(const std::shared_ptr<ProtectionDomain>& domain,
                                                                        std::uint32_t max_wr, std::uint32_t max_sge) {
    check_range("create_shared_receive_queue", "max_wr", max_wr, 1, kMaxQueueEntries - 1);
    check_range("create_shared_receive_queue", "max_sge", max_sge, 1, kMaxScatterGatherElements);
    auto context = std::make_unique<SharedReceiveQueueContext>();
    const std::uint32_t stride = round_up_power_of_two(std::max(32u, mlx5::kSrqNextSegmentSize + 16 * max_sge));
    // One WQE more than max_wr: the free list's tail is a sentinel that is never posted.
    const std::uint32_t count = round_up_power_of_two(max_wr + 1);
    context->buffer = std::make_unique<AlignedBuffer>(static_cast<std::size_t>(count) * stride, core_->arena);
    context->doorbell = std::make_unique<AlignedBuffer>(64, core_->arena);
    for (std::uint32_t i = 0; i < count; ++i) {
        mlx5::store_big16(context->buffer->data + static_cast<std::size_t>(i) * stride + mlx5::kSrqNextWqeIndex,
                          static_cast<std::uint16_t>(i + 1 < count ? i + 1 : 0));
    }
    context->protection_domain = domain->handle();
    context->ring.buffer = context->buffer->data;
    context->ring.wqe_count = count;
    context->ring.stride = stride;
    context->ring.doorbell_record = reinterpret_cast<std::uint32_t*>(context->doorbell->data);
    std::lock_guard lock(core_->mutex);
    context->ring.srqn = core_->next_handle++;
    const mlx5::SharedReceiveQueueRing ring = context->ring;
    core_->shared_receive_queues[ring.srqn] = std::move(context);
    return std::shared_ptr<SharedReceiveQueue>(new SharedReceiveQueue(domain, ring));
}

SharedReceiveQueue::~SharedReceiveQueue() {
    DeviceCore& core = domain_->device()->core();
    std::lock_guard lock(core.mutex);
    core.shared_receive_queues.erase(ring_.srqn);
}

std::shared_ptr<QueuePair> Device::create_queue_pair(const std::shared_ptr<ProtectionDomain>& domain, QueuePairInit init) {
    const QueuePairCapabilities& capabilities = init.capabilities;
    check_range("create_queue_pair", "max_send_wr", capabilities.max_send_wr, 1, kMaxQueueEntries);
    check_range("create_queue_pair", "max_send_sge", capabilities.max_send_sge, 1, kMaxScatterGatherElements);
    check_range("create_queue_pair", "max_inline_data", capabilities.max_inline_data, 0, kMaxInlineData);
    if (init.srq == nullptr) {
        check_range("create_queue_pair", "max_recv_wr", capabilities.max_recv_wr, 1, kMaxQueueEntries);
        check_range("create_queue_pair", "max_recv_sge", capabilities.max_recv_sge, 1, kMaxScatterGatherElements);
    }
    if (init.send_cq == nullptr || init.recv_cq == nullptr) fail("create_queue_pair: send_cq and recv_cq are required");
    if (init.send_cq->ring().buffer == nullptr) fail("create_queue_pair: send_cq has no ring");

    // Send WQE size: ctrl + remote address + atomic + the larger of the SGEs and the inline data.
    const std::uint32_t data_bytes = std::max(16 * capabilities.max_send_sge,
                                              capabilities.max_inline_data == 0 ? 0u : ((capabilities.max_inline_data + 4 + 15) / 16) * 16);
    const std::uint32_t wqe_bytes = 48 + data_bytes;
    const std::uint32_t wqebbs_per_wqe = (wqe_bytes + 63) / 64;
    const std::uint32_t send_wqe_count = round_up_power_of_two(capabilities.max_send_wr * wqebbs_per_wqe);
    std::uint32_t receive_stride = 0;
    std::uint32_t receive_count = 0;
    if (init.srq == nullptr) {
        receive_stride = round_up_power_of_two(16 * std::max(capabilities.max_recv_sge, 1u));
        receive_count = std::max(round_up_power_of_two(capabilities.max_recv_wr) * receive_stride, 64u) / receive_stride;
    }

    auto context = std::make_unique<QueuePairContext>();
    const std::size_t receive_bytes = static_cast<std::size_t>(receive_count) * receive_stride;
    const std::size_t ring_bytes = receive_bytes + static_cast<std::size_t>(send_wqe_count) * 64;
    context->buffer = std::make_unique<AlignedBuffer>(ring_bytes + kDoorbellBlockBytes, core_->arena);
    auto* doorbell_record = reinterpret_cast<std::uint32_t*>(context->buffer->data + ring_bytes);
    context->blueflame = std::make_unique<AlignedBuffer>(2 * kBlueFlameSize);
    context->protection_domain = domain->handle();
    context->user_index = init.user_index;
    context->scatter_to_cqe = init.scatter_to_cqe;
    context->receive_ring = {receive_count != 0 ? context->buffer->data : nullptr, receive_count, receive_stride, doorbell_record};

    std::lock_guard lock(core_->mutex);
    publish_ring_memory(*core_);
    context->send_cq = core_->completion_queues.at(init.send_cq->cqn()).get();
    context->recv_cq = core_->completion_queues.at(init.recv_cq->cqn()).get();
    if (init.srq != nullptr) context->srq = core_->shared_receive_queues.at(init.srq->srqn()).get();
    // QP numbers are 24 bits; start above the low numbers the other objects use.
    context->qpn = 0x100 + core_->next_handle++;
    context->send_ring = {context->buffer->data + receive_bytes, send_wqe_count, context->qpn, doorbell_record, context->blueflame->data,
                          kBlueFlameSize};
    QueuePairCapabilities granted = capabilities;
    granted.max_recv_wr = receive_count;
    std::shared_ptr<QueuePair> queue_pair(
        new QueuePair(domain, std::move(init), context->send_ring, context->receive_ring, granted));
    queue_pair->core_ = core_.get();
    queue_pair->doorbell_pending_ = &context->doorbell_pending;
    queue_pair->context_ = context.get();
    core_->queue_pairs[context->qpn] = std::move(context);
    return queue_pair;
}

QueuePair::~QueuePair() {
    std::lock_guard lock(core_->mutex);
    core_->published_table.unpublish_queue_pair(send_ring_.qpn);
    core_->queue_pairs.erase(send_ring_.qpn);
}

QueuePairState QueuePair::state() const {
    std::lock_guard lock(core_->mutex);
    return core_->queue_pairs.at(send_ring_.qpn)->state;
}

void QueuePair::modify_to_init(std::uint8_t port_num, std::uint32_t access_flags) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    if (context.state != QueuePairState::reset && context.state != QueuePairState::init) {
        fail("modify_qp(QP " + std::to_string(context.qpn) + "): " + to_string(context.state) + " -> INIT is not a valid transition");
    }
    if (port_num != 1) fail("modify_qp(QP " + std::to_string(context.qpn) + ") to INIT: port_num = " + std::to_string(port_num) + ", the software device has port 1 only");
    context.access = access_flags;
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::init));
    context.state = QueuePairState::init;
    core_->published_table.publish_queue_pair(context);
}

void QueuePair::modify_to_ready_to_receive(const ReadyToReceiveAttributes& attributes) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    if (context.state != QueuePairState::init) {
        fail("modify_qp(QP " + std::to_string(context.qpn) + "): " + to_string(context.state) + " -> RTR is not a valid transition");
    }
    check_range("modify_qp to RTR", "remote qpn", attributes.remote.qpn, 1, 0xffffff);
    check_range("modify_qp to RTR", "rq_psn", attributes.rq_psn, 0, 0xffffff);
    check_range("modify_qp to RTR", "min_rnr_timer", attributes.min_rnr_timer, 0, 31);
    const std::uint32_t mtu = attributes.path_mtu_bytes;
    if (mtu != 256 && mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096) {
        fail("modify_qp(QP " + std::to_string(context.qpn) + ") to RTR: path_mtu = " + std::to_string(mtu) + " bytes is not an IB MTU");
    }
    context.receive_attributes = attributes;
    context.expected_psn = attributes.rq_psn;
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::ready_to_receive));
    context.state = QueuePairState::ready_to_receive;
    core_->published_table.publish_queue_pair(context);
}

void QueuePair::modify_to_ready_to_send(const ReadyToSendAttributes& attributes) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    if (context.state != QueuePairState::ready_to_receive && context.state != QueuePairState::ready_to_send) {
        fail("modify_qp(QP " + std::to_string(context.qpn) + "): " + to_string(context.state) + " -> RTS is not a valid transition");
    }
    check_range("modify_qp to RTS", "sq_psn", attributes.sq_psn, 0, 0xffffff);
    check_range("modify_qp to RTS", "timeout", attributes.timeout, 0, 31);
    check_range("modify_qp to RTS", "retry_cnt", attributes.retry_cnt, 0, 7);
    check_range("modify_qp to RTS", "rnr_retry", attributes.rnr_retry, 0, 7);
    context.send_attributes = attributes;
    context.next_psn = attributes.sq_psn;
    context.rnr_retries_left = attributes.rnr_retry;
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::ready_to_send));
    context.state = QueuePairState::ready_to_send;
    core_->published_table.publish_queue_pair(context);
    core_->open_path_soon(context);
    context.doorbell_pending.store(true);
    core_->wake();
}

void QueuePair::modify_to_error() {
    std::lock_guard lock(core_->mutex);
    core_->move_to_error(*core_->queue_pairs.at(send_ring_.qpn), "moved to ERR by the application");
}

void QueuePair::modify_to_reset() {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    // RESET empties both queues: the producer indices restart at 0 on both sides.
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::reset));
    context.state = QueuePairState::reset;
    core_->published_table.publish_queue_pair(context);
    context.in_flight.clear();
    context.waiting_rnr = false;
    context.zero_hop_waits_for_answers = false;
    context.executed = 0;
    context.set_receive_consumed(0);
    // The records are shared with whoever watches them as a NIC does (the emulated ConnectX
    // polls them from its own thread): stored atomically, as the send queue stores them.
    __atomic_store_n(&context.send_ring.doorbell_record[mlx5::kSendDoorbell], 0u, __ATOMIC_RELEASE);
    __atomic_store_n(&context.send_ring.doorbell_record[mlx5::kReceiveDoorbell], 0u, __ATOMIC_RELEASE);
}

void QueuePair::ring_send_doorbell() {
    // Zero-hop writes run right here (zero_hop.cpp); whatever is left wakes the progress thread.
    // They record each WQE executed and are not recorded as a doorbell too: on this path the
    // records' timestamps (rdtsc) were a fifth of the post's time.
    if (core_->execute_from_doorbell(*context_)) return;
    flight::record(flight::SoftEvent::doorbell, send_ring_.qpn);
    // Then requests go to the peer's socket from here (doorbell_requests.cpp).
    if (core_->send_from_doorbell(*context_)) return;
    core_->notify_doorbell(*doorbell_pending_);
}

}  // namespace rdmachan::soft
