// The state of a MultiChannel's barriers (rdmachan/multi_channel.hpp, "Barriers"), one barrier
// at a time: in a fixed world, dissemination over RDMA writes into each rank's barrier memory;
// among members that come and go (etcd), one write to every member (multi_barrier_members.cpp).
//
// The barrier memory of a fixed world, in 8-byte words:
//   [0]                this rank's barrier number: the source of every write, and what a peer
//                      reads after a timeout to learn how far this rank got
//   [1, 1 + rounds)    word 1 + k: the number of the last barrier whose round k reached this rank
//   [1 + rounds, ...)  one word per peer: where a timed-out barrier reads that peer's word 0
// Of a member (memory_bytes_for_members):
//   [0]                this member's barrier number
//   [1, 1 + capacity)  word 1 + j: what member j wrote here at its last barrier with this one
//   [1 + capacity, ..) word 1 + capacity + j: what this member writes to member j (the source)
// A member's word is the pairing's identity (Membership::pair_identity, high 32 bits) and how
// many barriers of this pairing its writer entered (low 32 bits): a word from an earlier pairing
// of the same id, or an earlier session, never counts.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "rdmachan/multi_channel.hpp"

namespace rdmachan::detail {

class Engine;
class Membership;
class PeerRegions;

class Barrier {
  public:
    // `memory`: barrier_memory_bytes(world) bytes, made by PreparedMultiChannel.
    Barrier(std::shared_ptr<Engine> engine, std::uint32_t rank, MemoryRegion memory);
    static std::uint32_t rounds_for(std::uint32_t world);
    static std::size_t memory_bytes(std::uint32_t world);
    static std::size_t memory_bytes_for_members(std::uint32_t capacity);
    std::uint32_t rounds() const { return rounds_; }
    // Every word of barrier memory, both layouts: a count that one aligned RDMA write lands whole.
    static constexpr std::uint64_t kWordBytes = sizeof(std::uint64_t);

    // Where the peers' barrier memory is (learned in the Endpoint handshake, renewed by a
    // replacement); null when the handshake learned no regions.
    void set_peer_regions(const PeerRegions* regions) { regions_ = regions; }
    // Members that come and go: barriers are among the members ready when each starts, and
    // `memory` (memory_bytes_for_members) replaces the fixed world's.
    void set_membership(std::shared_ptr<Membership> membership, MemoryRegion memory);
    // Begins the next barrier: its number goes into word 0 and round 0 is posted. Throws
    // rdmachan::Error naming `call` when one is in progress or a peer's barrier memory is unknown.
    void start(const char* call, std::uint32_t scope);
    bool running() const { return running_; }
    std::uint64_t number() const { return number_; }
    std::uint32_t scope() const { return scope_; }
    // Never waits: takes the words and completions that arrived and posts the rounds that may go.
    std::optional<BarrierResult> step();
    // Steps until the barrier ends or its deadline passes (then names who did not arrive).
    BarrierResult finish();

  private:
    std::uint64_t* word(std::size_t index) const;
    // Members (multi_barrier_members.cpp).
    void start_members(const char* call);
    std::optional<BarrierResult> step_members();
    BarrierResult give_up_members();
    void end_member_writes(std::chrono::milliseconds grace, std::vector<BarrierFailure>& failures);
    std::optional<BarrierResult> take_writes();
    // Waits out (or flushes) the rounds' writes still held by the device, before the barrier ends.
    void end_writes(std::chrono::milliseconds grace);
    BarrierResult give_up();
    // A write or read's result, waiting at most `grace`; after that its peer's queue pair is
    // failed and flushed so the device holds none of the barrier's memory (as PendingWork::wait).
    WorkResult take_or_flush(std::uint64_t ticket, std::chrono::milliseconds grace);
    void backoff(std::uint32_t& polls) const;

    std::shared_ptr<Engine> engine_;
    std::uint32_t rank_ = 0;
    std::uint32_t world_ = 1;
    std::uint32_t rounds_ = 0;
    MemoryRegion memory_;
    const PeerRegions* regions_ = nullptr;
    bool running_ = false;
    std::uint32_t scope_ = 0;
    std::uint64_t number_ = 0;
    std::uint32_t round_ = 0;   // the round whose word this rank waits for
    std::uint32_t posted_ = 0;  // rounds whose write was posted
    std::chrono::steady_clock::time_point until_;
    // By round, sized once: where round k's write goes, and its ticket until taken.
    std::vector<std::uint32_t> targets_;
    std::vector<RemoteMemoryRegion> remotes_;
    std::vector<std::uint64_t> tickets_;
    // Members: by member id.
    std::shared_ptr<Membership> membership_;
    std::vector<std::uint64_t> pairing_;       // the pairing the count below belongs to
    std::vector<std::uint32_t> entered_;       // barriers of that pairing this member entered
    std::vector<std::uint32_t> participants_;  // this barrier's members, this one excluded
    std::vector<std::uint64_t> member_tickets_;
    std::vector<std::uint8_t> awaited_;        // still to arrive (1), or arrived or gone (0)
    bool member_writes_posted_ = false;
};

}  // namespace rdmachan::detail
