// The software device's statistics: what its tests and benchmarks read to tell which path an
// operation took (zero-hop, by reference, from the doorbell thread), and how often the device
// connected, coalesced or resent. One per device (DeviceCore::statistics); Device's accessors
// read them.
#pragma once

#include <atomic>
#include <cstdint>

namespace rdmachan::soft {

struct DeviceStatistics {
    // Counts one more in a statistic that only code holding the device's mutex writes: one writer
    // at a time, so a plain load and store. A locked add would also make the thread wait until its
    // earlier stores are visible, among them a zero-hop write's store into the peer's memory.
    static void count_one(std::atomic<std::uint64_t>& counter) {
        counter.store(counter.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
    }
    // Requests whose payload the responder moved by cross-memory attach (this device responding).
    std::atomic<std::uint64_t> transfers_by_reference{0};
    // RDMA writes this device, as initiator, executed zero-hop (zero_hop.cpp).
    std::atomic<std::uint64_t> zero_hop_writes{0};
    // Of those, the ones that were a memcpy into the target's arena (shared_arena.hpp).
    std::atomic<std::uint64_t> zero_hop_arena_writes{0};
    // Sends and RDMA writes with immediate this device, as initiator, executed zero-hop.
    std::atomic<std::uint64_t> zero_hop_receives{0};
    // RDMA reads this device, as initiator, executed zero-hop, and of those the memcpys.
    std::atomic<std::uint64_t> zero_hop_reads{0};
    std::atomic<std::uint64_t> zero_hop_arena_reads{0};
    // Atomics this device, as initiator, executed zero-hop.
    std::atomic<std::uint64_t> zero_hop_atomics{0};
    // Doorbells of a QP with a zero-hop remote whose WQEs the ringing thread left to the progress
    // thread (its mutex was taken, or a WQE could not go zero-hop): written by several threads.
    std::atomic<std::uint64_t> doorbells_left_to_progress{0};
    // WQEs this device executed on the doorbell thread by send_from_doorbell
    // (doorbell_requests.cpp).
    std::atomic<std::uint64_t> doorbell_requests{0};
    // Plain-write ACKs not sent because a later ACK of the same QP covered them
    // (respond_coalescing).
    std::atomic<std::uint64_t> coalesced_acknowledgements{0};
    // CQEs written in compressed sessions, and the sessions (held_completions.hpp).
    std::atomic<std::uint64_t> compressed_cqes{0};
    std::atomic<std::uint64_t> compressed_sessions{0};
    // progress() calls that read and handled a connection's events (caller_progress.cpp).
    std::atomic<std::uint64_t> caller_progress_turns{0};
    // Times this device, as requester, resent what a QP had in flight because no response came
    // within the ACK timeout (requester.cpp).
    std::atomic<std::uint64_t> ack_timeout_resends{0};
    // Connections to other devices this device began (at RTS in the background, or for a
    // request), those that failed before their hello was answered, and the hellos answered.
    std::atomic<std::uint64_t> connects_started{0};
    std::atomic<std::uint64_t> connects_failed{0};
    std::atomic<std::uint64_t> answered_hellos{0};
};

}  // namespace rdmachan::soft
