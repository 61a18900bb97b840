// The software device's DC objects: DC initiators (DCIs) and DC targets (DCTs), with the
// state machines rdma-core and UCX drive them through (mlx5-facts.md §2).
#include <algorithm>
#include <string>

#include "transport/soft/flight_events.hpp"
#include "transport/mlx5/address_vector.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {
namespace {

constexpr std::uint32_t kMaxQueueEntries = 32768;
constexpr std::uint32_t kMaxScatterGatherElements = 30;
constexpr std::uint32_t kMaxInlineData = 912;
constexpr std::uint32_t kBlueFlameSize = 256;
constexpr std::uint32_t kAllAccess = kLocalWrite | kRemoteWrite | kRemoteRead | kRemoteAtomic;

std::uint32_t round_up_power_of_two(std::uint32_t value) {
    std::uint32_t result = 1;
    while (result < value) result <<= 1;
    return result;
}

[[noreturn]] void fail(const std::string& message) {
    throw SoftDeviceError(message);
}

void check_range(const std::string& call, const char* field, std::uint64_t value, std::uint64_t low,
                 std::uint64_t high) {
    if (value < low || value > high) {
        fail(call + ": " + field + " = " + std::to_string(value) + " is out of range [" +
             std::to_string(low) + ", " + std::to_string(high) + "]");
    }
}

void check_mtu(const std::string& call, std::uint32_t mtu) {
    if (mtu != 256 && mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096) {
        fail(call + ": path_mtu = " + std::to_string(mtu) + " bytes is not an IB MTU");
    }
}

std::string dci_call(const char* call, std::uint32_t qpn) {
    return std::string(call) + "(DCI " + std::to_string(qpn) + ")";
}

void check_transition(const std::string& call, QueuePairState from, const char* to, bool allowed) {
    if (!allowed) fail(call + ": " + to_string(from) + " -> " + to + " is not a valid transition");
}

}  // namespace

std::array<std::uint8_t, 48> Device::address_vector() const {
    // An InfiniBand destination with a GRH: this device's LID and GID, hop limit 64.
    mlx5::Destination destination;
    destination.lid = core_->lid;
    destination.global = true;
    destination.route.hop_limit = 64;
    std::copy(core_->gid.begin(), core_->gid.end(), destination.route.destination_gid);
    std::uint8_t vector[mlx5::kAddressVectorSize];
    mlx5::make_address_vector(vector, destination);
    std::array<std::uint8_t, 48> result{};
    std::copy(std::begin(vector), std::end(vector), result.begin());
    return result;
}

std::shared_ptr<DcInitiator> Device::create_dc_initiator(
    const std::shared_ptr<ProtectionDomain>& domain, DcInitiatorInit init) {
    const std::string call = "create_dc_initiator";
    if (domain == nullptr || domain->device().get() != this)
        fail(call + ": the protection domain belongs to another device");
    if (init.send_cq == nullptr) fail(call + ": send_cq is required");
    const QueuePairCapabilities& capabilities = init.capabilities;
    check_range(call, "max_send_wr", capabilities.max_send_wr, 1, kMaxQueueEntries);
    check_range(call, "max_send_sge", capabilities.max_send_sge, 1, kMaxScatterGatherElements);
    check_range(call, "max_inline_data", capabilities.max_inline_data, 0, kMaxInlineData);

    // As libmlx5 sizes a DCI WQE: ctrl + the 48-byte address vector (its datagram overhead) +
    // remote address + atomic + the larger of the SGEs and the inline data.
    const std::uint32_t data_bytes = std::max(
        16 * capabilities.max_send_sge, capabilities.max_inline_data == 0
                                            ? 0u
                                            : ((capabilities.max_inline_data + 4 + 15) / 16) * 16);
    const std::uint32_t wqe_bytes = 48 + mlx5::kAddressVectorSize + data_bytes;
    const std::uint32_t wqebbs_per_wqe = (wqe_bytes + 63) / 64;
    const std::uint32_t send_wqe_count =
        round_up_power_of_two(capabilities.max_send_wr * wqebbs_per_wqe);

    auto context = std::make_unique<QueuePairContext>();
    context->transport = Transport::dc_initiator;
    context->buffer =
        std::make_unique<AlignedBuffer>(static_cast<std::size_t>(send_wqe_count) * 64);
    context->doorbell = std::make_unique<AlignedBuffer>(64);
    context->blueflame = std::make_unique<AlignedBuffer>(2 * kBlueFlameSize);
    context->protection_domain = domain->handle();
    context->user_index = init.user_index;
    context->receive_ring = {nullptr, 0, 0,
                             reinterpret_cast<std::uint32_t*>(context->doorbell->data)};

    std::lock_guard lock(core_->mutex);
    context->send_cq = core_->completion_queues.at(init.send_cq->cqn()).get();
    context->recv_cq = context->send_cq;  // never written: a DCI receives nothing
    context->qpn = 0x100 + core_->next_handle++;
    context->send_ring = {context->buffer->data,
                          send_wqe_count,
                          context->qpn,
                          reinterpret_cast<std::uint32_t*>(context->doorbell->data),
                          context->blueflame->data,
                          kBlueFlameSize};
    std::shared_ptr<DcInitiator> initiator(
        new DcInitiator(domain, std::move(init), context->send_ring));
    initiator->core_ = core_.get();
    initiator->doorbell_pending_ = &context->doorbell_pending;
    initiator->context_ = context.get();
    core_->queue_pairs[context->qpn] = std::move(context);
    return initiator;
}

