// Zero-hop receives on the same-host path: a send, or an RDMA write with immediate,
// executed by the initiator's doorbell thread to the end. It consumes the target's receive WQE
// and writes the target's CQE itself, through its mapping of the target's arena, where the target
// keeps its RC queue pairs' receive queues and its CQs (published_table.hpp). As for zero-hop
// writes (zero_hop.cpp), no thread of either process is woken and no frame is sent; a target
// polling its CQ sees the completion as soon as it is written.
//
// Only when that is exactly what the request path would have done:
//   - everything zero_hop.cpp requires of the two QPs (nothing in flight, so RC ordering holds);
//   - a receive WQE is posted (else the request path answers RNR and retries);
//   - for a write, the key admits the range with remote write access, as zero-hop writes check;
//   - for a send, every piece of the receive WQE's scatter list is in one region of the target
//     QP's protection domain with local write access (what peek_receive checks; one key, because
//     one holder slot keeps one key from deregistration), and the message fits;
//   - the target's receive CQ has room (else the request path reports its overrun);
//   - the local bytes are in memory that cannot go away (the WQE's inline data or this device's
//     arena), and the target's in its arena: every move is a memcpy.
// Anything else, every failed check included, goes the request path unchanged, with nothing
// consumed: the responder then gives the NAK, the error CQEs and the state change it always gave.
//
// The bytes move before the receive lock is taken, the receive is consumed and the CQE written
// under it. The QP's state, re-read under the lock, decides: a QP that left RTR/RTS meanwhile
// (moved to ERR, flushed) gets no CQE and the request path carries the request, which the target
// then drops; the bytes it already holds are those a partly arrived message leaves in its memory,
// which verbs leaves undefined for a request that did not complete.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <optional>
#include <thread>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/completion_ring.hpp"
#include "transport/soft/device_core.hpp"
#include "transport/soft/receive_segments.hpp"
#include "transport/soft/dma_copy.hpp"

