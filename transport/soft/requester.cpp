// What the software device does with WQEs: decode the bytes the data path wrote, check them as
// the NIC's memory translation would, carry the operation to the responder, and complete it
// with the CQE a ConnectX writes. Errors move the QP to ERR and flush what follows.
#include <cstddef>
#include <cstring>
#include <span>
#include <string>

#include "transport/soft/flight_events.hpp"
#include "common/logger.hpp"
#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device_core.hpp"
#include "transport/soft/send_ring_bytes.hpp"
#include "transport/soft/dma_copy.hpp"

namespace rdmachan::soft {
namespace {

using namespace rdmachan::mlx5;

// Verbs' encoding of the minimum RNR NAK timer, in microseconds (IB spec table 45).
constexpr std::uint32_t kRnrTimerMicroseconds[32] = {
    655360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920,
    2560, 3840, 5120, 7680, 10240, 15360, 20480, 30720, 40960, 61440, 81920, 122880, 163840, 245760, 327680, 491520};

// The local ACK timeout: 4.096 us * 2^timeout per try, for retry_cnt retries and the first try.
// The local ACK timeout: how long one try waits for a response before the requester sends
// everything in flight again (IB spec 9.7.6.1.3; verbs' `timeout` and `retry_cnt`).
Clock::duration ack_timeout(const ReadyToSendAttributes& attributes) {
    return std::chrono::microseconds(static_cast<long long>(4.096 * static_cast<double>(1ull << attributes.timeout)));
}

// The PSN a zero-hop write shows in the flight record: it uses none (nothing is sent).
constexpr std::uint64_t kZeroHopPsn = ~0ull;

// The opcodes whose WQE becomes a request to the responder (or, NOP, nothing): what the doorbell
// thread may execute (doorbell_requests.cpp). UMR and unknown opcodes stay for the progress thread.
bool is_request_opcode(std::uint8_t opcode) {
    switch (opcode) {
        case kOpcodeRdmaWrite:
        case kOpcodeRdmaWriteImmediate:
        case kOpcodeRdmaRead:
        case kOpcodeAtomicCompareAndSwap:
        case kOpcodeAtomicFetchAndAdd:
        case kOpcodeSend:
        case kOpcodeSendImmediate:
        case kOpcodeSendInvalidate:
        case kOpcodeNop: return true;
        default: return false;
    }
}

bool is_read_or_atomic(std::uint8_t opcode) {
    return opcode == kOpcodeRdmaRead || opcode == kOpcodeAtomicCompareAndSwap || opcode == kOpcodeAtomicFetchAndAdd;
}

// A request's payload, gathered behind room for its frame's header and request, so that the frame
// is built around it in place and handed to the request in flight by a swap, not copied into a
// second buffer (a 64 KiB write on the TCP path was copied twice on the sending side before
// the kernel's copy). The buffer given back by the swap, an earlier frame's, is the next
// payload's: neither allocates once it has held a payload this large.
class FramePayload {
public:
    static constexpr std::size_t kPrefix = sizeof(wire::FrameHeader) + sizeof(wire::Request);

    explicit FramePayload(std::vector<std::uint8_t>& bytes) : bytes_(bytes) { clear(); }
    // A payload above 1 MiB gives its capacity back when this WQE is done (the buffer here is
    // an earlier frame's, header included: a limit on the payload alone freed and mapped again
    // the buffer of every 1 MiB write, 256 page faults each: 1 MiB writes over TCP moved at
    // 1.9-2.2 GB/s, against 3.0-3.2 with this limit).
    ~FramePayload() {
        if (bytes_.capacity() > kPrefix + (1u << 20)) std::vector<std::uint8_t>().swap(bytes_);
    }
    FramePayload(const FramePayload&) = delete;
    FramePayload& operator=(const FramePayload&) = delete;

