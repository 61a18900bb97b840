// The state of a MultiChannel's barriers (rdmachan/multi_channel.hpp, "Barriers"): dissemination
// over RDMA writes into each rank's barrier memory, one barrier at a time.
//
// The barrier memory, in 8-byte words:
//   [0]                this rank's barrier number: the source of every write, and what a peer
//                      reads after a timeout to learn how far this rank got
//   [1, 1 + rounds)    word 1 + k: the number of the last barrier whose round k reached this rank
//   [1 + rounds, ...)  one word per peer: where a timed-out barrier reads that peer's word 0
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "rdmachan/multi_channel.hpp"

namespace rdmachan::detail {

class Engine;
class PeerRegions;

class Barrier {
  public:
    // `memory`: barrier_memory_bytes(world) bytes, made by PreparedMultiChannel.
    Barrier(std::shared_ptr<Engine> engine, std::uint32_t rank, MemoryRegion memory);
    static std::uint32_t rounds_for(std::uint32_t world);
    static std::size_t memory_bytes(std::uint32_t world);
    std::uint32_t rounds() const { return rounds_; }

    // Where the peers' barrier memory is (learned in the Endpoint handshake, renewed by a
    // replacement); null when the handshake learned no regions.
    void set_peer_regions(const PeerRegions* regions) { regions_ = regions; }
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
    std::optional<BarrierResult> take_writes();
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
};

}  // namespace rdmachan::detail