namespace rdmachan::soft {

using namespace rdmachan::mlx5;

namespace {

bool power_of_two(std::uint32_t value) { return value != 0 && (value & (value - 1)) == 0; }

// hold_zero_hop_receives(): where, and how long, each zero-hop receive stops under the lock.
std::atomic<ZeroHopReceiveStep> held_step{ZeroHopReceiveStep::none};
std::atomic<std::int64_t> held_microseconds{0};
std::atomic<int> held_descriptor{-1};

void hold_for_test(ZeroHopReceiveStep step) {
    if (held_step.load(std::memory_order_relaxed) != step) [[likely]]
        return;
    // Says it is there before it waits, so a test kills it at this step and not on its way.
    if (const int descriptor = held_descriptor.load(std::memory_order_relaxed); descriptor >= 0) {
        const char reached = 'h';
        (void)!::write(descriptor, &reached, 1);
    }
    std::this_thread::sleep_for(std::chrono::microseconds(held_microseconds.load(std::memory_order_relaxed)));
}

// The pieces a message fills, in order, and how many bytes they hold.
struct Destination {
    iovec pieces[wire::kMaxSegments];
    std::size_t count = 0;
    std::uint64_t capacity = 0;
};

// The bytes, in order, filling the destination's pieces from the first (they hold them all).
void fill(const Destination& destination, const iovec* local, std::size_t local_count) {
    std::size_t into = 0;
    std::size_t into_offset = 0;
    for (std::size_t i = 0; i < local_count; ++i) {
        const auto* source = static_cast<const std::uint8_t*>(local[i].iov_base);
        std::size_t left = local[i].iov_len;
        while (left != 0) {
            const std::size_t room = destination.pieces[into].iov_len - into_offset;
            const std::size_t chunk = left < room ? left : room;
            dma_copy(static_cast<std::uint8_t*>(destination.pieces[into].iov_base) + into_offset, source, chunk);
            source += chunk;
            left -= chunk;
            into_offset += chunk;
            if (into_offset == destination.pieces[into].iov_len) {
                ++into;
                into_offset = 0;
            }
        }
    }
}

// The target's CQE for a request that consumed its receive WQE `wqe_counter`, as the request
// path's responder writes it.
ResponderCompletion responder_completion(const wire::Request& request, std::uint32_t wqe_counter, std::uint64_t length,
                                         std::uint32_t initiator_qpn, std::uint16_t initiator_lid,
                                         const PublishedQueuePairView& target) {
    std::uint8_t cqe_opcode = kCqeResponderWriteImmediate;
    if (request.opcode == kOpcodeSend) cqe_opcode = kCqeResponderSend;
    if (request.opcode == kOpcodeSendImmediate) cqe_opcode = kCqeResponderSendImmediate;
    return {cqe_opcode, static_cast<std::uint16_t>(wqe_counter), static_cast<std::uint32_t>(length), request.immediate,
            initiator_qpn, initiator_lid, (request.dc_flags & wire::kDcGlobalRoute) != 0, target.user_index, target.qpn,
            request.solicited != 0};
}

// Under the target's receive lock, the bytes in place: the journal first (if this process dies
// before it is closed, the target finishes from it), then the consumption word from `before` to
// `after`, then the CQE, each step a place hold_zero_hop_receives can stop at.
void consume_and_complete(PeerTable& table, const PublishedQueuePairView& target, const CompletionRingView& receive_cq,
                          std::uint32_t* consumption_word, std::uint32_t before, std::uint32_t after,
                          const ResponderCompletion& completion) {
    table.receive_lock().begin_receive({before, receive_cq.producer_index(), target.receive_cqe_count, target.receive_cqe_size,
                         target.doorbell_offset, target.receive_cq_offset, target.receive_cq_doorbell_offset, completion});
    hold_for_test(ZeroHopReceiveStep::journal_written);
    __atomic_store_n(consumption_word, after, __ATOMIC_RELEASE);
    hold_for_test(ZeroHopReceiveStep::receive_consumed);
    std::uint8_t* cqe = receive_cq.claim();
    fill_responder_cqe(cqe, completion);
    receive_cq.make_visible(cqe, completion.cqe_opcode, completion.solicited);
    hold_for_test(ZeroHopReceiveStep::completion_visible);
    receive_cq.advance();
    receive_cq.raise_event(completion.cqe_opcode, completion.solicited);
    table.receive_lock().end_receive();
}

// A write with immediate's destination: the range its key names, checked as the responder checks
// it (remote write, the target's protection domain), in the target's arena. The key stays held in
// `use`. False: the request path carries it.
bool map_write_destination(PeerTable& table, const PublishedQueuePairView& target, const wire::Request& request,
                           std::uint64_t length, PeerTable::RegionUse& use, Destination& destination) {
    table.use_region(request.rkey, use);
    const std::optional<PublishedRegionView>& region = use.entry();
    if (!region || !zero_hop_region_admits(*region, target.protection_domain, kRemoteWrite, request.remote_addr, length)) {
        return false;
    }
    std::uint8_t* mapped = table.arena_range(region->arena_offset, region->length);
    if (mapped == nullptr) return false;
    destination.pieces[destination.count++] = {mapped + (request.remote_addr - region->addr), length};
    return true;
}

// The target's receive side as its entry publishes it, mapped from its arena: the receive queue
// (an RC QP's or a DCT's SRQ) of `stride`-byte WQEs, its doorbell block and the receive CQ.
struct ReceiveSide {
    const std::uint8_t* queue = nullptr;
    std::uint32_t* doorbell = nullptr;
    CompletionRingView cq;
};
std::optional<ReceiveSide> map_receive_side(PeerTable& table, const PublishedQueuePairView& target) {
    if (!power_of_two(target.receive_cqe_count) || (target.receive_cqe_size != 64 && target.receive_cqe_size != 128)) {
        return std::nullopt;
    }
    ReceiveSide side;
    side.queue = table.arena_range(target.receive_queue_offset,
                                   static_cast<std::uint64_t>(target.receive_wqe_count) * target.receive_stride);
    side.doorbell = reinterpret_cast<std::uint32_t*>(table.arena_range(target.doorbell_offset, 64));
    std::uint8_t* entries = table.arena_range(target.receive_cq_offset,
                                              static_cast<std::uint64_t>(target.receive_cqe_count) * target.receive_cqe_size);
    auto* cq_doorbell = reinterpret_cast<std::uint32_t*>(table.arena_range(target.receive_cq_doorbell_offset, 64));
    if (side.queue == nullptr || side.doorbell == nullptr || entries == nullptr || cq_doorbell == nullptr) return std::nullopt;
    // A CQE written here must be able to raise the target's event, or a consumer armed there
    // would sleep through it: without the descriptor the request path carries the receive.
    const int event_descriptor = table.event_descriptor(target.receive_cq_event_descriptor);
    if (event_descriptor < 0) return std::nullopt;
    side.cq = {entries, target.receive_cqe_count, target.receive_cqe_size, cq_doorbell, event_descriptor};
    return side;
}

// Reads a receive WQE's scatter list (`segments` data segments from `scatter`) into
// `destination`, each piece checked as the responder checks it: in one region of the protection
// domain with local write access, in the target's arena. The key stays held in `use`.
bool map_scatter_list(PeerTable& table, const std::uint8_t* scatter, std::uint32_t segments, std::uint32_t protection_domain,
                      PeerTable::RegionUse& use, Destination& destination) {
    std::uint32_t key = 0;
    return for_each_receive_segment(scatter, segments, [&](std::uint32_t lkey, std::uint64_t addr, std::uint32_t piece_length) {
        if (destination.count == wire::kMaxSegments || (key != 0 && lkey != key)) return false;
        if (key == 0) {
            key = lkey;
            table.use_region(key, use);
        }
        const std::optional<PublishedRegionView>& region = use.entry();
        if (!region || !zero_hop_region_admits(*region, protection_domain, kLocalWrite, addr, piece_length)) {
            return false;  // a protection error: the request path reports it
        }
        std::uint8_t* mapped = table.arena_range(region->arena_offset, region->length);
        if (mapped == nullptr) return false;
        destination.pieces[destination.count++] = {mapped + (addr - region->addr), piece_length};
        destination.capacity += piece_length;
        return true;
    });
}

}  // namespace

void hold_zero_hop_receives(ZeroHopReceiveStep step, std::chrono::microseconds delay, int reached_descriptor) noexcept {
    held_microseconds.store(delay.count(), std::memory_order_relaxed);
    held_descriptor.store(reached_descriptor, std::memory_order_relaxed);
    held_step.store(step, std::memory_order_relaxed);
}

bool Requester::zero_hop_receive(QueuePairContext& queue_pair, const wire::Request& request,
                                  std::span<const std::uint8_t> payload, const wire::Segment* segments,
                                  std::uint32_t segment_count) {
    const bool write = request.opcode == kOpcodeRdmaWriteImmediate;
    if (!settings.zero_hop_enabled || (!write && request.opcode != kOpcodeSend && request.opcode != kOpcodeSendImmediate)) return false;
    const bool dc = queue_pair.transport == Transport::dc_initiator;
    if (queue_pair.transport != Transport::reliable_connected && !dc) return false;
    // The bytes, in order: the frame's payload (inline data), or the pointer segments.
    std::uint64_t length = payload.size();
    iovec local[wire::kMaxSegments];
    std::size_t local_count = 0;
    if (!payload.empty()) {
        if (segment_count != 0) return false;  // not a shape execute_one makes
        local[local_count++] = {const_cast<std::uint8_t*>(payload.data()), payload.size()};
    } else {
        for (std::uint32_t i = 0; i < segment_count; ++i) {
            local[local_count++] = {reinterpret_cast<void*>(segments[i].address), static_cast<std::size_t>(segments[i].length)};
            length += segments[i].length;
        }
        if (!in_own_arena(local, local_count)) return false;  // heap memory could be unmapped under a memcpy
    }
    if (dc) return zero_hop_shared_receive(queue_pair, request, local, local_count, length);

    PublishedQueuePairView target;
    const ZeroHopTarget found = zero_hop_target(queue_pair, write && length != 0 ? kRemoteWrite : 0u, target);
    if (found.table == nullptr) return false;
    PeerTable& table = *found.table;
    // The target's receive queue, its doorbell block and its receive CQ, in its arena.
    if (!power_of_two(target.receive_wqe_count) || target.receive_stride < kDataSegmentSize ||
        target.receive_stride % kDataSegmentSize != 0) {
        return false;
    }
    const std::optional<ReceiveSide> side = map_receive_side(table, target);
    if (!side) return false;
    std::uint32_t* const doorbell = side->doorbell;

    // The receive WQE this request consumes: posted and not yet consumed, else RNR.
    const std::uint32_t consumed = __atomic_load_n(doorbell + kReceiveConsumedWord, __ATOMIC_ACQUIRE);
    const std::uint32_t posted = big_to_host32(load_acquire32(doorbell + kReceiveDoorbell)) & 0xffff;
    // The refusals that pass (no receive yet, the lock busy, the CQ full) make the WQEs after
    // this one wait for its answer rather than follow it on the request path (device_core.hpp).
    auto refused_for_now = [&queue_pair] {
        queue_pair.zero_hop_waits_for_answers = true;
        return false;
    };
    if (((posted - consumed) & 0xffff) == 0) return refused_for_now();

    // Where the bytes go, checked as the responder checks it, the key held in this mapping's
    // holder slot until they moved.
    PeerTable::RegionUse use;
    Destination destination;
    if (write) {
        if (length != 0 && !map_write_destination(table, target, request, length, use, destination)) return false;
    } else {
        // The receive WQE's scatter list, read as peek_receive reads it.
        const std::uint8_t* wqe =
            side->queue + static_cast<std::size_t>(consumed & (target.receive_wqe_count - 1)) * target.receive_stride;
        if (!map_scatter_list(table, wqe, target.receive_stride / kDataSegmentSize, target.protection_domain, use, destination)) {
            return false;
        }
        if (length > destination.capacity) return false;  // a length error: the request path reports it
    }

    fill(destination, local, local_count);

    // The receive and the CQE, under the target's receive lock.
    if (!table.receive_lock().lock_briefly()) return refused_for_now();
    const CompletionRingView& receive_cq = side->cq;
    const std::optional<PublishedQueuePairView> still = table.read_queue_pair(target.qpn);
    if (!still || !zero_hop_ready(*still, queue_pair) || __atomic_load_n(doorbell + kReceiveConsumedWord, __ATOMIC_ACQUIRE) != consumed) {
        table.receive_lock().unlock();
        return false;
    }
    if (receive_cq.full()) {
        table.receive_lock().unlock();
        return refused_for_now();
    }
    consume_and_complete(table, target, receive_cq, doorbell + kReceiveConsumedWord, consumed, consumed + 1,
                         responder_completion(request, consumed, length, queue_pair.qpn, lid, target));
    table.receive_lock().unlock();
    count_one(statistics.zero_hop_receives);
    return true;
}

bool Requester::zero_hop_shared_receive(QueuePairContext& queue_pair, const wire::Request& request, const iovec* local,
                                         std::size_t local_count, std::uint64_t length) {
    const bool write = request.opcode == kOpcodeRdmaWriteImmediate;
    PublishedQueuePairView target;
    const ZeroHopTarget found = zero_hop_target(queue_pair, write && length != 0 ? kRemoteWrite : 0u, target, request.dc_key);
    if (found.table == nullptr) return false;
    PeerTable& table = *found.table;
    // The DCT's SRQ (its next-WQE segment, then data segments), the SRQ's doorbell block and the
    // DCT's receive CQ, in its arena. WQE indexes are 16 bits in the consumption word.
    const std::uint32_t stride = target.receive_stride;
    if (!power_of_two(target.receive_wqe_count) || target.receive_wqe_count > 65536 ||
        stride < kSrqNextSegmentSize + kDataSegmentSize || (stride - kSrqNextSegmentSize) % kDataSegmentSize != 0) {
        return false;
    }
    const std::optional<ReceiveSide> side = map_receive_side(table, target);
    if (!side) return false;
    std::uint32_t* const doorbell = side->doorbell;
    auto refused_for_now = [&queue_pair] {
        queue_pair.zero_hop_waits_for_answers = true;
        return false;
    };

    // A write with immediate's bytes go where its key says, checked as the responder checks it.
    PeerTable::RegionUse write_use;
    Destination destination;
    if (write && length != 0 && !map_write_destination(table, target, request, length, write_use, destination)) return false;

    // Many DCIs (and the target's own device) take WQEs from one SRQ: which one is next is known
    // only under the receive lock, so the WQE is read, filled, consumed and completed under it.
    if (!table.receive_lock().lock_briefly()) return refused_for_now();
    struct Unlock {
        PeerTable& table;
        ~Unlock() { table.receive_lock().unlock(); }
    } unlock{table};
    // The DCT as it is now: still in RTR with this key and this SRQ (moved to ERR or destroyed
    // meanwhile: the request path carries the request, which the target then drops).
    const std::optional<PublishedQueuePairView> still = table.read_queue_pair(target.qpn);
    if (!still || still->transport != kPublishedDcTarget || still->dc_key != request.dc_key ||
        still->state != static_cast<std::uint32_t>(QueuePairState::ready_to_receive) || still->doorbell_offset != target.doorbell_offset) {
        return false;
    }
    const std::uint32_t consumption = __atomic_load_n(doorbell + kReceiveConsumedWord, __ATOMIC_ACQUIRE);
    const auto posted = static_cast<std::uint16_t>(big_to_host32(load_acquire32(doorbell)));
    if (posted == static_cast<std::uint16_t>(consumption)) return refused_for_now();  // RNR on the request path
    const std::uint32_t index = consumption >> 16;
    if (index >= target.receive_wqe_count) return false;
    const std::uint8_t* wqe = side->queue + static_cast<std::size_t>(index) * stride;
    const std::uint32_t next = load_big16(wqe + kSrqNextWqeIndex) & (target.receive_wqe_count - 1);
    PeerTable::RegionUse scatter_use;
    if (!write) {
        if (!map_scatter_list(table, wqe + kSrqNextSegmentSize, (stride - kSrqNextSegmentSize) / kDataSegmentSize,
                              target.receive_protection_domain, scatter_use, destination)) {
            return false;
        }
        if (length > destination.capacity) return false;  // a length error: the request path reports it
    }
    const CompletionRingView& receive_cq = side->cq;
    if (receive_cq.full()) return refused_for_now();
    fill(destination, local, local_count);
    // The consumption word changing is what says the WQE was consumed, as for an RC QP's count.
    consume_and_complete(table, target, receive_cq, doorbell + kReceiveConsumedWord, consumption,
                         next << 16 | static_cast<std::uint16_t>(consumption + 1),
                         responder_completion(request, index, length, queue_pair.qpn, lid, target));
    count_one(statistics.zero_hop_receives);
    return true;
}

}  // namespace rdmachan::soft
