// CQE writing (completion_writer.hpp).
#include "transport/soft/completion_writer.hpp"

#include <cstring>
#include <vector>

#include "common/logger.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device_core.hpp"
#include "transport/soft/flight_events.hpp"

namespace rdmachan::soft {

using namespace rdmachan::mlx5;

CompletionWriter::CompletionWriter(const Device& owner, DeviceStatistics& statistics, PublishedTable& table,
                                   const bool& receive_lock_held)
    : owner_(owner), statistics_(statistics), table_(table), receive_lock_held_(receive_lock_held) {}

bool CompletionWriter::peers_may_write(const CompletionQueueContext& cq) const {
    return cq.peer_writable && transport_mode_ != TransportMode::tcp;
}

bool CompletionWriter::begin_turn() {
    const bool opens = !held_.turn_open();
    if (opens) held_.begin_turn();
    return opens;
}

void CompletionWriter::end_turn(bool began) {
    if (!began) return;
    write_held();
    held_.end_turn();
}

std::uint8_t* CompletionWriter::claim(CompletionQueueContext& cq) {
    const CompletionRingView ring = cq.view();
    if (ring.full()) {
        if (!cq.overrun.exchange(true)) {
            detail::logger().error("software device {}: CQ {} overrun: the consumer is {} entries behind; CQE dropped",
                                   owner_.name(), cq.ring.cqn, cq.ring.cqe_count);
        }
        return nullptr;
    }
    return ring.claim();
}

void CompletionWriter::publish(CompletionQueueContext& cq, std::uint8_t* cqe64, std::uint8_t cqe_opcode, bool solicited,
                             std::uint8_t format) {
    cq.view().publish(cqe64, cqe_opcode, solicited, format);
}

std::uint8_t* CompletionWriter::begin(CompletionQueueContext& cq, std::uint8_t cqe_opcode, bool solicited, bool& held,
                                    bool may_hold) {
    held = held_.turn_open() && cq.compressed && !peers_may_write(cq);
    if (held && !may_hold) {
        // Written at once (a CQE with data is never held): what is held goes first, in order.
        write_held();
        held = false;
    }
    if (!held) return claim(cq);
    if (held_.full()) write_held();
    return held_.add(cq, cqe_opcode, solicited).cqe;
}

void CompletionWriter::finish(CompletionQueueContext& cq, std::uint8_t* cqe64, std::uint8_t cqe_opcode, bool solicited, bool held,
                            std::uint8_t format) {
    if (!held) publish(cq, cqe64, cqe_opcode, solicited, format);
}

bool CompletionWriter::fits_in_cqe(const CompletionQueueContext& cq, std::uint32_t length) {
    return length <= (cq.ring.cqe_size >= 2 * kCqeSize64 ? 2 * kInlineScatterBytes : kInlineScatterBytes);
}

std::uint8_t CompletionWriter::place_in_cqe(const CompletionQueueContext& cq, std::uint8_t* cqe64, const std::uint8_t* data,
                                      std::uint32_t length) {
    if (cq.ring.cqe_size >= 2 * kCqeSize64) {
        std::memcpy(cqe64 - kCqeSize64, data, length);
        return kCqeFormatInlineScatter64;
    }
    std::memcpy(cqe64, data, length);
    return kCqeFormatInlineScatter32;
}

void CompletionWriter::write_held() {
    const std::vector<HeldCompletion>& held = held_.held();
    const auto count = static_cast<std::uint32_t>(held.size());
    for (std::uint32_t at = 0; at < count;) {
        const HeldCompletion& first = held[at];
        CompletionQueueContext& cq = *first.cq;
        std::uint32_t length = HeldCompletions::session_length(&first, count - at);
        if (length >= 2 && !peers_may_write(cq) && cq.view().has_room(length)) {
            write_session(cq.view(), &first, length);
            DeviceStatistics::count_one(statistics_.compressed_sessions);
            statistics_.compressed_cqes.store(statistics_.compressed_cqes.load(std::memory_order_relaxed) + length, std::memory_order_relaxed);
            at += length;
            continue;
        }
        // Plain, one by one (a ring without room for the session overruns at the CQE that does
        // not fit, as it would have uncompressed).
        length = 1;
        const PublishedTable::ReceiveGuard guard(table_, cq.peer_writable && !receive_lock_held_);
        if (std::uint8_t* cqe = claim(cq); cqe != nullptr) {
            std::memcpy(cqe, first.cqe, kCqeOpOwn);
            publish(cq, cqe, first.cqe_opcode, first.solicited);
        }
        at += length;
    }
    held_.clear();
}

void CompletionWriter::write_requester(CompletionQueueContext& cq, const QueuePairContext& queue_pair, std::uint16_t wqe_counter,
                                     std::uint8_t wqe_opcode, std::uint32_t byte_count, const std::uint8_t* inline_data) {
    flight::record(flight::SoftEvent::completion, queue_pair.qpn, wqe_counter, wqe_opcode, 0, 0);
    const PublishedTable::ReceiveGuard guard(table_, cq.peer_writable && !receive_lock_held_);
    bool held = false;
    std::uint8_t* cqe = begin(cq, kCqeRequester, false, held, inline_data == nullptr);
    if (cqe == nullptr) return;
    store_big32(cqe + kCqeSrqnUserIndex, queue_pair.user_index & 0xffffff);
    store_big32(cqe + kCqeByteCount, byte_count);
    store_big32(cqe + kCqeSopDropQpn, static_cast<std::uint32_t>(wqe_opcode) << 24 | queue_pair.qpn);
    store_big16(cqe + kCqeWqeCounter, wqe_counter);
    const std::uint8_t format = inline_data != nullptr ? place_in_cqe(cq, cqe, inline_data, byte_count) : 0;
    finish(cq, cqe, kCqeRequester, false, held, format);
}

void CompletionWriter::write_error(CompletionQueueContext& cq, const QueuePairContext& queue_pair, bool requester,
                                 std::uint16_t wqe_counter, std::uint8_t wqe_opcode, std::uint8_t syndrome) {
    flight::record(flight::SoftEvent::completion, queue_pair.qpn, wqe_counter, wqe_opcode, syndrome, requester ? 0 : 1);
    const PublishedTable::ReceiveGuard guard(table_, cq.peer_writable && !receive_lock_held_);
    const std::uint8_t cqe_opcode = requester ? kCqeRequesterError : kCqeResponderError;
    bool held = false;
    std::uint8_t* cqe = begin(cq, cqe_opcode, false, held);
    if (cqe == nullptr) return;
    store_big32(cqe + kCqeSrqnUserIndex, queue_pair.user_index & 0xffffff);
    cqe[kCqeVendorSyndrome] = 0;  // no vendor detail: the software device has no firmware
    cqe[kCqeSyndrome] = syndrome;
    store_big32(cqe + kCqeSopDropQpn, (requester ? static_cast<std::uint32_t>(wqe_opcode) << 24 : 0u) | queue_pair.qpn);
    store_big16(cqe + kCqeWqeCounter, wqe_counter);
    finish(cq, cqe, cqe_opcode, false, held);
}

void CompletionWriter::write_responder(CompletionQueueContext& cq, const QueuePairContext& queue_pair, std::uint8_t cqe_opcode,
                                     std::uint16_t wqe_counter, std::uint32_t byte_count, std::uint32_t immediate,
                                     std::uint32_t source_qpn, std::uint16_t source_lid, bool global_route, bool solicited,
                                     const std::uint8_t* inline_data) {
    flight::record(flight::SoftEvent::completion, queue_pair.qpn, wqe_counter, cqe_opcode, 0, 1);
    const PublishedTable::ReceiveGuard guard(table_, cq.peer_writable && !receive_lock_held_);
    bool held = false;
    std::uint8_t* cqe = begin(cq, cqe_opcode, solicited, held, inline_data == nullptr);
    if (cqe == nullptr) return;
    fill_responder_cqe(cqe, {cqe_opcode, wqe_counter, byte_count, immediate, source_qpn, source_lid, global_route,
                             queue_pair.user_index, queue_pair.qpn, solicited});
    // In a 64-byte CQE the data takes the first 32 bytes, the source LID and QP among them, as
    // on a ConnectX (an RC receive's source is its connection's).
    const std::uint8_t format = inline_data != nullptr ? place_in_cqe(cq, cqe, inline_data, byte_count) : 0;
    finish(cq, cqe, cqe_opcode, solicited, held, format);
}

}  // namespace rdmachan::soft
