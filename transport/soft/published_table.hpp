// The zero-hop write's shared table: what a software device publishes about itself,
// as a target, in shared memory its same-host peers map, so that an initiator's doorbell thread
// can run the responder's checks for an RDMA write itself and move the bytes with
// process_vm_writev, with no thread of the target involved.
//
// The table lives in a memfd (one per device, made at open). A peer maps it by taking a copy of
// the descriptor with pidfd_getfd, through the pidfd it holds for the target (same_host.hpp), the
// number from the target's hello reply: the kernel allows that only to a process that may ptrace
// the target (the same permission cross-memory attach needs), so the table is readable exactly by
// the processes that could write the target's memory anyway, and a reused pid cannot hand over
// another process's descriptor.
//
// Every entry is under a sequence counter (a seqlock): the target's device, the only writer
// (under its device mutex), makes the counter odd, changes the fields, makes it even again;
// readers copy the fields and retry if the counter was odd or moved, a bounded number of times,
// and never wait.
//
// Deregistration must never return while a peer may still write the region. Each peer that maps
// the table claims a holder slot (its pid); a zero-hop write stores the key it is about to use in
// its slot before it reads the region's entry and clears it once its write returned.
// Deregistration clears the entry, then waits until no slot holds the key: a slot whose process
// has exited is reclaimed at once (no thread of it can still be in a write); a live process that
// holds the key past the deadline (stopped between its check and its write: SIGSTOP, a debugger)
// makes the deregistration fail, naming it, and the region stays registered (ibv_dereg_mr's
// EBUSY). One slot per mapping is enough: a device's zero-hop writes run under its device mutex,
// one at a time.
//
// Zero-hop receives (zero_hop_receive.cpp): a send or an RDMA write with immediate consumes the
// target's receive WQE and writes the target's CQE. An RC QP's receive queue and doorbell block,
// a DCT's SRQ and its doorbell block, and their CQs, live in the target's arena, and the entry
// says where. An SRQ's WQEs are consumed under the lock by everyone, its own device included
// (many DCIs share it, so no request in flight keeps others away). Every CQE producer of the
// target (its own device, and each peer completing a zero-hop receive into it) writes under the
// table's receive lock, a word holding the pid of the process that holds it: a peer takes it only
// by compare-and-swap, a bounded number of times (it never waits longer: on a lock still busy the
// request path carries the request),
// the target's device waits for it (a peer holds it for a few loads and stores) and takes it over
// from a holder whose process has exited. The target also changes a QP's entry under it, so that
// a peer holding the lock sees a QP that is still ready and has not been flushed. (A robust
// process-shared pthread mutex cost about 150 ns more per CQE: rdmachan-bench's 8 B write.)
//
// A peer can die inside the lock, between consuming the receive and publishing its CQE. So,
// before its first store, it writes what it is about to do into the table's receive journal; the
// target's device, taking the lock over from a holder that exited, finishes from the journal
// what the holder began (the bytes had all moved before the lock was taken, so the message did
// arrive): a receive consumed gets its CQE, exactly once; a receive not yet consumed stays posted.
// The device takes the lock over when it next needs it, or when the holder's connection closes
// and the holder's process has then exited (DeviceCore::connection_closed watches its pidfd).
// The lock and its journal are a type of their own (receive_lock.hpp); this file holds the
// table and its writer (PublishedTable); a peer's mapping is peer_table.hpp (PeerTable).
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "transport/soft/completion_ring.hpp"
#include "transport/soft/receive_lock.hpp"