DcInitiator::~DcInitiator() {
    std::lock_guard lock(core_->mutex);
    core_->queue_pairs.erase(send_ring_.qpn);
}

QueuePairState DcInitiator::state() const {
    std::lock_guard lock(core_->mutex);
    return core_->queue_pairs.at(send_ring_.qpn)->state;
}

void DcInitiator::modify_to_init(std::uint8_t port_num, std::uint32_t access_flags) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    const std::string call = dci_call("modify_qp", context.qpn);
    check_transition(
        call, context.state, "INIT",
        context.state == QueuePairState::reset || context.state == QueuePairState::init);
    if (port_num != 1)
        fail(call + " to INIT: port_num = " + std::to_string(port_num) +
             ", the software device has port 1 only");
    if ((access_flags & ~kAllAccess) != 0)
        fail(call + " to INIT: unknown access flags " + std::to_string(access_flags));
    context.access = access_flags;
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::init));
    context.state = QueuePairState::init;
}

void DcInitiator::modify_to_ready_to_receive(std::uint32_t path_mtu_bytes) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    const std::string call = dci_call("modify_qp", context.qpn);
    check_transition(call, context.state, "RTR", context.state == QueuePairState::init);
    check_mtu(call + " to RTR", path_mtu_bytes);
    context.receive_attributes = {};
    context.receive_attributes.path_mtu_bytes = path_mtu_bytes;
    context.dc_connected = false;
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::ready_to_receive));
    context.state = QueuePairState::ready_to_receive;
}

void DcInitiator::modify_to_ready_to_send(const ReadyToSendAttributes& attributes) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    const std::string call = dci_call("modify_qp", context.qpn);
    check_transition(call, context.state, "RTS",
                     context.state == QueuePairState::ready_to_receive ||
                         context.state == QueuePairState::ready_to_send);
    check_range(call + " to RTS", "sq_psn", attributes.sq_psn, 0, 0xffffff);
    check_range(call + " to RTS", "timeout", attributes.timeout, 0, 31);
    check_range(call + " to RTS", "retry_cnt", attributes.retry_cnt, 0, 7);
    check_range(call + " to RTS", "rnr_retry", attributes.rnr_retry, 0, 7);
    context.send_attributes = attributes;
    context.next_psn = attributes.sq_psn;
    context.rnr_retries_left = attributes.rnr_retry;
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::ready_to_send));
    context.state = QueuePairState::ready_to_send;
    // WQEs posted before RTS are executed now, as the NIC starts its send queue.
    core_->notify_doorbell(context.doorbell_pending);
}

void DcInitiator::modify_to_error() {
    std::lock_guard lock(core_->mutex);
    core_->move_to_error(*core_->queue_pairs.at(send_ring_.qpn), "moved to ERR by the application");
}

void DcInitiator::modify_to_reset() {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    // RESET forgets everything outstanding: the send queue restarts at WQEBB 0 on both sides
    // (libmlx5 zeroes the doorbell record when it moves a QP to RESET), and the DCI is
    // connected to no DCT.
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::reset));
    context.state = QueuePairState::reset;
    context.in_flight.clear();
    context.waiting_rnr = false;
    context.executed = 0;
    context.receive_attributes = {};
    context.dc_connected = false;
    // Shared with a NIC-side watcher (the emulated ConnectX's poller): stored atomically.
    __atomic_store_n(&context.send_ring.doorbell_record[mlx5::kSendDoorbell], 0u, __ATOMIC_RELEASE);
    __atomic_store_n(&context.send_ring.doorbell_record[mlx5::kReceiveDoorbell], 0u, __ATOMIC_RELEASE);
}

void DcInitiator::ring_send_doorbell() {
    // RDMA writes, reads and atomics to a same-host DCT run right here when they can (zero_hop.cpp);
    // whatever is left wakes the progress thread.
    if (core_->execute_from_doorbell(*context_)) return;
    core_->notify_doorbell(*doorbell_pending_);
}

