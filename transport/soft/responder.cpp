// The responder side of the software device: checks a request against the target QP and the
// memory it names, performs it, consumes receive WQEs, and answers with ACK, RNR NAK or NAK.
// The target process never calls in: this runs on its device's progress thread.
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>
#include <utility>
#include <vector>

#include "transport/soft/flight_events.hpp"
#include "common/logger.hpp"
#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/atomic_word.hpp"
#include "transport/soft/answers.hpp"
#include "transport/soft/completion_writer.hpp"
#include "transport/soft/connection.hpp"
#include "transport/soft/device_statistics.hpp"
#include "transport/soft/gid.hpp"
#include "transport/soft/memory_translation.hpp"
#include "transport/soft/published_table.hpp"
#include "transport/soft/responder.hpp"
#include "transport/soft/receive_segments.hpp"
#include "transport/soft/dma_copy.hpp"

namespace rdmachan::soft {
namespace {

using namespace rdmachan::mlx5;

wire::Response answer(const wire::Request& request, wire::ResponseKind kind, std::uint8_t syndrome = 0, std::uint8_t rnr_timer = 0) {
    return wire::Response{request.source_qpn, request.psn, kind, syndrome, rnr_timer};
}

// Marks the receive lock as held by this thread for as long as it lives (perform_request); nested,
// the outer mark stays.
struct ReceiveLockHeld {
    bool& held;
    bool before;
    explicit ReceiveLockHeld(bool& flag) : held(flag), before(flag) { held = true; }
    ~ReceiveLockHeld() { held = before; }
    ReceiveLockHeld(const ReceiveLockHeld&) = delete;
    ReceiveLockHeld& operator=(const ReceiveLockHeld&) = delete;
};

// hold_responder_completions(): how long the responder stops between its answer and its CQE.
std::atomic<std::int64_t> answer_hold_microseconds{0};
std::atomic<int> answer_hold_descriptor{-1};

}  // namespace

void hold_responder_completions(std::chrono::microseconds delay, int reached_descriptor) noexcept {
    answer_hold_descriptor.store(reached_descriptor, std::memory_order_relaxed);
    answer_hold_microseconds.store(delay.count(), std::memory_order_relaxed);
}

// A request that consumes a receive is answered before its CQE is written. A NIC's ACK leaves
// whatever the process does next; this device's answer is sent by a thread of the process, so
// with the CQE first an application that sees it and exits at once (its last message arrived)
// would take the answer with it, and the sender would report transport retry exceeded for a
// message that arrived. Hardware gives no order between the responder's CQE and the requester's
// completion, so this order is one a ConnectX may show too. What the request wrote into memory is
// released before the answer leaves (respond).
void Responder::hold_before_completion() {
    const std::int64_t delay = answer_hold_microseconds.load(std::memory_order_relaxed);
    if (delay == 0) [[likely]]
        return;
    // Says it is there before it waits, so a test kills the process here and not on its way.
    if (const int descriptor = answer_hold_descriptor.load(std::memory_order_relaxed); descriptor >= 0) {
        const char reached = 'h';
        (void)!::write(descriptor, &reached, 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay));
}

bool Responder::peek_receive(QueuePairContext& queue_pair, ReceiveBuffer& buffer) {
    const std::uint8_t* wqe = nullptr;
    std::uint32_t segments = 0;
    if (queue_pair.srq != nullptr) {
        SharedReceiveQueueContext& srq = *queue_pair.srq;
        const std::uint16_t posted = static_cast<std::uint16_t>(big_to_host32(load_acquire32(srq.ring.doorbell_record)));
        const std::uint32_t consumption = srq.consumption();
        if (posted == static_cast<std::uint16_t>(consumption)) return false;
        const std::uint32_t next_index = consumption >> 16;
        wqe = srq.ring.buffer + static_cast<std::size_t>(next_index) * srq.ring.stride + kSrqNextSegmentSize;
        segments = (srq.ring.stride - kSrqNextSegmentSize) / kDataSegmentSize;
        buffer.wqe_counter = static_cast<std::uint16_t>(next_index);
    } else {
        const ReceiveQueueRing& ring = queue_pair.receive_ring;
        if (ring.wqe_count == 0) return false;
        const std::uint32_t posted = big_to_host32(load_acquire32(ring.doorbell_record + kReceiveDoorbell)) & 0xffff;
        const std::uint32_t consumed = queue_pair.receive_consumed();
        if (((posted - consumed) & 0xffff) == 0) return false;
        wqe = ring.buffer + static_cast<std::size_t>(consumed & (ring.wqe_count - 1)) * ring.stride;
        segments = ring.stride / kDataSegmentSize;
        buffer.wqe_counter = static_cast<std::uint16_t>(consumed);
    }
    buffer.valid = true;
    const std::uint32_t protection_domain = queue_pair.srq != nullptr ? queue_pair.srq->protection_domain : queue_pair.protection_domain;
    for_each_receive_segment(wqe, segments, [&](std::uint32_t lkey, std::uint64_t addr, std::uint32_t length) {
        const std::size_t before = buffer.segments.size();
        if (!translation_.translate(lkey, protection_domain, addr, length, kLocalWrite, buffer.segments)) {
            buffer.protection_error = true;
            return false;
        }
        if (!MemoryTranslation::translated_as_posted(buffer.segments, before, addr, length)) buffer.segments_as_posted = false;
        buffer.capacity += length;
        return true;
    });
    return true;
}

void Responder::consume_receive(QueuePairContext& queue_pair) {
    if (queue_pair.srq != nullptr) {
        SharedReceiveQueueContext& srq = *queue_pair.srq;
        // The next WQE is wherever this one's link points now (mlx5_wqe_srq_next_seg).
        const std::uint32_t consumption = srq.consumption();
        const std::uint8_t* wqe = srq.ring.buffer + static_cast<std::size_t>(consumption >> 16) * srq.ring.stride;
        srq.set_consumption(load_big16(wqe + kSrqNextWqeIndex) & (srq.ring.wqe_count - 1),
                            static_cast<std::uint16_t>(consumption + 1));
        return;
    }
    // No peer consumes it meanwhile: a zero-hop receive needs nothing in flight on its QP, and
    // this request is in flight until answered.
    queue_pair.set_receive_consumed(queue_pair.receive_consumed() + 1);
}

void Responder::handle_request(Connection& connection, const wire::Request& request, const std::uint8_t* payload,
                                std::uint32_t payload_length) {
    auto found = queue_pairs_.find(request.destination_qpn);
    // A request for a QP that does not exist, is not ready, or is connected elsewhere is dropped,
    // as hardware drops such packets; the initiator's transport timeout reports it.
    if (found == queue_pairs_.end()) {
        flight::record(flight::SoftEvent::request_dropped, request.destination_qpn, request.psn, 0, 0, flight::text("no such QP"));
        return;
    }
    QueuePairContext& queue_pair = *found->second;
    // DC requests address DCTs and RC requests RC QPs; a packet of the other transport is dropped.
    const bool dc_request = (request.dc_flags & wire::kDcRequest) != 0;
    if (dc_request != (queue_pair.transport == Transport::dc_target)) {
        flight::record(flight::SoftEvent::request_dropped, queue_pair.qpn, request.psn, queue_pair.expected_psn,
                       static_cast<std::uint64_t>(queue_pair.state), flight::text("wrong transport"));
        return;
    }
    if (dc_request) {
        handle_dc_request(connection, queue_pair, request, payload, payload_length);
        return;
    }
    if (queue_pair.transport != Transport::reliable_connected) return;
    const RemoteQueuePair& peer = queue_pair.receive_attributes.remote;
    if ((queue_pair.state != QueuePairState::ready_to_receive && queue_pair.state != QueuePairState::ready_to_send) ||
        peer.qpn != request.source_qpn || !same_gid(peer.gid, connection.gid) || peer.lid != connection.lid) {
        flight::record(flight::SoftEvent::request_dropped, queue_pair.qpn, request.psn, queue_pair.expected_psn,
                       static_cast<std::uint64_t>(queue_pair.state), flight::text("QP not ready or connected elsewhere"));
        detail::logger().debug("QP {}: request psn {} from QP {} dropped: not ready or connected elsewhere", queue_pair.qpn,
                               request.psn, request.source_qpn);
        return;
    }
    if (request.psn != queue_pair.expected_psn) {
        flight::record(flight::SoftEvent::request_dropped, queue_pair.qpn, request.psn, queue_pair.expected_psn,
                       static_cast<std::uint64_t>(queue_pair.state), flight::text("PSN out of sequence"));
        detail::logger().debug("QP {}: request psn {} dropped: {} expected", queue_pair.qpn, request.psn, queue_pair.expected_psn);
        return;  // out of sequence after a NAK, or a copy of one executed: the initiator resends
    }
    perform_request(connection, queue_pair, request, payload, payload_length, queue_pair.expected_psn);
}

void Responder::perform_request(Connection& connection, QueuePairContext& queue_pair, const wire::Request& request,
                                 const std::uint8_t* payload, std::uint32_t payload_length, std::uint32_t& expected_psn) {
    // Whatever this request writes into the process's memory is released here, on every way out.
    const struct Released {
        ~Released() { note_remote_access(); }
    } released;
    const bool carries_payload = request.opcode == kOpcodeRdmaWrite || request.opcode == kOpcodeRdmaWriteImmediate ||
                                 request.opcode == kOpcodeSend || request.opcode == kOpcodeSendImmediate ||
                                 request.opcode == kOpcodeSendInvalidate;
    // Same host: the payload names the initiator's memory, moved only after the checks below.
    const bool by_reference = request.by_reference != 0;
    iovec initiator_memory[wire::kMaxSegments];
    std::size_t initiator_segments = 0;
    if (by_reference) {
        if (!connection.by_reference || (!carries_payload && request.opcode != kOpcodeRdmaRead)) return;  // not agreed: dropped
        if (payload_length == 0 || payload_length % sizeof(wire::Segment) != 0 ||
            payload_length / sizeof(wire::Segment) > wire::kMaxSegments) {
            return;  // malformed: dropped
        }
        std::uint64_t total = 0;
        initiator_segments = payload_length / sizeof(wire::Segment);
        for (std::size_t i = 0; i < initiator_segments; ++i) {
            wire::Segment segment;
            std::memcpy(&segment, payload + i * sizeof segment, sizeof segment);
            initiator_memory[i] = {reinterpret_cast<void*>(segment.address), static_cast<std::size_t>(segment.length)};
            total += segment.length;
        }
        if (total != request.length) return;  // malformed: dropped
    } else if (carries_payload && payload_length != request.length) {
        return;  // malformed: dropped
    }

    // A DCT serves many initiators: a responder error is reported on its CQ and to the one
    // initiator, but does not take the DCT down (hardware raises an async event instead).
    const bool shared_target = queue_pair.transport == Transport::dc_target;
    const bool global_route = (request.dc_flags & wire::kDcGlobalRoute) != 0;
    auto accept = [&] { expected_psn = (expected_psn + 1) & 0xffffff; };
    auto performed = [&](std::uint8_t syndrome) {
        flight::record(flight::SoftEvent::request_performed, queue_pair.qpn, request.psn, request.opcode, request.rkey, syndrome);
    };
    auto refuse = [&](std::uint8_t syndrome) {
        performed(syndrome);
        accept();
        answers_.respond(connection, answer(request, wire::ResponseKind::negative, syndrome));
    };
    // A request that consumed a receive: answered, then its CQE written (write_cqe), in that order
    // (hold_before_responder_completion says why). The answer lets the initiator's next send go
    // zero-hop, which writes its CQE into this CQ itself: the receive lock is held from before the
    // answer until this CQE is in, so that one cannot come first (the CQE writers do not take the
    // lock again meanwhile).
    auto answer_then_complete = [&](const wire::Response& response, auto&& write_cqe) {
        const PublishedTable::ReceiveGuard guard(published_table_, queue_pair.recv_cq->peer_writable && !receive_lock_held_);
        const ReceiveLockHeld held(receive_lock_held_);
        answers_.respond(connection, response);
        hold_before_completion();
        write_cqe();
    };
    // An SRQ that same-host DC initiators consume too (published through a DCT): the receive lock
    // is held from before its WQE is read until its CQE is in, so that no peer takes the same WQE.
    std::optional<PublishedTable::ReceiveGuard> shared_queue_guard;
    std::optional<ReceiveLockHeld> shared_queue_held;
    auto lock_shared_receive_queue = [&] {
        if (queue_pair.srq == nullptr || !queue_pair.srq->peer_consumable) return;
        shared_queue_guard.emplace(published_table_);
        shared_queue_held.emplace(receive_lock_held_);
    };
    // A consumed receive the message cannot fill: a NAK to the initiator, then the receive's
    // error CQE.
    auto refuse_then_complete = [&](std::uint8_t syndrome, std::uint16_t wqe_counter, std::uint8_t local_syndrome) {
        performed(syndrome);
        accept();
        answer_then_complete(answer(request, wire::ResponseKind::negative, syndrome), [&] {
            completions_.write_error(*queue_pair.recv_cq, queue_pair, false, wqe_counter, 0, local_syndrome);
        });
    };
    auto not_ready = [&] {
        flight::record(flight::SoftEvent::rnr_nak_sent, queue_pair.qpn, request.psn, request.source_qpn,
                       queue_pair.receive_attributes.min_rnr_timer);
        answers_.respond(connection, answer(request, wire::ResponseKind::receiver_not_ready, 0, queue_pair.receive_attributes.min_rnr_timer));
    };
    auto responder_error = [&](const char* why) {
        if (!shared_target) failures_.move_to_error(queue_pair, why);
        else detail::logger().info("software device {}: DCT {}: {}", owner_.name(), queue_pair.qpn, why);
    };
    // The pieces of host memory the request names (one, or an indirect key's), or false.
    MemorySegments pieces;
    auto remote_memory = [&](std::uint32_t length, std::uint32_t access) -> bool {
        if ((queue_pair.access & access) != access) return false;
        return translation_.translate(request.rkey, queue_pair.protection_domain, request.remote_addr, length, access, pieces);
    };

    // Moves the payload between this process's `local` vectors and the initiator's memory. A
    // failure means the initiator's own memory went away under its request (the checks on ours
    // passed): it completes as a local protection error, as its NIC would report it.
    auto move_by_reference = [&](const iovec* local, std::size_t local_count, bool into_initiator) {
        const int error = into_initiator
                              ? write_to_peer(connection.peer_process, local, local_count, initiator_memory, initiator_segments, request.length)
                              : read_from_peer(connection.peer_process, local, local_count, initiator_memory, initiator_segments, request.length);
        if (error != 0) {
            if (!std::exchange(connection.move_failure_logged, true)) {
                detail::logger().warn("software device {}: QP {}: cross-memory attach with process {} failed: {} (said once per connection)",
                                      owner_.name(), queue_pair.qpn, connection.peer_process.pid(), std::strerror(error));
            }
            refuse(kSyndromeLocalProtection);
            return false;
        }
        statistics_.transfers_by_reference.fetch_add(1, std::memory_order_relaxed);
        return true;
    };
    // The same for memory in more pieces than one cross-memory call takes (an indirect key's
    // layout): through one bounce buffer, scattered or gathered here.
    auto move_pieces_by_reference = [&](const MemorySegments& local_pieces, bool into_initiator) {
        if (local_pieces.size() <= wire::kMaxSegments) {
            iovec local[wire::kMaxSegments];
            for (std::size_t i = 0; i < local_pieces.size(); ++i) local[i] = {local_pieces[i].first, local_pieces[i].second};
            return move_by_reference(local, local_pieces.size(), into_initiator);
        }
        std::vector<std::uint8_t> bounce(request.length);
        std::uint32_t offset = 0;
        if (into_initiator) {
            for (auto [piece, piece_length] : local_pieces) {
                dma_copy(bounce.data() + offset, piece, piece_length);
                offset += piece_length;
            }
        }
        const iovec local{bounce.data(), request.length};
        if (!move_by_reference(&local, 1, into_initiator)) return false;
        if (!into_initiator) {
            for (auto [piece, piece_length] : local_pieces) {
                if (offset == request.length) break;
                const std::uint32_t chunk = std::min(piece_length, request.length - offset);
                dma_copy(piece, bounce.data() + offset, chunk);
                offset += chunk;
            }
        }
        return true;
    };

    switch (request.opcode) {
        case kOpcodeRdmaWrite:
        case kOpcodeRdmaWriteImmediate: {
            ReceiveBuffer receive;
            if (request.opcode == kOpcodeRdmaWriteImmediate) lock_shared_receive_queue();
            if (request.opcode == kOpcodeRdmaWriteImmediate && !peek_receive(queue_pair, receive)) {
                not_ready();
                return;
            }
            if (request.length != 0 && !remote_memory(request.length, kRemoteWrite)) {
                refuse(kSyndromeRemoteAccess);  // target memory untouched
                return;
            }
            if (by_reference) {
                // The pieces the key maps the write to (one for a region).
                if (!move_pieces_by_reference(pieces, false)) return;
            } else {
                std::uint32_t written = 0;
                for (auto [piece, piece_length] : pieces) {
                    dma_copy(piece, payload + written, piece_length);
                    written += piece_length;
                }
            }
            performed(0);
            accept();
            if (request.opcode != kOpcodeRdmaWriteImmediate) {
                answers_.respond_coalescing(connection, answer(request, wire::ResponseKind::ack));
                return;
            }
            consume_receive(queue_pair);
            answer_then_complete(answer(request, wire::ResponseKind::ack), [&] {
                completions_.write_responder(*queue_pair.recv_cq, queue_pair, kCqeResponderWriteImmediate, receive.wqe_counter,
                                    request.length, request.immediate, request.source_qpn, connection.lid, global_route,
                                    request.solicited != 0);
            });
            return;
        }
        case kOpcodeSend:
        case kOpcodeSendImmediate: {
            ReceiveBuffer receive;
            lock_shared_receive_queue();
            if (!peek_receive(queue_pair, receive)) {
                not_ready();
                return;
            }
            if (by_reference && !receive.protection_error && request.length <= receive.capacity) {
                // Before the receive is consumed: a failed move leaves the responder's queue as it was.
                MemorySegments used;  // the receive's pieces the message fills
                std::uint32_t placed = 0;
                for (auto [address, length] : receive.segments) {
                    if (placed == request.length) break;
                    const std::uint32_t chunk = std::min(length, request.length - placed);
                    used.emplace_back(address, chunk);
                    placed += chunk;
                }
                if (!move_pieces_by_reference(used, false)) return;
            }
            consume_receive(queue_pair);
            if (receive.protection_error) {
                refuse_then_complete(kSyndromeRemoteOperation, receive.wqe_counter, kSyndromeLocalProtection);
                responder_error("receive WQE names memory it may not write");
                return;
            }
            if (request.length > receive.capacity) {
                refuse_then_complete(kSyndromeRemoteInvalidRequest, receive.wqe_counter, kSyndromeLocalLength);
                responder_error("message longer than the receive WQE");
                return;
            }
            // Scatter-to-CQE: a small message carried in the frame goes into the CQE; the poller
            // copies it to the buffers the receive WQE names.
            const bool in_cqe = queue_pair.scatter_to_cqe && !by_reference && receive.segments_as_posted &&
                                CompletionWriter::fits_in_cqe(*queue_pair.recv_cq, request.length);
            std::uint32_t offset = by_reference || in_cqe ? request.length : 0;  // already placed, or not in memory
            for (auto [address, length] : receive.segments) {
                if (offset == request.length) break;
                const std::uint32_t chunk = std::min(length, request.length - offset);
                dma_copy(address, payload + offset, chunk);
                offset += chunk;
            }
            performed(0);
            accept();
            const std::uint8_t cqe_opcode = request.opcode == kOpcodeSendImmediate ? kCqeResponderSendImmediate : kCqeResponderSend;
            answer_then_complete(answer(request, wire::ResponseKind::ack), [&] {
                completions_.write_responder(*queue_pair.recv_cq, queue_pair, cqe_opcode, receive.wqe_counter, request.length,
                                    request.immediate, request.source_qpn, connection.lid, global_route, request.solicited != 0,
                                    in_cqe ? payload : nullptr);
            });
            return;
        }
        case kOpcodeRdmaRead: {
            if (request.length != 0 && !remote_memory(request.length, kRemoteRead)) {
                refuse(kSyndromeRemoteAccess);
                return;
            }
            performed(0);
            if (by_reference) {
                if (!move_pieces_by_reference(pieces, true)) return;
                accept();
                answers_.respond(connection, answer(request, wire::ResponseKind::ack));
                return;
            }
            accept();
            if (pieces.size() <= 1) {
                answers_.respond(connection, answer(request, wire::ResponseKind::ack), pieces.empty() ? nullptr : pieces[0].first,
                        request.length);
                return;
            }
            // An indirect key's pieces, gathered in the key's order.
            std::vector<std::uint8_t> gathered;
            gathered.reserve(request.length);
            for (auto [piece, piece_length] : pieces) gathered.insert(gathered.end(), piece, piece + piece_length);
            answers_.respond(connection, answer(request, wire::ResponseKind::ack), gathered.data(), request.length);
            return;
        }
        case kOpcodeAtomicCompareAndSwap:
        case kOpcodeAtomicFetchAndAdd: {
            if (request.remote_addr % 8 != 0) {
                refuse(kSyndromeRemoteInvalidRequest);
                return;
            }
            if (!remote_memory(8, kRemoteAtomic)) {
                refuse(kSyndromeRemoteAccess);
                return;
            }
            // Through an indirect key the word must still be one aligned piece of one region.
            if (pieces.size() != 1 || reinterpret_cast<std::uintptr_t>(pieces[0].first) % 8 != 0) {
                refuse(kSyndromeRemoteInvalidRequest);
                return;
            }
            std::uint8_t* target = pieces[0].first;
            // The 64-bit operand is in the responder's host byte order, and the operation is atomic
            // with respect to every other atomic the device performs on that word.
            auto* word = reinterpret_cast<std::uint64_t*>(target);
            const std::uint64_t original = perform_atomic(word, request, request.opcode == kOpcodeAtomicFetchAndAdd);
            performed(0);
            accept();
            answers_.respond(connection, answer(request, wire::ResponseKind::ack), &original, sizeof original);
            return;
        }
        case kOpcodeSendInvalidate:
            // The software device has no memory windows or fast-registered regions, the only keys an
            // invalidation may name: the request is refused as invalid, no receive is consumed.
            refuse(kSyndromeRemoteInvalidRequest);
            return;
        default:
            refuse(kSyndromeRemoteInvalidRequest);
            return;
    }
}

// CQE writing (completion_ring.hpp), under the receive lock once a same-host peer may write CQEs
// into the CQ too (zero_hop_receive.cpp; CompletionQueueContext::peer_writable).
}  // namespace rdmachan::soft