namespace rdmachan::soft {

struct QueuePairContext;
class PeerProcess;
class SharedArena;

inline constexpr std::uint32_t kPublishedRegionSlots = 8192;
inline constexpr std::uint32_t kPublishedQueuePairSlots = 4096;
// Peer mappings that can write zero-hop at once; a peer finding none free uses the request path.
inline constexpr std::uint32_t kPublishedHolderSlots = 256;

// A region entry's fields as a reader copied them.
struct PublishedRegionView {
    std::uint32_t key = 0;
    std::uint32_t protection_domain = 0;
    std::uint32_t access = 0;
    std::uint64_t addr = 0;
    std::uint64_t length = 0;
    std::uint64_t arena_offset = 0;  // where the region starts in the target's arena, plus 1; 0: not in it
};

// What an entry of the queue pairs' table is: an RC QP, or a DC target (its number in the same
// space), which DC initiators write to, read from and send to zero-hop (a DCT's receive side is
// its SRQ).
inline constexpr std::uint32_t kPublishedReliableConnected = 0;
inline constexpr std::uint32_t kPublishedDcTarget = 1;

// An RC queue pair's or a DCT's fields a responder checks, as a reader copied them.
struct PublishedQueuePairView {
    std::uint32_t qpn = 0;
    std::uint32_t transport = kPublishedReliableConnected;
    std::uint64_t dc_key = 0;  // a DCT's access key
    std::uint32_t state = 0;  // QueuePairState
    std::uint32_t access = 0;
    std::uint32_t protection_domain = 0;
    std::uint32_t remote_qpn = 0;
    std::uint16_t remote_lid = 0;
    std::array<std::uint8_t, 16> remote_gid{};
    // For zero-hop receives: an RC QP's receive queue (none when it uses an SRQ or is not in the
    // arena) or a DCT's SRQ, its doorbell block, and the receive CQ, as arena offsets plus 1 (0:
    // not there); the protection domain its receive WQEs' keys belong to (an SRQ's own).
    std::uint32_t user_index = 0;
    std::uint32_t receive_protection_domain = 0;
    std::uint64_t receive_queue_offset = 0;
    std::uint32_t receive_wqe_count = 0;
    std::uint32_t receive_stride = 0;
    std::uint64_t doorbell_offset = 0;
    std::uint64_t receive_cq_offset = 0;           // its entries
    std::uint64_t receive_cq_doorbell_offset = 0;  // its doorbell block
    std::uint32_t receive_cqe_count = 0;
    std::uint32_t receive_cqe_size = 0;
    // The receive CQ's event descriptor in the target's process plus 1 (0: none): a peer that
    // writes a CQE into an armed CQ raises its event there (completion_ring.hpp).
    std::uint32_t receive_cq_event_descriptor = 0;
};

struct alignas(64) PublishedRegion {
    std::atomic<std::uint32_t> sequence;
    std::atomic<std::uint32_t> key;  // 0: empty
    std::atomic<std::uint32_t> protection_domain;
    std::atomic<std::uint32_t> access;
    std::atomic<std::uint64_t> addr;
    std::atomic<std::uint64_t> length;
    std::atomic<std::uint64_t> arena_offset;  // offset in the arena (shared_arena.hpp) plus 1; 0: not in it
};

// One peer mapping's holder slot (see the top of this file).
struct alignas(64) PublishedHolder {
    std::atomic<std::uint32_t> pid;      // 0: free; else the process that claimed it
    std::atomic<std::uint32_t> holding;  // the key its zero-hop write is using, 0 when none
};

struct alignas(64) PublishedQueuePair {
    std::atomic<std::uint32_t> sequence;
    std::atomic<std::uint32_t> qpn;  // 0: empty
    std::atomic<std::uint32_t> state;
    std::atomic<std::uint32_t> access;
    std::atomic<std::uint32_t> protection_domain;
    std::atomic<std::uint32_t> remote_qpn;
    std::atomic<std::uint32_t> remote_lid;
    std::atomic<std::uint32_t> remote_gid[4];
    std::atomic<std::uint32_t> user_index;
    std::atomic<std::uint32_t> receive_wqe_count;
    std::atomic<std::uint32_t> receive_stride;
    std::atomic<std::uint32_t> receive_cqe_count;
    std::atomic<std::uint32_t> receive_cqe_size;
    std::atomic<std::uint64_t> receive_queue_offset;
    std::atomic<std::uint64_t> doorbell_offset;
    std::atomic<std::uint64_t> receive_cq_offset;
    std::atomic<std::uint64_t> receive_cq_doorbell_offset;
    std::atomic<std::uint32_t> transport;  // kPublishedReliableConnected or kPublishedDcTarget
    std::atomic<std::uint64_t> dc_key;     // a DCT's access key
    std::atomic<std::uint32_t> receive_protection_domain;
    std::atomic<std::uint32_t> receive_cq_event_descriptor;
};

// What a peer's zero-hop receive does under the receive lock, written before its first store
// there (see the top of this file). Arena offsets plus 1, as the queue pair's entry gives them.
struct ReceiveIntent {
    std::uint32_t consumed_before = 0;  // the QP's consumed count before this receive
    std::uint32_t producer_before = 0;  // the receive CQ's producer index before its CQE
    std::uint32_t cqe_count = 0;
    std::uint32_t cqe_size = 0;
    std::uint64_t doorbell_offset = 0;     // the QP's doorbell block
    std::uint64_t cq_offset = 0;           // the receive CQ's entries
    std::uint64_t cq_doorbell_offset = 0;  // and its doorbell block
    ResponderCompletion completion;
};

struct ReceiveJournal {
    std::atomic<std::uint32_t> armed;  // 1 while `intent` describes a receive in progress
    ReceiveIntent intent;              // written by the lock's holder only, before `armed`
};

struct PublishedLayout {
    std::uint64_t magic;
    std::uint32_t version;
    std::uint32_t pid;  // the publishing process
    std::uint32_t region_slots;
    std::uint32_t queue_pair_slots;
    std::uint32_t holder_slots;
    // simulate_partition() in the publishing process: its peers' zero-hop writes must be lost
    // like its frames, so they leave them to the request path.
    std::atomic<std::uint32_t> partitioned;
    // The publishing device's arena (shared_arena.hpp), once it has one: its memfd's descriptor
    // number plus 1 (0: none yet), and the file's size, which every arena region lies below
    // (stored before the regions that need it).
    std::atomic<std::uint32_t> arena_descriptor;
    std::atomic<std::uint64_t> arena_size;
    // The receive lock (see the top of this file): the pid of the process holding it, 0 free.
    alignas(64) std::atomic<std::uint32_t> receive_lock;
    ReceiveJournal receive_journal;
    alignas(64) PublishedRegion regions[kPublishedRegionSlots];
    PublishedQueuePair queue_pairs[kPublishedQueuePairSlots];
    PublishedHolder holders[kPublishedHolderSlots];
};

inline constexpr std::uint64_t kPublishedMagic = 0x5244'4d43'5a48'4f50ull;  // "RDMCZHOP"
inline constexpr std::uint32_t kPublishedVersion = 7;
// The table's memfd and every mapping of it: whole pages.
inline constexpr std::size_t kPublishedLayoutBytes = (sizeof(PublishedLayout) + 4095) & ~std::size_t{4095};

// The target's side: owns the memfd and writes the entries (caller holds the device mutex).
class PublishedTable {
public:
    // Throws nothing: when the memfd cannot be made, valid() is false and nothing is published
    // (peers then use the request path), with `why` saying what failed.
    PublishedTable();
    ~PublishedTable();
    PublishedTable(const PublishedTable&) = delete;
    PublishedTable& operator=(const PublishedTable&) = delete;

