// The software device's objects as it holds them: completion queues, shared receive queues and
// queue pairs (RC, DC initiator, DC target), with their rings and the device's state for each.
// The public handles (device.hpp) point at these; DeviceCore keeps them in its tables. Under the
// device mutex unless a member says otherwise.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "transport/mlx5/rings.hpp"
#include "transport/soft/aligned_buffer.hpp"
#include "transport/soft/completion_ring.hpp"
#include "transport/soft/device.hpp"
#include "transport/soft/reusing_ring.hpp"

namespace rdmachan::soft {

using Clock = std::chrono::steady_clock;

struct CompletionQueueContext {
    // The entries, then the 64-byte doorbell block (its records, then the producer index:
    // completion_ring.hpp), in one allocation from the arena when it can be.
    std::unique_ptr<AlignedBuffer> buffer;
    mlx5::CompletionQueueRing ring;
    std::atomic<bool> overrun{false};
    // Set (never cleared) when an RC QP whose receives a peer may complete (zero-hop receives)
    // publishes this CQ as its receive CQ: from then on this device writes its CQEs under the
    // receive lock. Until then it has no other writer, and takes no lock (a locked instruction
    // right after a zero-hop write's store into the peer's memory waits for that store).
    bool peer_writable = false;
    // Created for CQE compression (held_completions.hpp): the ring's compressed_cqes.
    bool compressed = false;
    // Readable once an armed CQ gets a CQE it was armed for (completion_ring.hpp): the soft
    // completion channel. Closed with the context.
    int event_descriptor = -1;
    // The UAR page's CQ doorbell an arm writes (mlx5::CompletionQueueRing::uar, register at 0x20):
    // memory nobody reads, as BlueFlame's; the arm word the device takes is the doorbell record's.
    alignas(64) std::uint8_t uar[64] = {};
    CompletionQueueContext() = default;
    CompletionQueueContext(const CompletionQueueContext&) = delete;
    CompletionQueueContext& operator=(const CompletionQueueContext&) = delete;
    ~CompletionQueueContext();
    CompletionRingView view() const { return CompletionRingView::of(ring, event_descriptor); }
};

struct SharedReceiveQueueContext {
    // The WQEs, and the 64-byte doorbell block (the record, then the consumption word), from the
    // arena when it has room: same-host DC initiators then consume WQEs too (zero_hop_receive.cpp).
    std::unique_ptr<AlignedBuffer> buffer;
    std::unique_ptr<AlignedBuffer> doorbell;
    mlx5::SharedReceiveQueueRing ring;
    std::uint32_t protection_domain = 0;
    // Published through a DCT (PublishedTable::publish_queue_pair): peers consume its WQEs under
    // the receive lock, so the device does too. Under the device mutex.
    bool peer_consumable = false;
    // The consumption word (kReceiveConsumedWord of the doorbell block): the WQE consumed next
    // (following the links) in its high 16 bits, the WQEs consumed (compared with the 16-bit
    // doorbell counter) in its low 16. One word, so a consumer dying between two stores cannot
    // leave half a consumption, and the receive journal tells a consumed WQE by it changing.
    std::uint32_t consumption() const {
        return __atomic_load_n(ring.doorbell_record + kReceiveConsumedWord, __ATOMIC_ACQUIRE);
    }
    std::uint32_t next_index() const { return consumption() >> 16; }
    std::uint16_t consumed() const { return static_cast<std::uint16_t>(consumption()); }
    void set_consumption(std::uint32_t next_index, std::uint16_t consumed) {
        __atomic_store_n(ring.doorbell_record + kReceiveConsumedWord, next_index << 16 | consumed, __ATOMIC_RELEASE);
    }
};

// One request the initiator sent and has not seen answered.
struct InFlight {
    // A slot of the ring of requests in flight comes with room for a few local targets: the
    // doorbell thread decodes reads into its next slot (and may leave them to the progress
    // thread), so a slot's first use must not allocate there.
    InFlight() { local_targets.reserve(4); }
    std::uint32_t psn = 0;
    std::uint16_t wqe_counter = 0;  // the WQE's first WQEBB index
    std::uint8_t opcode = 0;
    bool signaled = false;
    std::vector<std::uint8_t> frame;  // kept for RNR retries
    // Where read data or an atomic result lands (validated when the WQE was executed).
    std::vector<std::pair<std::uint8_t*, std::uint32_t>> local_targets;
    // Each data segment's address is where its bytes go (no indirect key in between): the poller
    // of a scatter-to-CQE completion copies to the addresses the WQE names.
    bool targets_as_posted = true;
    std::uint32_t length = 0;
    // Same host: the frame carries where the payload is (or, for a read, goes) in this process;
    // the responder moves it with cross-memory attach, so a read's response carries no data.
    bool by_reference = false;
};

enum class Transport : std::uint8_t { reliable_connected, dc_initiator, dc_target };

// The initiator side of a DC request, as a DCT tells its initiators apart.
struct DcInitiatorAddress {
    std::array<std::uint8_t, 16> gid{};
    std::uint16_t lid = 0;
    std::uint32_t qpn = 0;
    auto operator<=>(const DcInitiatorAddress&) const = default;
};

struct QueuePairContext {
    std::uint32_t qpn = 0;
    Transport transport = Transport::reliable_connected;
    std::uint32_t protection_domain = 0;
    std::uint32_t user_index = 0;
    CompletionQueueContext* send_cq = nullptr;
    CompletionQueueContext* recv_cq = nullptr;
    SharedReceiveQueueContext* srq = nullptr;
    // Created with scatter-to-CQE (inline_scatter.cpp): a small received send, and a small
    // read's or atomic's answer, go into the CQE instead of the buffers.
    bool scatter_to_cqe = false;
    // Receive queue, then send queue (as libmlx5 lays it out); for an RC QP then the 64-byte
    // doorbell block, in one allocation from the arena when it can be.
    std::unique_ptr<AlignedBuffer> buffer;
    std::unique_ptr<AlignedBuffer> doorbell;  // a DCI's doorbell block (dc.cpp); else null
    mlx5::SendQueueRing send_ring;
    mlx5::ReceiveQueueRing receive_ring;
    std::unique_ptr<AlignedBuffer> blueflame;

