// Queue pairs of the software device: the mlx5 send and receive rings, the QP state machine
// (RESET, INIT, RTR, RTS, ERR, as the kernel checks the transitions), and the send doorbell.
#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "transport/soft/flight_events.hpp"
#include "transport/soft/object_creation.hpp"

namespace rdmachan::soft {

std::shared_ptr<QueuePair> Device::create_queue_pair(
    const std::shared_ptr<ProtectionDomain>& domain, QueuePairInit init) {
    const QueuePairCapabilities& capabilities = init.capabilities;
    creation::check_range("create_queue_pair", "max_send_wr", capabilities.max_send_wr, 1,
                          creation::kMaxQueueEntries);
    creation::check_range("create_queue_pair", "max_send_sge", capabilities.max_send_sge, 1,
                          creation::kMaxScatterGatherElements);
    creation::check_range("create_queue_pair", "max_inline_data", capabilities.max_inline_data, 0,
                          creation::kMaxInlineData);
    if (init.srq == nullptr) {
        creation::check_range("create_queue_pair", "max_recv_wr", capabilities.max_recv_wr, 1,
                              creation::kMaxQueueEntries);
        creation::check_range("create_queue_pair", "max_recv_sge", capabilities.max_recv_sge, 1,
                              creation::kMaxScatterGatherElements);
    }
    if (init.send_cq == nullptr || init.recv_cq == nullptr)
        creation::fail("create_queue_pair: send_cq and recv_cq are required");
    if (init.send_cq->ring().buffer == nullptr)
        creation::fail("create_queue_pair: send_cq has no ring");

    // Send WQE size: ctrl + remote address + atomic + the larger of the SGEs and the inline data.
    const std::uint32_t data_bytes = std::max(
        16 * capabilities.max_send_sge, capabilities.max_inline_data == 0
                                            ? 0u
                                            : ((capabilities.max_inline_data + 4 + 15) / 16) * 16);
    const std::uint32_t wqe_bytes = 48 + data_bytes;
    const std::uint32_t wqebbs_per_wqe = (wqe_bytes + 63) / 64;
    const std::uint32_t send_wqe_count =
        creation::round_up_power_of_two(capabilities.max_send_wr * wqebbs_per_wqe);
    std::uint32_t receive_stride = 0;
    std::uint32_t receive_count = 0;
    if (init.srq == nullptr) {
        receive_stride =
            creation::round_up_power_of_two(16 * std::max(capabilities.max_recv_sge, 1u));
        receive_count =
            std::max(creation::round_up_power_of_two(capabilities.max_recv_wr) * receive_stride,
                     64u) /
            receive_stride;
    }

    auto context = std::make_unique<QueuePairContext>();
    const std::size_t receive_bytes = static_cast<std::size_t>(receive_count) * receive_stride;
    const std::size_t ring_bytes = receive_bytes + static_cast<std::size_t>(send_wqe_count) * 64;
    context->buffer =
        std::make_unique<AlignedBuffer>(ring_bytes + creation::kDoorbellBlockBytes, core_->arena);
    auto* doorbell_record = reinterpret_cast<std::uint32_t*>(context->buffer->data + ring_bytes);
    context->blueflame = std::make_unique<AlignedBuffer>(2 * creation::kBlueFlameSize);
    context->protection_domain = domain->handle();
    context->user_index = init.user_index;
    context->scatter_to_cqe = init.scatter_to_cqe;
    context->receive_ring = {receive_count != 0 ? context->buffer->data : nullptr, receive_count,
                             receive_stride, doorbell_record};

    std::lock_guard lock(core_->mutex);
    creation::publish_ring_memory(*core_);
    context->send_cq = core_->completion_queues.at(init.send_cq->cqn()).get();
    context->recv_cq = core_->completion_queues.at(init.recv_cq->cqn()).get();
    if (init.srq != nullptr) context->srq = core_->shared_receive_queues.at(init.srq->srqn()).get();
    // QP numbers are 24 bits; start above the low numbers the other objects use.
    context->qpn = 0x100 + core_->next_handle++;
    context->send_ring = {context->buffer->data + receive_bytes,
                          send_wqe_count,
                          context->qpn,
                          doorbell_record,
                          context->blueflame->data,
                          creation::kBlueFlameSize};
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
        creation::fail("modify_qp(QP " + std::to_string(context.qpn) +
                       "): " + to_string(context.state) + " -> INIT is not a valid transition");
    }
    if (port_num != 1)
        creation::fail("modify_qp(QP " + std::to_string(context.qpn) + ") to INIT: port_num = " +
                       std::to_string(port_num) + ", the software device has port 1 only");
    context.access = access_flags;
    flight::record(flight::SoftEvent::qp_state, context.qpn,
                   static_cast<std::uint64_t>(context.state),
                   static_cast<std::uint64_t>(QueuePairState::init));
    context.state = QueuePairState::init;
    core_->published_table.publish_queue_pair(context);
}

