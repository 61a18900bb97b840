// A peer's mapping of a device's published table (published_table.hpp says what the table holds
// and why): the initiator's side of zero-hop writes, reads and receives. It reads entries under
// their seqlocks, holds a region while it writes it, maps the target's arena, and takes the
// target's receive lock (receive_lock.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "transport/soft/published_table.hpp"
#include "transport/soft/receive_lock.hpp"

namespace rdmachan::soft {

// The initiator's side: a read-write mapping of a peer's table (reads, and the in-use counters).
class PeerTable {
  public:
    // Maps the table of process `pid` from its descriptor and claims a holder slot in it;
    // nullopt-like: valid() false, with the reason in why_not().
    PeerTable(const PeerProcess& peer, int descriptor);
    // This process's own table, and the arena its device publishes in it, read as a peer reads
    // them (zero-hop requests of a QP connected to its own device); nothing is mapped again.
    PeerTable(PublishedTable& own, const SharedArena& arena);
    ~PeerTable();
    PeerTable(const PeerTable&) = delete;
    PeerTable& operator=(const PeerTable&) = delete;

    bool valid() const { return layout_ != nullptr; }
    const char* why_not() const { return why_not_; }

    std::optional<PublishedQueuePairView> read_queue_pair(std::uint32_t qpn) const;
    // [arena_offset - 1, + length) of the target's arena in this process (the entry's
    // arena_offset, as published), or nullptr: the target has no arena, it cannot be mapped, or
    // the range does not lie below the file size the target published. The arena is mapped on
    // first use (pidfd_getfd through the target's pidfd, as the table was) and stays mapped.
    std::uint8_t* arena_range(std::uint64_t arena_offset, std::uint64_t length);
    // Maps the target's arena now, if it has published one (arena_range would on first use).
    void map_arena() { (void)arena_range(1, 0); }
    // The target's CQ event descriptor `published` (an entry's receive_cq_event_descriptor) as a
    // descriptor of this process, or -1 (none published, or pidfd_getfd refused). Taken on first
    // use, through the target's pidfd as the arena is, and kept until this table goes.
    int event_descriptor(std::uint32_t published);
    // The target simulates a network partition (simulate_partition in its process).
    bool partitioned() const { return layout_->partitioned.load(std::memory_order_acquire) != 0; }
    // The target's receive lock (receive_lock.hpp: a peer's side).
    ReceiveLock& receive_lock() { return receive_lock_; }

    // Holds a region for one write: the key is stored in this mapping's holder slot first, then
    // the entry read, so a deregistration either is seen here or waits for release().
    class RegionUse {
      public:
        RegionUse() = default;
        ~RegionUse() { release(); }
        RegionUse(const RegionUse&) = delete;
        RegionUse& operator=(const RegionUse&) = delete;
        const std::optional<PublishedRegionView>& entry() const { return entry_; }
        void release();

      private:
        friend class PeerTable;
        PublishedHolder* holder_ = nullptr;
        std::optional<PublishedRegionView> entry_;
    };
    // Fills `use` with the entry of `key` (empty when absent, changing too fast, or another key).
    void use_region(std::uint32_t key, RegionUse& use) const;

  private:
    PublishedLayout* layout_ = nullptr;
    ReceiveLock receive_lock_;           // of layout_
    PublishedHolder* holder_ = nullptr;  // this mapping's slot in the target's table
    const char* why_not_ = nullptr;
    const PeerProcess* peer_ = nullptr;       // the target, held by a pidfd (outlives this table)
    std::uint8_t* arena_ = nullptr;           // its arena, once mapped
    bool arena_failed_ = false;               // mapping it failed: not tried again
    const SharedArena* own_arena_ = nullptr;  // this process's own table: its device's arena
    // Event descriptors taken from the target: its number plus 1, and ours.
    std::vector<std::pair<std::uint32_t, int>> event_descriptors_;
    // Claims a holder slot in layout_: a free one, else one whose process exited.
    bool claim_holder();
};

}  // namespace rdmachan::soft