    void clear() { bytes_.resize(kPrefix); }
    bool empty() const { return bytes_.size() == kPrefix; }
    std::size_t size() const { return bytes_.size() - kPrefix; }
    const std::uint8_t* data() const { return bytes_.data() + kPrefix; }
    std::span<const std::uint8_t> bytes() const { return {data(), size()}; }
    // `from` is the application's memory (dma_copy.hpp). Inserted, not resized then copied: a
    // resize zero-fills first, which doubled the bytes written per payload.
    void append(const void* from, std::size_t length) {
        [[maybe_unused]] const DmaAccess dma;
        const auto* first = static_cast<const std::uint8_t*>(from);
        bytes_.insert(bytes_.end(), first, first + length);
    }
    // `length` more bytes at the end, for the caller to fill.
    std::uint8_t* extend(std::size_t length) {
        const std::size_t old_size = bytes_.size();
        bytes_.resize(old_size + length);
        return bytes_.data() + old_size;
    }
    // The frame of `request` with this payload, moved into `frame`; this buffer then holds what
    // `frame` held, emptied.
    void into_frame(const wire::Request& request, std::vector<std::uint8_t>& frame) {
        const wire::FrameHeader header{wire::kMagic, static_cast<std::uint32_t>(size()), wire::FrameType::request};
        std::memcpy(bytes_.data(), &header, sizeof header);
        std::memcpy(bytes_.data() + sizeof header, &request, sizeof request);
        frame.swap(bytes_);
        clear();
    }

private:
    std::vector<std::uint8_t>& bytes_;
};

}  // namespace

void Requester::execute_pending_doorbells() {
    if (!loop.take_doorbells()) return;
    for (auto& [qpn, queue_pair] : queue_pairs) {
        if (queue_pair->doorbell_pending.exchange(false)) execute_send_queue(*queue_pair);
    }
}

void Requester::execute_send_queue(QueuePairContext& queue_pair) {
    if (queue_pair.state != QueuePairState::ready_to_send && queue_pair.state != QueuePairState::error) return;
    if (queue_pair.send_ring.buffer == nullptr) return;  // a DCT has no send queue
    // The doorbell record holds the 16-bit producer index after the last WQE of the batch.
    const std::uint32_t producer = big_to_host32(load_acquire32(queue_pair.send_ring.doorbell_record + kSendDoorbell)) & 0xffff;
    // A bounded batch per turn, as the NIC arbitrates between its QPs: the rest waits for the
    // next turn of the progress loop, which reads the sockets in between.
    constexpr int kWqesPerTurn = 64;
    for (int executed = 0; ((producer - queue_pair.executed) & 0xffff) != 0; ++executed) {
        if (executed == kWqesPerTurn && queue_pair.state == QueuePairState::ready_to_send) {
            queue_pair.doorbell_pending.store(true);
            loop.note_doorbell_left();
            return;
        }
        if (!execute_one(queue_pair, queue_pair.executed)) break;
    }
}

bool Requester::execute_one(QueuePairContext& queue_pair, std::uint32_t index, bool* left_for_progress) {
    const SendQueueRing& ring = queue_pair.send_ring;
    const std::size_t wqe_offset = static_cast<std::size_t>(index & (ring.wqe_count - 1)) * kSendWqeBasicBlockSize;
    std::uint8_t control[kControlSegmentSize];
    copy_from_send_ring(ring, wqe_offset, control, sizeof control);
    const std::uint32_t opmod_index_opcode = load_big32(control + kCtrlOpmodIndexOpcode);
    const std::uint8_t opcode = opmod_index_opcode & 0xff;
    const std::uint16_t wqe_index = static_cast<std::uint16_t>(opmod_index_opcode >> 8);
    const std::uint32_t qpn_ds = load_big32(control + kCtrlQpnDs);
    const std::uint32_t ds = qpn_ds & kMaxDs;
    const bool signaled = (control[kCtrlFmCeSe] & kCtrlCqUpdate) != 0;
    const std::uint32_t wqebbs = ds == 0 ? 1 : (ds * kSegmentUnit + kSendWqeBasicBlockSize - 1) / kSendWqeBasicBlockSize;

    // On the doorbell thread only a well-formed RC or DC RDMA write, read, write with immediate,
    // send or atomic may execute (zero_hop.cpp, zero_hop_receive.cpp), or, from send_from_doorbell,
    // a well-formed RC request (doorbell_requests.cpp); every other WQE stays in the ring,
    // untouched, for the progress thread.
    const bool doorbell_thread = left_for_progress != nullptr;
    // A DCI's WQE switches it to the DCT it names (take_dc_address) before the zero-hop path is
    // tried; a WQE the doorbell thread leaves to the progress thread must find the DCI as it was,
    // or its connect to that DCT would never be sent.
    const bool dc_initiator = queue_pair.transport == Transport::dc_initiator;
    const RemoteQueuePair dc_remote_before = doorbell_thread && dc_initiator ? queue_pair.receive_attributes.remote : RemoteQueuePair{};
    const bool dc_connected_before = queue_pair.dc_connected;
    auto leave_for_progress = [&] {
        if (dc_initiator) {
            queue_pair.receive_attributes.remote = dc_remote_before;
            queue_pair.dc_connected = dc_connected_before;
        }
        *left_for_progress = true;
        return false;
    };
    // A DCI's doorbell executes only what can go zero-hop to a DCT: writes, reads, atomics, and
    // sends and writes with immediate into its SRQ.
    const bool doorbell_may_execute =
        opcode == kOpcodeRdmaWrite || opcode == kOpcodeRdmaRead || opcode == kOpcodeAtomicCompareAndSwap ||
        opcode == kOpcodeAtomicFetchAndAdd || opcode == kOpcodeRdmaWriteImmediate || opcode == kOpcodeSend ||
        opcode == kOpcodeSendImmediate || (!dc_initiator && doorbell_sends_requests_ && is_request_opcode(opcode));
    if (doorbell_thread && (!doorbell_may_execute || queue_pair.state != QueuePairState::ready_to_send ||
                            (queue_pair.transport != Transport::reliable_connected && !dc_initiator) ||
                            wqe_index != (index & 0xffff) || (qpn_ds >> 8) != queue_pair.qpn || ds < 1)) {
        return leave_for_progress();
    }

    if (queue_pair.state == QueuePairState::error) {
        completions.write_error(*queue_pair.send_cq, queue_pair, true, static_cast<std::uint16_t>(index), opcode, kSyndromeWorkRequestFlushed);
        queue_pair.executed += wqebbs;
        return true;
    }
    if (queue_pair.zero_hop_waits_for_answers) {
        if (!queue_pair.in_flight.empty()) return doorbell_thread ? leave_for_progress() : false;
        queue_pair.zero_hop_waits_for_answers = false;
    }
    // A malformed WQE (wrong index, QP number or size) is a local QP operation error, as on
    // hardware (mlx5-facts.md §9.6).
    if (wqe_index != (index & 0xffff) || (qpn_ds >> 8) != queue_pair.qpn || ds < 1) {
        completions.write_error(*queue_pair.send_cq, queue_pair, true, static_cast<std::uint16_t>(index), opcode, kSyndromeLocalQpOperation);
        queue_pair.executed += wqebbs;
        move_to_error(queue_pair, "malformed send WQE");
        return false;
    }

    if (opcode == kOpcodeUmr) return execute_umr(queue_pair, index, control);

    wire::Request request{};
    request.source_qpn = queue_pair.qpn;
    request.destination_qpn = queue_pair.receive_attributes.remote.qpn;
    request.opcode = opcode;
    request.solicited = (control[kCtrlFmCeSe] & kCtrlSolicited) != 0;
    request.immediate = load_big32(control + kCtrlImmediate);
    std::size_t position = wqe_offset + kControlSegmentSize;
    std::uint32_t units = 1;
    auto take = [&](void* destination, std::size_t bytes) {
        copy_from_send_ring(ring, position, destination, bytes);
        position += bytes;
    };
    const bool atomic = opcode == kOpcodeAtomicCompareAndSwap || opcode == kOpcodeAtomicFetchAndAdd;
    bool has_remote = false;
    switch (opcode) {
        case kOpcodeRdmaWrite:
        case kOpcodeRdmaWriteImmediate:
        case kOpcodeRdmaRead:
        case kOpcodeAtomicCompareAndSwap:
        case kOpcodeAtomicFetchAndAdd: has_remote = true; break;
        case kOpcodeSend:
        case kOpcodeSendImmediate:
        case kOpcodeSendInvalidate:
        case kOpcodeNop: break;
        default:
            completions.write_error(*queue_pair.send_cq, queue_pair, true, wqe_index, opcode, kSyndromeLocalQpOperation);
            queue_pair.executed += wqebbs;
            move_to_error(queue_pair, "unknown send WQE opcode");
            return false;
    }
    // A DCI WQE names its target in the address vector right after ctrl (mlx5-facts.md §1).
    if (queue_pair.transport == Transport::dc_initiator && opcode != kOpcodeNop) {
        std::uint8_t address_vector[kAddressVectorSize];
        copy_from_send_ring(ring, position, address_vector, sizeof address_vector);
        const AddressOutcome outcome = take_dc_address(queue_pair, address_vector, request);
        if (doorbell_thread && outcome != AddressOutcome::ready) return leave_for_progress();
        // Another target still owes answers: this WQE waits (not executed) until they came, so
        // the DCI's requests stay in order across targets.
        if (outcome == AddressOutcome::wait) return false;
        if (outcome == AddressOutcome::malformed || ds < 1 + kAddressVectorSize / kSegmentUnit) {
            completions.write_error(*queue_pair.send_cq, queue_pair, true, wqe_index, opcode, kSyndromeLocalQpOperation);
            queue_pair.executed += wqebbs;
            move_to_error(queue_pair, "malformed DC address vector");
            return false;
        }
        position += kAddressVectorSize;
        units += kAddressVectorSize / kSegmentUnit;
    }
    if (has_remote) {
        std::uint8_t segment[kRemoteAddressSegmentSize];
        take(segment, sizeof segment);
        request.remote_addr = load_big64(segment);
        request.rkey = load_big32(segment + 8);
        ++units;
    }
    if (atomic) {
        std::uint8_t segment[kAtomicSegmentSize];
        take(segment, sizeof segment);
        if (opcode == kOpcodeAtomicCompareAndSwap) {
            request.swap = load_big64(segment);
            request.compare_add = load_big64(segment + 8);
        } else {
            request.compare_add = load_big64(segment);
        }
        ++units;
    }

    // Same host: pointer segments of a large write, send or read go as (address, length) for the
    // responder to move with cross-memory attach; they are collected here and copied into the
    // frame only if the request turns out small or mixes in inline data.
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    bool by_reference = !atomic &&
                        !(same_gid(remote.gid, gid) && remote.lid == lid) && same_host_connection(remote.gid, remote.lid) != nullptr;
    wire::Segment segments[wire::kMaxSegments];
    std::uint32_t segment_count = 0;
    std::uint64_t referenced_bytes = 0;
    FramePayload payload(decode_payload_);
    auto copy_referenced = [&] {
        for (std::uint32_t i = 0; i < segment_count; ++i) {
            const auto* bytes = reinterpret_cast<const std::uint8_t*>(segments[i].address);
            payload.append(bytes, segments[i].length);
        }
        segment_count = 0;
        referenced_bytes = 0;
        by_reference = false;
    };

    // Built in place in the QP's next free slot, whose frame and targets keep their capacity
    // (reusing_ring.hpp); it joins the requests in flight only when sent (commit_back).
    InFlight& in_flight = queue_pair.in_flight.prepare_back();
    in_flight.local_targets.clear();
    in_flight.length = 0;
    in_flight.targets_as_posted = true;
    in_flight.by_reference = false;
    in_flight.wqe_counter = wqe_index;
    in_flight.opcode = opcode;
    in_flight.signaled = signaled;
    std::uint8_t syndrome = 0;
    while (units < ds && syndrome == 0) {
        std::uint8_t segment[kDataSegmentSize];
        copy_from_send_ring(ring, position, segment, sizeof segment);
        const std::uint32_t byte_count = load_big32(segment);
        if ((byte_count & kInlineFlag) != 0) {
            const std::uint32_t length = byte_count & ~kInlineFlag;
            if (kInlineHeaderSize + length > (ds - units) * kSegmentUnit || is_read_or_atomic(opcode)) {
                syndrome = kSyndromeLocalQpOperation;
                break;
            }
            if (by_reference && !is_read_or_atomic(opcode)) copy_referenced();  // inline data follows: keep the order
            by_reference = false;
            copy_from_send_ring(ring, position + kInlineHeaderSize, payload.extend(length), length);
            units += (kInlineHeaderSize + length + kSegmentUnit - 1) / kSegmentUnit;
            position += ((kInlineHeaderSize + length + kSegmentUnit - 1) / kSegmentUnit) * kSegmentUnit;
            continue;
        }
        const std::uint32_t lkey = load_big32(segment + 4);
        const std::uint64_t addr = load_big64(segment + 8);
        position += kDataSegmentSize;
        ++units;
        // Read and atomic results are written into local memory: that needs local write access.
        const std::uint32_t needed = is_read_or_atomic(opcode) ? std::uint32_t{kLocalWrite} : 0u;
        MemorySegments& pieces = decode_pieces_;  // one, or an indirect key's pieces
        pieces.clear();
        if (!translation.translate(lkey, queue_pair.protection_domain, addr, byte_count, needed, pieces)) {
            syndrome = kSyndromeLocalProtection;
            break;
        }
        if (is_read_or_atomic(opcode)) {
            in_flight.local_targets.insert(in_flight.local_targets.end(), pieces.begin(), pieces.end());
            if (!MemoryTranslation::translated_as_posted(pieces, 0, addr, byte_count)) in_flight.targets_as_posted = false;
            in_flight.length += byte_count;
        } else {
            if (payload.size() + referenced_bytes + byte_count > wire::kMaxPayload) {
                syndrome = kSyndromeLocalLength;
                break;
            }
            // Each piece (one, or an indirect key's) travels by reference or in the frame.
            for (auto [piece, piece_length] : pieces) {
                if (by_reference && segment_count == wire::kMaxSegments) copy_referenced();
                if (by_reference) {
                    segments[segment_count++] = {reinterpret_cast<std::uint64_t>(piece), piece_length};
                    referenced_bytes += piece_length;
                } else {
                    payload.append(piece, piece_length);
                }
            }
        }
    }
    if (syndrome == 0 && (opcode == kOpcodeAtomicCompareAndSwap || opcode == kOpcodeAtomicFetchAndAdd) && in_flight.length != 8) {
        syndrome = kSyndromeLocalLength;
    }
    // What consumes a receive at the target: a send, a send with immediate, a write with immediate.
    const bool consumes_receive =
        opcode == kOpcodeSend || opcode == kOpcodeSendImmediate || opcode == kOpcodeRdmaWriteImmediate;
    // A DCT learns of a DCI only from a request on the request path: a connect that went zero-hop
    // is sent again with the DCI's next request that does not.
    auto zero_hop_done = [&] {
        queue_pair.executed += wqebbs;
        if ((request.dc_flags & wire::kDcConnect) != 0) queue_pair.dc_connected = false;
    };
    if (syndrome == 0 && ((opcode == kOpcodeRdmaWrite && zero_hop_write(queue_pair, request, payload.bytes(), segments, segment_count)) ||
                          (consumes_receive && zero_hop_receive(queue_pair, request, payload.bytes(), segments, segment_count)))) {
        zero_hop_done();
        flight::record(flight::SoftEvent::wqe_executed, queue_pair.qpn, wqe_index, opcode, kZeroHopPsn,
                       payload.empty() ? referenced_bytes : payload.size());
        if (signaled) completions.write_requester(*queue_pair.send_cq, queue_pair, wqe_index, opcode, 0);
        return true;
    }
    if (syndrome == 0 && opcode == kOpcodeRdmaRead && zero_hop_read(queue_pair, request, in_flight.local_targets, in_flight.length)) {
        zero_hop_done();
        flight::record(flight::SoftEvent::wqe_executed, queue_pair.qpn, wqe_index, opcode, kZeroHopPsn, in_flight.length);
        // A read's CQE carries the bytes read (libmlx5 reports it as byte_len).
        if (signaled) completions.write_requester(*queue_pair.send_cq, queue_pair, wqe_index, opcode, in_flight.length);
        return true;
    }
    if (syndrome == 0 && (opcode == kOpcodeAtomicCompareAndSwap || opcode == kOpcodeAtomicFetchAndAdd) &&
        zero_hop_atomic(queue_pair, request, in_flight.local_targets)) {
        zero_hop_done();
        flight::record(flight::SoftEvent::wqe_executed, queue_pair.qpn, wqe_index, opcode, kZeroHopPsn, in_flight.length);
        if (signaled) completions.write_requester(*queue_pair.send_cq, queue_pair, wqe_index, opcode, 8);
        return true;
    }
    // A local error is the progress thread's to report (it logs and moves the QP to ERR).
    if (doorbell_thread && (!doorbell_sends_requests_ || syndrome != 0)) return leave_for_progress();
    queue_pair.executed += wqebbs;
    if (syndrome != 0) {
        completions.write_error(*queue_pair.send_cq, queue_pair, true, wqe_index, opcode, syndrome);
        move_to_error(queue_pair, "local error in a send WQE");
        return false;
    }
    if (opcode == kOpcodeNop) {
        if (signaled) completions.write_requester(*queue_pair.send_cq, queue_pair, wqe_index, opcode, 0);
        return true;
    }
    if (opcode == kOpcodeRdmaRead && by_reference && in_flight.length >= settings.by_reference_threshold &&
        in_flight.local_targets.size() <= wire::kMaxSegments) {
        for (auto [address, length] : in_flight.local_targets) {
            segments[segment_count++] = {reinterpret_cast<std::uint64_t>(address), length};
        }
    } else if (referenced_bytes < settings.by_reference_threshold) {
        copy_referenced();  // small: one copy into the frame is cheaper than a system call at the target
    }
    request.length = is_read_or_atomic(opcode) ? in_flight.length
                                               : static_cast<std::uint32_t>(segment_count != 0 ? referenced_bytes : payload.size());
    if (segment_count != 0) {
        request.by_reference = 1;
        in_flight.by_reference = true;
        payload.clear();
        payload.append(segments, segment_count * sizeof(wire::Segment));
    }
    request.psn = queue_pair.next_psn;
    queue_pair.next_psn = (queue_pair.next_psn + 1) & 0xffffff;
    in_flight.psn = request.psn;
    payload.into_frame(request, in_flight.frame);
    flight::record(flight::SoftEvent::wqe_executed, queue_pair.qpn, wqe_index, opcode, request.psn, request.length);
    if (queue_pair.in_flight.empty()) restart_ack_timer(queue_pair);
    queue_pair.in_flight.commit_back();
    if (!queue_pair.waiting_rnr && !send_request(queue_pair, queue_pair.in_flight.back().frame)) {
        fail_queue_pair(queue_pair, kSyndromeTransportRetryExceeded, "the peer device cannot be reached");
        return false;
    }
    return true;
}

void Requester::handle_response(const wire::Response& response, const std::uint8_t* payload, std::uint32_t payload_length) {
    auto found = queue_pairs.find(response.destination_qpn);
    if (found == queue_pairs.end()) return;  // the QP is gone: nothing to complete
    QueuePairContext& queue_pair = *found->second;
    // An ACK acknowledges its request and every earlier one (IB spec 9.7.5.1.1): a responder
    // coalesces the ACKs of plain RDMA writes (respond_coalescing). Those earlier requests
    // complete first, in order; only requests whose answer carries nothing can be covered so.
    if (response.kind == wire::ResponseKind::ack && queue_pair.state == QueuePairState::ready_to_send &&
        !queue_pair.in_flight.empty() && queue_pair.in_flight.front().psn != response.psn) {
        complete_acknowledged_before(queue_pair, response.psn);
    }
    if (queue_pair.state != QueuePairState::ready_to_send || queue_pair.in_flight.empty() ||
        queue_pair.in_flight.front().psn != response.psn) {
        flight::record(flight::SoftEvent::response_ignored, queue_pair.qpn, response.psn, static_cast<std::uint64_t>(queue_pair.state),
                       queue_pair.in_flight.size(), queue_pair.in_flight.empty() ? 0 : queue_pair.in_flight.front().psn);
        detail::logger().debug("QP {}: response for psn {} ignored (state {}, in flight {})", queue_pair.qpn, response.psn,
                               to_string(queue_pair.state), queue_pair.in_flight.size());
        return;  // stale or duplicate: requests complete strictly in order
    }
    flight::record(flight::SoftEvent::response, queue_pair.qpn, response.psn, static_cast<std::uint64_t>(response.kind),
                   response.syndrome, queue_pair.in_flight.size());
    switch (response.kind) {
        case wire::ResponseKind::ack: {
            // Stays valid until the next request is built in this QP's ring, which nothing here does.
            InFlight& done = queue_pair.in_flight.front();
            queue_pair.in_flight.pop_front();
            // A read or atomic answer carries its data, unless the responder moved it by reference;
            // a malformed answer fails the request it answers (already off in_flight, so completed
            // here), then the QP.
            const bool expects_data = is_read_or_atomic(done.opcode) && !done.by_reference;
            const bool length_checked = expects_data || done.by_reference;
            if (length_checked && payload_length != (expects_data ? done.length : 0u)) {
                complete_requester(queue_pair, done, kSyndromeBadResponse);
                move_to_error(queue_pair, done.by_reference ? "data in the answer to a request moved by reference"
                                                            : "response length differs from the request");
                return;
            }
            // Scatter-to-CQE: a small answer to a signaled read or atomic goes into its CQE; the
            // poller copies it to the buffers the WQE names.
            const bool in_cqe = expects_data && done.signaled && queue_pair.scatter_to_cqe && done.targets_as_posted &&
                                CompletionWriter::fits_in_cqe(*queue_pair.send_cq, done.length);
            if (expects_data && !in_cqe) {
                std::uint32_t offset = 0;
                for (auto [address, length] : done.local_targets) {
                    dma_copy(address, payload + offset, length);
                    offset += length;
                }
            }
            queue_pair.rnr_retries_left = queue_pair.send_attributes.rnr_retry;
            restart_ack_timer(queue_pair);
            complete_requester(queue_pair, done, 0, in_cqe ? payload : nullptr);
            // A DCI may hold a WQE for another target until this target answered everything.
            if ((queue_pair.transport == Transport::dc_initiator || queue_pair.umr_waits_for_answers ||
                 queue_pair.zero_hop_waits_for_answers) &&
                queue_pair.in_flight.empty()) {
                queue_pair.doorbell_pending.store(true);
                loop.note_doorbell_left();
            }
            return;
        }
        case wire::ResponseKind::receiver_not_ready: {
            detail::logger().debug("QP {}: receiver not ready for psn {}", queue_pair.qpn, response.psn);
            const std::uint8_t retry = queue_pair.send_attributes.rnr_retry;
            if (retry != 7) {
                if (!queue_pair.waiting_rnr && queue_pair.rnr_retries_left == 0) {
                    fail_queue_pair(queue_pair, kSyndromeRnrRetryExceeded, "receiver not ready, RNR retries exhausted");
                    return;
                }
                --queue_pair.rnr_retries_left;
            }
            queue_pair.waiting_rnr = true;
            queue_pair.retry_at = Clock::now() + std::chrono::microseconds(kRnrTimerMicroseconds[response.rnr_timer & 31]);
            return;
        }
        case wire::ResponseKind::negative:
            fail_queue_pair(queue_pair, response.syndrome, "the responder refused the request");
            return;
    }
}

void Requester::complete_acknowledged_before(QueuePairContext& queue_pair, std::uint32_t psn) {
    // The requests in flight have consecutive PSNs from the first one's: the ACK's is among them
    // when its distance from the first is less than their count, else it is stale or foreign.
    const std::uint32_t covered = (psn - queue_pair.in_flight.front().psn) & 0xffffff;
    if (covered >= queue_pair.in_flight.size()) return;
    for (std::uint32_t i = 0; i < covered; ++i) {
        if (queue_pair.in_flight.at(i).opcode != kOpcodeRdmaWrite) return;  // its answer is its own: left to the timer
    }
    for (std::uint32_t i = 0; i < covered; ++i) {
        const InFlight& done = queue_pair.in_flight.front();
        queue_pair.in_flight.pop_front();
        complete_requester(queue_pair, done, 0);
    }
}

void Requester::complete_requester(QueuePairContext& queue_pair, const InFlight& request, std::uint8_t syndrome,
                                    const std::uint8_t* inline_data) {
    if (syndrome != 0) {
        completions.write_error(*queue_pair.send_cq, queue_pair, true, request.wqe_counter, request.opcode, syndrome);
        return;
    }
    if (!request.signaled) return;
    std::uint32_t byte_count = 0;
    if (request.opcode == kOpcodeRdmaRead) byte_count = request.length;
    if (request.opcode == kOpcodeAtomicCompareAndSwap || request.opcode == kOpcodeAtomicFetchAndAdd) byte_count = 8;
    completions.write_requester(*queue_pair.send_cq, queue_pair, request.wqe_counter, request.opcode, byte_count, inline_data);
}

void Requester::fail_queue_pair(QueuePairContext& queue_pair, std::uint8_t syndrome, const char* why) {
    if (!queue_pair.in_flight.empty()) {
        InFlight& failed = queue_pair.in_flight.front();  // valid until a request is built (not here)
        queue_pair.in_flight.pop_front();
        complete_requester(queue_pair, failed, syndrome);
    }
    move_to_error(queue_pair, why);
}

void Requester::move_to_error(QueuePairContext& queue_pair, const char* why) {
    if (queue_pair.state == QueuePairState::error) return;
    flight::record(flight::SoftEvent::qp_error, queue_pair.qpn, flight::text(why));
    detail::logger().info("software device {}: QP {} to ERR: {}", owner.name(), queue_pair.qpn, why);
    queue_pair.state = QueuePairState::error;
    published_table.publish_queue_pair(queue_pair);
    flush_queue_pair(queue_pair);
    // The progress thread may sleep without a deadline; from now on it must also flush receives
    // posted to this QP, so it recomputes its timers.
    wake();
}

void Requester::flush_queue_pair(QueuePairContext& queue_pair) {
    // Everything the NIC still holds completes with a flush error: sent but unanswered
    // requests, then WQEs not yet executed, then posted receives.
    for (const InFlight& request : queue_pair.in_flight) {
        completions.write_error(*queue_pair.send_cq, queue_pair, true, request.wqe_counter, request.opcode, kSyndromeWorkRequestFlushed);
    }
    queue_pair.in_flight.clear();
    queue_pair.waiting_rnr = false;
    execute_send_queue(queue_pair);
    if (queue_pair.srq == nullptr && queue_pair.receive_ring.wqe_count != 0) {
        const std::uint32_t posted = big_to_host32(load_acquire32(queue_pair.receive_ring.doorbell_record + kReceiveDoorbell)) & 0xffff;
        // The QP's entry says ERR by now (published under the receive lock): no peer consumes
        // these receives any more.
        for (std::uint32_t consumed = queue_pair.receive_consumed(); ((posted - consumed) & 0xffff) != 0; ++consumed) {
            completions.write_error(*queue_pair.recv_cq, queue_pair, false, static_cast<std::uint16_t>(consumed), 0,
                            kSyndromeWorkRequestFlushed);
            queue_pair.set_receive_consumed(consumed + 1);
        }
    }
}

void Requester::restart_ack_timer(QueuePairContext& queue_pair) {
    queue_pair.progress_deadline = Clock::now() + ack_timeout(queue_pair.send_attributes);
    queue_pair.transport_retries_left = queue_pair.send_attributes.retry_cnt;
}

void Requester::resend_in_flight(QueuePairContext& queue_pair, bool retransmission) {
    if (!queue_pair.in_flight.empty()) {
        if (retransmission) count_one(statistics.ack_timeout_resends);
        flight::record(flight::SoftEvent::retransmit, queue_pair.qpn, queue_pair.in_flight.front().psn, queue_pair.in_flight.size(),
                       flight::text(retransmission ? "no response within the ACK timeout" : "after an RNR NAK"),
                       retransmission ? queue_pair.transport_retries_left : queue_pair.rnr_retries_left);
    }
    for (InFlight& request : queue_pair.in_flight) {
        if (retransmission) {
            std::uint8_t& flags = request.frame[sizeof(wire::FrameHeader) + offsetof(wire::Request, dc_flags)];
            if ((flags & wire::kDcRequest) != 0) flags |= wire::kDcRetransmission;
        }
        if (!send_request(queue_pair, request.frame)) {
            fail_queue_pair(queue_pair, kSyndromeTransportRetryExceeded, "the peer device cannot be reached");
            return;
        }
    }
}

void Requester::service_timers() {
    const Clock::time_point now = Clock::now();
    for (auto& [qpn, queue_pair] : queue_pairs) {
        if (queue_pair->state == QueuePairState::error) {
            flush_queue_pair(*queue_pair);  // receives posted after the QP entered ERR
            continue;
        }
        if (queue_pair->state != QueuePairState::ready_to_send || queue_pair->in_flight.empty()) continue;
        if (queue_pair->waiting_rnr) {
            if (now < queue_pair->retry_at) continue;
            // Go back to the refused request and resend it and everything after it.
            queue_pair->waiting_rnr = false;
            restart_ack_timer(*queue_pair);
            resend_in_flight(*queue_pair, false);
            continue;
        }
        if (queue_pair->send_attributes.timeout != 0 && now >= queue_pair->progress_deadline) {
            if (queue_pair->transport_retries_left == 0) {
                detail::logger().debug("QP {}: transport timeout with {} requests in flight, oldest psn {}", queue_pair->qpn,
                                       queue_pair->in_flight.size(), queue_pair->in_flight.front().psn);
                fail_queue_pair(*queue_pair, kSyndromeTransportRetryExceeded, "no response within the transport timeout");
                continue;
            }
            // No response within one ACK timeout: the request (or its answer) may have been
            // dropped, by a responder not yet in RTR, say. Go back to the oldest and send
            // everything in flight again; the responder drops what it already executed.
            --queue_pair->transport_retries_left;
            detail::logger().debug("QP {}: no response within the ACK timeout: {} requests sent again from psn {}",
                                   queue_pair->qpn, queue_pair->in_flight.size(), queue_pair->in_flight.front().psn);
            queue_pair->progress_deadline = now + ack_timeout(queue_pair->send_attributes);
            resend_in_flight(*queue_pair, true);
        }
    }
}

Clock::time_point Requester::next_timer() {
    Clock::time_point earliest{};
    auto consider = [&](Clock::time_point when) {
        if (earliest == Clock::time_point{} || when < earliest) earliest = when;
    };
    for (auto& [qpn, queue_pair] : queue_pairs) {
        if (queue_pair->state == QueuePairState::error && queue_pair->srq == nullptr && queue_pair->receive_ring.wqe_count != 0) {
            consider(Clock::now() + std::chrono::milliseconds(20));  // flush receives posted in ERR
        }
        if (queue_pair->state != QueuePairState::ready_to_send || queue_pair->in_flight.empty()) continue;
        if (queue_pair->waiting_rnr) consider(queue_pair->retry_at);
        else if (queue_pair->send_attributes.timeout != 0) consider(queue_pair->progress_deadline);
    }
    return earliest;
}

Requester::~Requester() = default;

void Requester::wake() { loop.wake(); }

void Requester::count_one(std::atomic<std::uint64_t>& counter) { DeviceStatistics::count_one(counter); }

bool Requester::send_request(QueuePairContext& queue_pair, const std::vector<std::uint8_t>& frame) {
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    if (same_gid(remote.gid, gid) && remote.lid == lid) {
        loopback.push_back(frame);
        return true;
    }
    Connection* connection = links.connection_to(remote.gid, remote.lid);
    if (connection == nullptr) return false;
    links.queue_output(*connection, frame);
    return connection->socket >= 0;
}

const Connection* Requester::same_host_connection(const std::array<std::uint8_t, 16>& remote_gid,
                                                   std::uint16_t remote_lid) const {
    const Connection* connection = links.open_connection_to(remote_gid, remote_lid);
    return connection != nullptr && connection->by_reference && !connection->awaiting_reply ? connection : nullptr;
}

}  // namespace rdmachan::soft