void QueuePair::modify_to_ready_to_receive(const ReadyToReceiveAttributes& attributes) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    if (context.state != QueuePairState::init) {
        creation::fail("modify_qp(QP " + std::to_string(context.qpn) +
                       "): " + to_string(context.state) + " -> RTR is not a valid transition");
    }
    creation::check_range("modify_qp to RTR", "remote qpn", attributes.remote.qpn, 1, 0xffffff);
    creation::check_range("modify_qp to RTR", "rq_psn", attributes.rq_psn, 0, 0xffffff);
    creation::check_range("modify_qp to RTR", "min_rnr_timer", attributes.min_rnr_timer, 0, 31);
    const std::uint32_t mtu = attributes.path_mtu_bytes;
    if (mtu != 256 && mtu != 512 && mtu != 1024 && mtu != 2048 && mtu != 4096) {
        creation::fail("modify_qp(QP " + std::to_string(context.qpn) +
                       ") to RTR: path_mtu = " + std::to_string(mtu) + " bytes is not an IB MTU");
    }
    context.receive_attributes = attributes;
    context.expected_psn = attributes.rq_psn;
    flight::record(flight::SoftEvent::qp_state, context.qpn,
                   static_cast<std::uint64_t>(context.state),
                   static_cast<std::uint64_t>(QueuePairState::ready_to_receive));
    context.state = QueuePairState::ready_to_receive;
    core_->published_table.publish_queue_pair(context);
}

void QueuePair::modify_to_ready_to_send(const ReadyToSendAttributes& attributes) {
    std::lock_guard lock(core_->mutex);
    QueuePairContext& context = *core_->queue_pairs.at(send_ring_.qpn);
    if (context.state != QueuePairState::ready_to_receive &&
        context.state != QueuePairState::ready_to_send) {
        creation::fail("modify_qp(QP " + std::to_string(context.qpn) +
                       "): " + to_string(context.state) + " -> RTS is not a valid transition");
    }
    creation::check_range("modify_qp to RTS", "sq_psn", attributes.sq_psn, 0, 0xffffff);
    creation::check_range("modify_qp to RTS", "timeout", attributes.timeout, 0, 31);
    creation::check_range("modify_qp to RTS", "retry_cnt", attributes.retry_cnt, 0, 7);
    creation::check_range("modify_qp to RTS", "rnr_retry", attributes.rnr_retry, 0, 7);
    context.send_attributes = attributes;
    context.next_psn = attributes.sq_psn;
    context.rnr_retries_left = attributes.rnr_retry;
    flight::record(flight::SoftEvent::qp_state, context.qpn,
                   static_cast<std::uint64_t>(context.state),
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
    flight::record(flight::SoftEvent::qp_state, context.qpn,
                   static_cast<std::uint64_t>(context.state),
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
    __atomic_store_n(&context.send_ring.doorbell_record[mlx5::kReceiveDoorbell], 0u,
                     __ATOMIC_RELEASE);
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