    QueuePairState state = QueuePairState::reset;
    std::uint32_t access = 0;
    ReadyToReceiveAttributes receive_attributes;
    ReadyToSendAttributes send_attributes;

    std::uint32_t executed = 0;        // WQEBB index the device reads next (16-bit on the wire)
    // Receive WQEs consumed: a word of the doorbell block, which a same-host peer's zero-hop
    // receive also advances, under the receive lock (completion_ring.hpp).
    std::uint32_t receive_consumed() const {
        return __atomic_load_n(receive_ring.doorbell_record + kReceiveConsumedWord, __ATOMIC_ACQUIRE);
    }
    void set_receive_consumed(std::uint32_t consumed) {
        __atomic_store_n(receive_ring.doorbell_record + kReceiveConsumedWord, consumed, __ATOMIC_RELEASE);
    }
    std::uint32_t next_psn = 0;        // initiator
    std::uint32_t expected_psn = 0;    // responder
    ReusingRing<InFlight> in_flight;  // keeps its slots' frames: the doorbell thread allocates nothing
    Clock::time_point retry_at{};      // RNR: when to resend from in_flight.front()
    bool waiting_rnr = false;
    std::uint32_t rnr_retries_left = 0;
    Clock::time_point progress_deadline{};  // when the oldest in-flight request is sent again
    std::uint32_t transport_retries_left = 0;  // resends left before transport retry exceeded
    std::atomic<bool> doorbell_pending{false};
    // Whether the remote QP's device published its table to us (a zero-hop write may be
    // possible): lets the doorbell thread skip the device mutex for every other QP.
    std::atomic<bool> zero_hop_remote{false};
    // A UMR WQE waits for the requests before it to be answered (it completes in order); the
    // last answer rings the doorbell again.
    bool umr_waits_for_answers = false;
    // A zero-hop send or write with immediate was refused for a passing reason (no receive
    // posted, the target's receive lock busy, its CQ full) and took the request path: the WQEs
    // after it wait until the requests in flight are answered, then go zero-hop again. Sent on at
    // once, each would find a request in flight (zero-hop needs none) and take the request path
    // too, and the QP would stay there as long as the application kept a request outstanding
    // (rdmachan-bench's 8 B send bandwidth: 1-3 MB/s in 3 of 14 sweeps, against 11-12). The last
    // answer rings the doorbell again.
    bool zero_hop_waits_for_answers = false;

    // DC initiator: whether the current target (receive_attributes.remote) has seen this DCI's
    // first request since it switched to it, so the next request carries the connect mark.
    bool dc_connected = false;
    // DC target: its key, how many requests a wrong key refused, and the PSN expected next
    // from each initiator connected to it.
    std::uint64_t dc_access_key = 0;
    std::uint32_t dc_key_violations = 0;
    std::map<DcInitiatorAddress, std::uint32_t> dc_expected_psn;
};

}  // namespace rdmachan::soft