std::shared_ptr<DcTarget> Device::create_dc_target(const std::shared_ptr<ProtectionDomain>& domain,
                                                   DcTargetInit init) {
    const std::string call = "create_dc_target";
    if (domain == nullptr || domain->device().get() != this)
        fail(call + ": the protection domain belongs to another device");
    // The kernel refuses a DCT without them (mlx5_ib_create_dct returns EINVAL).
    if (init.srq == nullptr)
        fail(call + ": an SRQ is required (a DCT receives only through an SRQ)");
    if (init.recv_cq == nullptr) fail(call + ": recv_cq is required");
    if ((init.access_flags & ~kAllAccess) != 0)
        fail(call + ": unknown access flags " + std::to_string(init.access_flags));
    auto context = std::make_unique<QueuePairContext>();
    context->transport = Transport::dc_target;
    context->protection_domain = domain->handle();
    context->user_index = init.user_index;
    context->access = init.access_flags;
    context->dc_access_key = init.dc_access_key;
    std::lock_guard lock(core_->mutex);
    context->recv_cq = core_->completion_queues.at(init.recv_cq->cqn()).get();
    context->send_cq = init.send_cq != nullptr
                           ? core_->completion_queues.at(init.send_cq->cqn()).get()
                           : context->recv_cq;
    context->srq = core_->shared_receive_queues.at(init.srq->srqn()).get();
    // The number is reserved now but published only at RTR, where rdma-core learns it
    // (verbs.c sets qp_num = resp.dctn after the RTR modify). Requests to a DCT not in RTR are
    // dropped, so the early reservation is invisible on the wire.
    context->qpn = 0x100 + core_->next_handle++;
    const std::uint32_t handle = context->qpn;
    std::shared_ptr<DcTarget> target(new DcTarget(domain, std::move(init), handle));
    target->core_ = core_.get();
    core_->queue_pairs[handle] = std::move(context);
    return target;
}

DcTarget::~DcTarget() {
    std::lock_guard lock(core_->mutex);
    core_->published_table.unpublish_queue_pair(handle_);
    core_->queue_pairs.erase(handle_);
}

QueuePairState DcTarget::state() const {
    std::lock_guard lock(core_->mutex);
    return core_->queue_pairs.at(handle_)->state;
}

void DcTarget::modify_to_init(std::uint8_t port_num) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(handle_);
    const std::string call = "modify_qp(DCT created as handle " + std::to_string(handle_) + ")";
    check_transition(
        call, context.state, "INIT",
        context.state == QueuePairState::reset || context.state == QueuePairState::init);
    if (port_num != 1)
        fail(call + " to INIT: port_num = " + std::to_string(port_num) +
             ", the software device has port 1 only");
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::init));
    context.state = QueuePairState::init;
}

void DcTarget::modify_to_ready_to_receive(const DcTargetReadyAttributes& attributes) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(handle_);
    const std::string call = "modify_qp(DCT created as handle " + std::to_string(handle_) + ")";
    // A DCT has no RTS: RTR is where it stays.
    check_transition(call, context.state, "RTR", context.state == QueuePairState::init);
    check_mtu(call + " to RTR", attributes.path_mtu_bytes);
    check_range(call + " to RTR", "min_rnr_timer", attributes.min_rnr_timer, 0, 31);
    context.receive_attributes = {};
    context.receive_attributes.path_mtu_bytes = attributes.path_mtu_bytes;
    context.receive_attributes.min_rnr_timer = attributes.min_rnr_timer;
    flight::record(flight::SoftEvent::qp_state, context.qpn, static_cast<std::uint64_t>(context.state),
                  static_cast<std::uint64_t>(QueuePairState::ready_to_receive));
    context.state = QueuePairState::ready_to_receive;
    // Same-host DCIs write to it and read from it zero-hop from now on (zero_hop.cpp).
    core_->published_table.publish_queue_pair(context);
}

std::uint32_t DcTarget::dctn() const {
    std::lock_guard lock(core_->mutex);
    const QueuePairContext& context = *core_->queue_pairs.at(handle_);
    if (context.state != QueuePairState::ready_to_receive) {
        fail("DcTarget::dctn(DCT created as handle " + std::to_string(handle_) +
             "): the DCT is in " + to_string(context.state) +
             "; its number exists only after the move to RTR");
    }
    return context.qpn;
}

std::uint32_t DcTarget::key_violations() const {
    std::lock_guard lock(core_->mutex);
    return core_->queue_pairs.at(handle_)->dc_key_violations;
}

}  // namespace rdmachan::soft
