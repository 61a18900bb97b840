// Writing CQEs into a completion queue's ring, as the hardware writes them. Two kinds of writer
// use it: the device that owns the CQ, and a same-host peer that completes a zero-hop receive
// into it (zero_hop_receive.cpp) through its mapping of the owner's arena. Once a peer may write
// the CQ, both write under the owner's receive lock (published_table.hpp), so the producer index
// has one writer at a time.
//
// The producer index is not the device's private counter but a word of the CQ's doorbell block
// (which the consumer never reads past its two records), so that every writer sees the same one.
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstring>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/rings.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::soft {

// Words of the 64-byte doorbell blocks the software device keeps beside its rings, after the
// records the consumer uses ([0] and [1]): the CQ's producer index, and the receive WQEs an RC
// QP's receive queue has consumed. Shared with same-host peers when the block is in the arena.
inline constexpr std::uint32_t kCqProducerIndexWord = 8;
inline constexpr std::uint32_t kReceiveConsumedWord = 8;
// A CQ's completion events (the NIC's event queue and the completion channel, reduced to what a
// consumer sees): the arm the device took from the last arm doorbell, cleared by the writer that
// raises the event, so that one arm raises one event; and the producer index just past the last
// CQE a solicited arm wakes for (a solicited one, or an error).
// The arm word is 0 (none), or the arm's kind (the low byte: one of the two below) and the
// consumer index it was taken at (bits 31:8). A CQE raises the event only when it is at or past
// that index, as a NIC compares a CQE's index with the arm's; and the writer clears the exact word
// it judged, so a writer that looks at the arm late (the consumer polled its CQE and armed again
// for the next meanwhile) can neither wake the new arm nor clear it.
inline constexpr std::uint32_t kCqArmedWord = 9;
inline constexpr std::uint32_t kCqLastSolicitedWord = 10;
inline constexpr std::uint32_t kArmedForNext = 1;
inline constexpr std::uint32_t kArmedForSolicited = 2;
inline constexpr std::uint32_t arm_word(std::uint32_t kind, std::uint32_t consumer_index) {
    return (consumer_index & 0xffffff) << 8 | kind;
}

// Makes a CQ's event descriptor (an eventfd) readable.
inline void signal_event(int descriptor) {
    if (descriptor < 0) return;
    const std::uint64_t one = 1;
    // The counter only saturates after 2^64 - 1 events without a read: nothing to handle.
    [[maybe_unused]] const ssize_t written = ::write(descriptor, &one, sizeof one);
}

// Where one CQ's ring lies in the writing process.
struct CompletionRingView {
    std::uint8_t* buffer = nullptr;
    std::uint32_t cqe_count = 0;  // a power of two
    std::uint32_t cqe_size = 64;  // the mlx5_cqe64 is the last 64 bytes of each entry
    std::uint32_t* doorbell_record = nullptr;  // [0] the consumer index, [kCqProducerIndexWord] ours
    int event_descriptor = -1;                 // the CQ's eventfd in the writing process

    static CompletionRingView of(const mlx5::CompletionQueueRing& ring, int event_descriptor) {
        return {ring.buffer, ring.cqe_count, ring.cqe_size, ring.doorbell_record, event_descriptor};
    }
    std::uint32_t producer_index() const {
        return __atomic_load_n(doorbell_record + kCqProducerIndexWord, __ATOMIC_RELAXED);
    }
    // Whether one more CQE would overwrite one the consumer has not read.
    bool full() const { return !has_room(1); }
    // Whether `count` more CQEs fit without overwriting one the consumer has not read.
    bool has_room(std::uint32_t count) const {
        const std::uint32_t consumer =
            mlx5::big_to_host32(mlx5::load_acquire32(doorbell_record + mlx5::kCqSetConsumerIndex)) & 0xffffff;
        return ((producer_index() - consumer) & 0xffffff) + count <= cqe_count;
    }
    // The mlx5_cqe64 of the entry at free-running index `index`, as it is.
    std::uint8_t* entry_at(std::uint32_t index) const {
        std::uint8_t* entry = buffer + static_cast<std::size_t>(index & (cqe_count - 1)) * cqe_size;
        return entry + (cqe_size - mlx5::kCqeSize64);
    }
    // The next entry's mlx5_cqe64, as it is.
    std::uint8_t* next_entry() const { return entry_at(producer_index()); }
    // The next entry's mlx5_cqe64, every byte but op_own cleared (the poller may be reading
    // op_own); the caller checked full() first.
    std::uint8_t* claim() const {
        std::uint8_t* cqe64 = next_entry();
        std::memset(cqe64, 0, mlx5::kCqeOpOwn);
        return cqe64;
    }
    // The op_own byte of the next entry once it holds a CQE of `cqe_opcode`: the owner bit
    // flips on every pass over the ring, and the SE bit (bit 1) says the request that completed
    // a receive asked for a solicited event, as a ConnectX writes it (mlx5-facts.md §5).
    // `format` (bits 3:2): 1 or 2 for a CQE carrying data (scatter-to-CQE), 0 otherwise.
    std::uint8_t owner_byte(std::uint8_t cqe_opcode, bool solicited = false, std::uint8_t format = 0) const {
        const std::uint8_t owner = (producer_index() / cqe_count) & 1;
        return static_cast<std::uint8_t>(cqe_opcode << 4 | format << 2 | (solicited ? mlx5::kCqeSolicitedEvent : 0) | owner);
    }
    // The body is written; op_own last with a release store, so a poller that sees the new
    // owner bit sees a complete CQE (mlx5-facts.md §5). Then the producer index moves on: the
    // two steps apart for the receive journal (published_table.hpp), which must tell a CQE the
    // consumer can already see from one it cannot.
    void make_visible(std::uint8_t* cqe64, std::uint8_t cqe_opcode, bool solicited = false, std::uint8_t format = 0) const {
        mlx5::store_release8(cqe64 + mlx5::kCqeOpOwn, owner_byte(cqe_opcode, solicited, format));
    }
    void advance(std::uint32_t count = 1) const {
        __atomic_store_n(doorbell_record + kCqProducerIndexWord, producer_index() + count, __ATOMIC_RELEASE);
    }
    // After advance(): raises the CQ's event if it is armed for this CQE, as a NIC does: once
    // per arm; for any CQE when armed for the next one; when armed for solicited ones, for a
    // CQE `solicited` (a receive of a request with the solicited-event bit) or an error CQE.
    void raise_event(std::uint8_t cqe_opcode, bool solicited) const {
        if (solicited || is_error(cqe_opcode)) {
            __atomic_store_n(doorbell_record + kCqLastSolicitedWord, producer_index(), __ATOMIC_SEQ_CST);
        }
        // Dekker's order with the arm (take_arm): this side stores the producer index, then reads
        // the arm; the arm stores itself, then reads the producer index. One of the two sees the
        // other, so a CQE written while the consumer arms is never missed.
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        raise_for(arm_it_covers(cqe_opcode, solicited));
    }
    // raise_event's two steps, apart for the tests that pause a writer between them. The arm a
    // CQE just written (or a later one of another writer) raises: the arm word read now if this
    // CQE is at or past its consumer index and of a kind it wakes for, else 0.
    std::uint32_t arm_it_covers(std::uint8_t cqe_opcode, bool solicited) const {
        const std::uint32_t armed = __atomic_load_n(doorbell_record + kCqArmedWord, __ATOMIC_SEQ_CST);
        if (armed == 0) return 0;
        if ((armed & 0xff) == kArmedForSolicited && !solicited && !is_error(cqe_opcode)) return 0;
        const std::uint32_t arm_index = armed >> 8;
        if (((producer_index() - 1 - arm_index) & 0xffffff) >= 0x800000) return 0;  // written before the arm's index
        return armed;
    }
    // Clears that arm, if it is still the one taken, and signals its event.
    void raise_for(std::uint32_t armed) const {
        if (armed == 0) return;
        if (__atomic_compare_exchange_n(doorbell_record + kCqArmedWord, &armed, 0u, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST)) {
            signal_event(event_descriptor);
        }
    }
    void publish(std::uint8_t* cqe64, std::uint8_t cqe_opcode, bool solicited, std::uint8_t format = 0) const {
        make_visible(cqe64, cqe_opcode, solicited, format);
        advance();
        raise_event(cqe_opcode, solicited);
    }
    // The consumer's arm doorbell: arms the CQ for CQEs past `consumer_index` (the arm doorbell
    // record's), and raises the event at once when one the arm wakes for is already there.
    void take_arm(bool solicited_only, std::uint32_t consumer_index) const {
        const std::uint32_t arm = arm_word(solicited_only ? kArmedForSolicited : kArmedForNext, consumer_index);
        __atomic_store_n(doorbell_record + kCqArmedWord, arm, __ATOMIC_SEQ_CST);
        __atomic_thread_fence(__ATOMIC_SEQ_CST);
        const std::uint32_t written = (__atomic_load_n(doorbell_record + kCqProducerIndexWord, __ATOMIC_SEQ_CST) - consumer_index) & 0xffffff;
        bool waiting = written != 0;
        if (solicited_only) {
            const std::uint32_t last = (__atomic_load_n(doorbell_record + kCqLastSolicitedWord, __ATOMIC_SEQ_CST) - consumer_index) & 0xffffff;
            waiting = last != 0 && last <= written;
        }
        if (waiting) raise_for(arm);
    }

private:
    static bool is_error(std::uint8_t cqe_opcode) {
        return cqe_opcode == mlx5::kCqeRequesterError || cqe_opcode == mlx5::kCqeResponderError;
    }
};

// A successful responder CQE (a receive consumed by a send or an RDMA write with immediate).
struct ResponderCompletion {
    std::uint8_t cqe_opcode = 0;
    std::uint16_t wqe_counter = 0;
    std::uint32_t byte_count = 0;
    std::uint32_t immediate = 0;
    std::uint32_t source_qpn = 0;
    std::uint16_t source_lid = 0;
    bool global_route = false;
    std::uint32_t user_index = 0;  // the responder QP's
    std::uint32_t qpn = 0;         // the responder QP
    bool solicited = false;        // the request asked for a solicited event
};

inline void fill_responder_cqe(std::uint8_t* cqe64, const ResponderCompletion& completion) {
    using namespace rdmachan::mlx5;
    store_big16(cqe64 + kCqeSlid, completion.source_lid);
    // flags_rqpn bits 29:28 are nonzero when the packet came with a GRH (libmlx5 and the kernel
    // report it as the GRH flag). On RoCE the NIC also puts the L3 type in bits 25:24, which
    // overlap the IB SL; they stay 0 here (plain GRH), so the SL reads 0 as it was sent.
    const std::uint32_t global_route_header = completion.global_route ? 1u << 28 : 0u;
    store_big32(cqe64 + kCqeFlagsRemoteQpn, global_route_header | (completion.source_qpn & 0xffffff));
    store_big32(cqe64 + kCqeSrqnUserIndex, completion.user_index & 0xffffff);
    if (completion.cqe_opcode == kCqeResponderWriteImmediate || completion.cqe_opcode == kCqeResponderSendImmediate) {
        store_big32(cqe64 + kCqeImmediateInvalidatePkey, completion.immediate);
    }
    store_big32(cqe64 + kCqeByteCount, completion.byte_count);
    store_big32(cqe64 + kCqeSopDropQpn, completion.qpn);
    store_big16(cqe64 + kCqeWqeCounter, completion.wqe_counter);
}

}  // namespace rdmachan::soft
