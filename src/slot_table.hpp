// The engine's table of outstanding operations. A ticket names one slot and the generation it
// was claimed in (generation << 32 | slot), so a stale ticket never takes a later operation's
// completion; the ticket is the work requests' wr_id, the last request's with kFinalRequest set.
// Sized at construction, and in DC grown by a peer's share at its first post (grow); the free
// slots are a stack.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/error.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::detail {

// The ticket of an operation that could not even get a slot; waiting for it, or taking it,
// gives the failure kNoSlotReason names.
inline constexpr std::uint64_t kNoTicket = ~0ull;
inline constexpr const char* kNoSlotReason =
    "every operation slot holds a result not taken yet (the engine has max_send_wr + max_recv_wr "
    "slots per peer, and a completed operation keeps its slot until its handle is waited for, "
    "polled to the end or dropped): take results before posting more";

// The last request of a batch carries its ticket with this bit set: only its completion ends the
// operation. Slots are numbered below kFinalRequest - 1, so kNoTicket names no slot.
inline constexpr std::uint64_t kFinalRequest = 1ull << 31;

// Generations count in 31 bits, so no ticket has bit 63 set: a wr_id with it names a receive
// buffer the engine owns (DC mode's shared receive queue), never an operation.
inline constexpr std::uint32_t kGenerationMask = 0x7fffffffu;
inline constexpr std::uint64_t kEngineReceiveBuffer = 1ull << 63;

// A send queue several peers share (a DC initiator): the requests of an operation posted there
// count against its depth as well as against their peer's budget, and an error on it fails it
// for every peer until it is recovered.
struct SharedSendQueue {
    std::uint32_t send_in_flight = 0;
    bool failed = false;  // in ERR: recovered once everything on it has completed
};

enum class SlotState : std::uint8_t { free, pending, done };

struct Slot {
    SlotState state = SlotState::free;
    bool error_seen = false;
    std::uint32_t generation = 0;
    Operation operation = Operation::send;
    std::uint32_t peer = 0;
    std::uint32_t send_requests = 0;     // held against the peer's send budget until done
    std::uint32_t scope = 0;             // 0: not in a scope
    std::uint64_t bytes = 0;             // what the requests carried (requester completions omit it)
    const char* not_posted = nullptr;    // set when the device refused the post
    SharedSendQueue* shared_queue = nullptr;  // where the requests went, when peers share it
    mlx5::Completion completion;
};

class SlotTable {
public:
    // Once, at the engine's construction. Throws when `capacity` slots could not be told apart
    // from kNoTicket.
    void allocate(std::uint64_t capacity) {
        if (capacity >= kFinalRequest - 1) throw Error("Engine: too many outstanding operations to track");
        slots_.resize(capacity);
        count_ = static_cast<std::uint32_t>(capacity);
        free_slots_.resize(capacity);
        // Slot 0 on top: an operation waited for before the next one is posted reuses one slot.
        for (std::uint64_t slot = capacity; slot-- > 0;) free_slots_[free_count_++] = static_cast<std::uint32_t>(slot);
    }

    // DC: `extra` slots more, for a peer's first post (Engine::first_post). The table may move:
    // the caller holds no slot reference. It grows by at least an eighth at a time, so that
    // contacting N peers allocates O(log N) times and leaves at most an eighth unused.
    void grow(std::uint32_t extra) {
        const std::uint64_t capacity = static_cast<std::uint64_t>(count_) + extra;
        if (capacity >= kFinalRequest - 1) throw Error("Engine: too many outstanding operations to track");
        if (capacity > slots_.capacity()) {
            const std::uint64_t reserved = std::max<std::uint64_t>(capacity, slots_.capacity() + slots_.capacity() / 8);
            slots_.reserve(reserved);
            free_slots_.reserve(reserved);
        }
        slots_.resize(capacity);
        free_slots_.resize(capacity);
        for (std::uint64_t slot = capacity; slot-- > count_;) free_slots_[free_count_++] = static_cast<std::uint32_t>(slot);
        count_ = static_cast<std::uint32_t>(capacity);
    }
    std::uint32_t size() const { return count_; }
    bool has_free() const { return free_count_ != 0; }
    Slot& operator[](std::uint32_t slot) { return slots_[slot]; }
    const Slot& operator[](std::uint32_t slot) const { return slots_[slot]; }
    // The slot a ticket names, whatever its state (the caller holds a live ticket).
    Slot& of(std::uint64_t ticket) { return slots_[static_cast<std::uint32_t>(ticket & (kFinalRequest - 1))]; }
    std::uint64_t ticket_of(std::uint32_t slot) const {
        return static_cast<std::uint64_t>(slots_[slot].generation) << 32 | slot;
    }

    // The caller saw has_free().
    std::uint64_t claim(std::uint32_t peer, Operation operation) {
        const std::uint32_t slot = free_slots_[--free_count_];
        Slot& entry = slots_[slot];
        entry.state = SlotState::pending;
        entry.error_seen = false;
        entry.operation = operation;
        entry.peer = peer;
        entry.send_requests = 0;
        entry.scope = 0;
        entry.bytes = 0;
        entry.not_posted = nullptr;
        entry.shared_queue = nullptr;
        // completion is not reset: finish() or a batch's first error writes it before anyone
        // reads it.
        return static_cast<std::uint64_t>(entry.generation) << 32 | slot;
    }
    void release(std::uint32_t slot) {
        Slot& entry = slots_[slot];
        entry.state = SlotState::free;
        entry.generation = (entry.generation + 1) & kGenerationMask;
        free_slots_[free_count_++] = slot;
    }
    // The operation a ticket names while it is not taken; nullptr for a stale ticket, kNoTicket
    // (its slot bits are kFinalRequest - 1, above every slot) and receive buffers' wr_ids.
    Slot* find(std::uint64_t ticket) {
        const auto slot = static_cast<std::uint32_t>(ticket & (kFinalRequest - 1));
        if (slot >= count_) return nullptr;
        Slot& entry = slots_[slot];
        if (entry.generation != static_cast<std::uint32_t>(ticket >> 32) || entry.state == SlotState::free) return nullptr;
        return &entry;
    }

private:
    std::vector<Slot> slots_;
    std::uint32_t count_ = 0;  // slots_.size(), without a division by sizeof(Slot)
    // A stack of the free slots' indices: free_slots_[0, free_count_) (sized once, no push_back).
    std::vector<std::uint32_t> free_slots_;
    std::uint32_t free_count_ = 0;
};

}  // namespace rdmachan::detail
