// The zero-hop write's shared table (issue 17): what a software device publishes about itself,
// as a target, in shared memory its same-host peers map, so that an initiator's doorbell thread
// can run the responder's checks for an RDMA write itself and move the bytes with
// process_vm_writev, with no thread of the target involved.
//
// The table lives in a memfd (one per device, made at open). A peer maps it by opening
// /proc/<pid>/fd/<descriptor>, both numbers from the target's hello reply: the kernel allows that
// open only to a process that may ptrace the target (the same permission cross-memory attach
// needs), so the table is readable exactly by the processes that could write the target's memory
// anyway.
//
// Every entry is under a sequence counter (a seqlock): the target's device, the only writer
// (under its device mutex), makes the counter odd, changes the fields, makes it even again;
// readers copy the fields and retry if the counter was odd or moved, a bounded number of times,
// and never wait. A region also carries an in-use counter: a reader increments it before it
// reads the entry and decrements it once its write returned; deregistration clears the entry and
// then waits (with a deadline) until the counter is 0, so a key is never used after dereg returns.
#pragma once

#include <array>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <optional>

namespace rdmachan::soft {

struct QueuePairContext;

inline constexpr std::uint32_t kPublishedRegionSlots = 8192;
inline constexpr std::uint32_t kPublishedQueuePairSlots = 4096;

// A region entry's fields as a reader copied them.
struct PublishedRegionView {
    std::uint32_t key = 0;
    std::uint32_t protection_domain = 0;
    std::uint32_t access = 0;
    std::uint64_t addr = 0;
    std::uint64_t length = 0;
};

// An RC queue pair's fields a responder checks, as a reader copied them.
struct PublishedQueuePairView {
    std::uint32_t qpn = 0;
    std::uint32_t state = 0;  // QueuePairState
    std::uint32_t access = 0;
    std::uint32_t protection_domain = 0;
    std::uint32_t remote_qpn = 0;
    std::uint16_t remote_lid = 0;
    std::array<std::uint8_t, 16> remote_gid{};
};

struct alignas(64) PublishedRegion {
    std::atomic<std::uint32_t> sequence;
    std::atomic<std::uint32_t> key;  // 0: empty
    std::atomic<std::uint32_t> protection_domain;
    std::atomic<std::uint32_t> access;
    std::atomic<std::uint64_t> addr;
    std::atomic<std::uint64_t> length;
    std::atomic<std::uint32_t> users;  // zero-hop writes between their check and their end
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
};

struct PublishedLayout {
    std::uint64_t magic;
    std::uint32_t version;
    std::uint32_t pid;  // the publishing process
    std::uint32_t region_slots;
    std::uint32_t queue_pair_slots;
    // simulate_partition() in the publishing process: its peers' zero-hop writes must be lost
    // like its frames, so they leave them to the request path.
    std::atomic<std::uint32_t> partitioned;
    alignas(64) PublishedRegion regions[kPublishedRegionSlots];
    PublishedQueuePair queue_pairs[kPublishedQueuePairSlots];
};

inline constexpr std::uint64_t kPublishedMagic = 0x5244'4d43'5a48'4f50ull;  // "RDMCZHOP"
inline constexpr std::uint32_t kPublishedVersion = 1;

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
    void publish_region(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr, std::uint64_t length,
                        std::uint32_t access);
    // Clears the entry; returns the slot whose users the caller waits for (outside the mutex),
    // or nullptr when the key was not published.
    PublishedRegion* unpublish_region(std::uint32_t key);
    // Waits until no zero-hop write holds `slot`, at most `deadline_ms`; false on the deadline.
    static bool wait_unused(PublishedRegion& slot, int deadline_ms);

    // RC queue pairs only: the state and attributes a responder checks (or removes the entry).
    void publish_queue_pair(const QueuePairContext& queue_pair);
    void unpublish_queue_pair(std::uint32_t qpn);

    // Sets the partitioned flag of every table of this process (simulate_partition).
    static void mark_partitioned(bool partitioned);

private:
    PublishedLayout* layout_ = nullptr;
    int descriptor_ = -1;
    const char* why_not_ = nullptr;
};

// The initiator's side: a read-write mapping of a peer's table (reads, and the in-use counters).
class PeerTable {
public:
    // Maps the table of process `pid` from its descriptor; nullopt-like: valid() false, with the
    // reason in why_not().
    PeerTable(std::uint32_t pid, int descriptor);
    ~PeerTable();
    PeerTable(const PeerTable&) = delete;
    PeerTable& operator=(const PeerTable&) = delete;

    bool valid() const { return layout_ != nullptr; }
    const char* why_not() const { return why_not_; }

    std::optional<PublishedQueuePairView> read_queue_pair(std::uint32_t qpn) const;
    // The target simulates a network partition (simulate_partition in its process).
    bool partitioned() const { return layout_->partitioned.load(std::memory_order_acquire) != 0; }

    // Holds a region's slot for one write: the in-use counter is raised first, then the entry
    // read, so a deregistration either is seen here or waits for release().
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
        PublishedRegion* slot_ = nullptr;
        std::optional<PublishedRegionView> entry_;
    };
    // Fills `use` with the entry of `key` (empty when absent, changing too fast, or another key).
    void use_region(std::uint32_t key, RegionUse& use) const;

private:
    PublishedLayout* layout_ = nullptr;
    const char* why_not_ = nullptr;
};

}  // namespace rdmachan::soft
