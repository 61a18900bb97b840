// The receive lock of a published table (published_table.hpp says why there is one): a word in
// the table that holds the pid of the process holding the lock, 0 when free, and the journal
// its holder writes before its first store. A peer takes the lock by compare-and-swap only, a
// bounded number of times; the table's own device waits for it, and takes it over from a holder
// whose process exited, finishing from the journal what that holder began. One per mapping of a
// table: the target's own (PublishedTable) and each peer's (PeerTable).
#pragma once

#include <cstdint>

namespace rdmachan::soft {

struct PublishedLayout;
struct ReceiveIntent;
class SharedArena;

class ReceiveLock {
  public:
    ReceiveLock() = default;  // of no table: only holder() may be called (it answers 0)
    explicit ReceiveLock(PublishedLayout* layout) : layout_(layout) {}

    // The pid holding it now, 0 when free.
    std::uint32_t holder() const;

    // A peer's side. One compare-and-swap: false when another holds it (the caller then leaves
    // the request to the request path).
    bool try_lock();
    // The same, tried again for a while when busy (a few pauses, then up to 32 yields of the
    // core): the target's device holds the lock from before an answer until its CQE is in, a
    // system call, and the answer is what lets this initiator go on. False when still busy.
    bool lock_briefly();
    void unlock();
    // Under the lock: what this process is about to do (ReceiveJournal), and that it is done.
    void begin_receive(const ReceiveIntent& intent);
    void end_receive();

    // The table's own device. Waits until it holds the lock, taking it over from a holder that
    // exited and logging every 2 s which live process holds it. `arena`: the device's, where the
    // journal's offsets lie (null: none). True when it was taken over from an exited holder.
    bool lock_waiting(const SharedArena* arena);
    // Takes the lock from `holder` if that process still holds it and has exited, and finishes
    // its journal (logging what it found); the lock is then this process's. False otherwise.
    bool take_over_from(std::uint32_t holder, const SharedArena* arena);

  private:
    // Under the lock, just taken over from `holder`: finishes what the journal describes.
    void finish_journal(std::uint32_t holder, const SharedArena* arena);
    // The event descriptor of the receive CQ whose doorbell block is at `cq_doorbell_offset` (as
    // an entry publishes it), from the entries that name it; -1 when none does.
    int event_descriptor_of_receive_cq(std::uint64_t cq_doorbell_offset) const;

    PublishedLayout* layout_ = nullptr;
};

}  // namespace rdmachan::soft