    bool valid() const { return layout_ != nullptr; }
    int descriptor() const { return descriptor_; }
    const char* why_not() const { return why_not_; }

    // A region's slot is its key index modulo the slots; a slot held by another live region
    // leaves the new one unpublished (its writes take the request path).
    // arena_offset: the region's offset in the device's arena plus 1, or 0 when it is not there.
    void publish_region(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr, std::uint64_t length,
                        std::uint32_t access, std::uint64_t arena_offset = 0);
    // The device's arena (shared_arena.hpp): its descriptor and current file size; the journal's
    // offsets are resolved in it.
    void publish_arena(const SharedArena& arena);
    // Clears the entry; false when the key was not published (nothing to wait for).
    bool unpublish_region(std::uint32_t key);
    // Waits, outside the device mutex, until no peer's zero-hop write holds `key`, at most
    // `deadline_ms`; holders that exited are reclaimed. Returns 0, or the pid of a live process
    // still holding it at the deadline (the caller then publishes the region again).
    std::uint32_t wait_unused(std::uint32_t key, int deadline_ms);
    // The pid of a peer whose slot holds `key` now, or 0 (tests and diagnostics).
    std::uint32_t holder_of(std::uint32_t key) const;

    // RC queue pairs and DC targets: the state and attributes a responder checks (a DCT's access
    // key), and where an RC QP's receive queue and receive CQ lie (or removes the entry). Under
    // the receive lock.
    void publish_queue_pair(const QueuePairContext& queue_pair);
    void unpublish_queue_pair(std::uint32_t qpn);

    // Holds the receive lock for a scope: waits for it, taking it over from a holder that exited
    // and saying every 2 s which live process holds it. Nothing is held when the table is not
    // valid (no peer can then write this device's CQs).
    class ReceiveGuard {
    public:
        // `needed` false: holds nothing (a CQ no peer can write).
        explicit ReceiveGuard(PublishedTable& table, bool needed = true);
        ~ReceiveGuard();
        ReceiveGuard(const ReceiveGuard&) = delete;
        ReceiveGuard& operator=(const ReceiveGuard&) = delete;

    private:
        PublishedTable* table_;  // null: nothing held
    };

    // Sets the partitioned flag of every table of this process (simulate_partition).
    static void mark_partitioned(bool partitioned);

    // The pid holding the receive lock now, 0 when free.
    std::uint32_t receive_lock_holder() const { return receive_lock_.holder(); }
    // Takes the receive lock over from `pid` if that process holds it and has exited, finishes
    // its journal and frees the lock; false when `pid` does not hold it or is still alive.
    bool take_over_receive_lock(std::uint32_t pid);
    // Takeovers so far (each is logged with what it found).
    std::uint64_t receive_lock_takeovers() const { return takeovers_.load(std::memory_order_relaxed); }

private:
    friend class PeerTable;  // a device reads its own table as its peers do
    PublishedLayout* layout_ = nullptr;
    ReceiveLock receive_lock_;  // of layout_
    const SharedArena* arena_ = nullptr;  // the device's, once published
    std::atomic<std::uint64_t> takeovers_{0};
    int descriptor_ = -1;
    const char* why_not_ = nullptr;
};

}  // namespace rdmachan::soft
