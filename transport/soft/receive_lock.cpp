// The receive lock of a published table and its crash journal (receive_lock.hpp).
#include "transport/soft/receive_lock.hpp"

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "common/logger.hpp"
#include "transport/soft/completion_ring.hpp"
#include "transport/soft/published_table.hpp"
#include "transport/soft/same_host.hpp"
#include "transport/soft/shared_arena.hpp"

namespace rdmachan::soft {

bool ReceiveLock::lock_waiting(const SharedArena* arena) {
    std::atomic<std::uint32_t>& lock = layout_->receive_lock;
    const auto mine = static_cast<std::uint32_t>(::getpid());
    std::uint32_t holder = 0;
    if (lock.compare_exchange_strong(holder, mine, std::memory_order_acquire,
                                     std::memory_order_relaxed))
        return false;
    // Held: by a peer for a few loads and stores, or by a process that died inside them.
    const auto started = std::chrono::steady_clock::now();
    auto report_at = started + std::chrono::seconds(2);
    for (std::uint32_t attempt = 1;; ++attempt) {
        holder = 0;
        if (lock.compare_exchange_weak(holder, mine, std::memory_order_acquire,
                                       std::memory_order_relaxed))
            return false;
        if (attempt < 64) continue;
        // Past the few stores a holder makes: a holder that exited is taken over, and what it
        // began is finished from its journal.
        if (attempt % 64 == 0 && holder != 0 && holder != mine && take_over_from(holder, arena))
            return true;
        if (std::chrono::steady_clock::now() >= report_at) {
            // Only a peer stopped inside its few stores (SIGSTOP, a debugger) holds it this long.
            detail::logger().error(
                "software device: process {} has held this device's receive lock for {} s (stopped "
                "in a "
                "zero-hop receive?); its CQEs wait for it",
                holder,
                std::chrono::duration_cast<std::chrono::seconds>(std::chrono::steady_clock::now() -
                                                                 started)
                    .count());
            report_at += std::chrono::seconds(2);
        }
        std::this_thread::yield();
    }
}

std::uint32_t ReceiveLock::holder() const {
    return layout_ == nullptr ? 0 : layout_->receive_lock.load(std::memory_order_acquire);
}

bool ReceiveLock::take_over_from(std::uint32_t holder, const SharedArena* arena) {
    std::atomic<std::uint32_t>& lock = layout_->receive_lock;
    if (lock.load(std::memory_order_relaxed) != holder || !process_exited(holder)) return false;
    std::uint32_t expected = holder;
    if (!lock.compare_exchange_strong(expected, static_cast<std::uint32_t>(::getpid()),
                                      std::memory_order_acquire, std::memory_order_relaxed)) {
        return false;
    }
    finish_journal(holder, arena);
    return true;
}

namespace {

// What taking the receive lock over from a holder that exited found in the journal.
enum class ReceiveRecovery : std::uint8_t {
    nothing_begun,       // no receive in progress
    receive_left,        // it had not consumed the receive yet: the receive stays posted
    completion_written,  // it had consumed it: its CQE, or the rest of it, was written now
    already_complete,    // it had published the CQE; only the journal was left
    journal_invalid,     // the journal names memory outside the arena: left as it was
};

const char* describe(ReceiveRecovery recovery) {
    switch (recovery) {
        case ReceiveRecovery::nothing_begun:
            return "no receive was in progress";
        case ReceiveRecovery::receive_left:
            return "it had not consumed its receive yet, which stays posted";
        case ReceiveRecovery::completion_written:
            return "it had consumed a receive; its CQE was written now";
        case ReceiveRecovery::already_complete:
            return "its CQE was already published";
        case ReceiveRecovery::journal_invalid:
            return "its journal names memory outside the arena: left as it was";
    }
    return "?";
}

}  // namespace

void ReceiveLock::finish_journal(std::uint32_t holder, const SharedArena* arena) {
    ReceiveJournal& journal = layout_->receive_journal;
    ReceiveRecovery outcome = ReceiveRecovery::nothing_begun;
    if (journal.armed.load(std::memory_order_acquire) != 0) {
        const ReceiveIntent intent = journal.intent;
        // The journal's offsets (plus 1) in this device's arena, or null outside it: a journal from
        // a process that wrote nonsense must not make this one fault.
        auto in_arena = [arena](std::uint64_t offset_plus_1,
                                std::uint64_t length) -> std::uint8_t* {
            return arena == nullptr || offset_plus_1 == 0 ? nullptr
                                                          : arena->range(offset_plus_1 - 1, length);
        };
        const bool ring_shape = intent.cqe_count != 0 &&
                                (intent.cqe_count & (intent.cqe_count - 1)) == 0 &&
                                (intent.cqe_size == 64 || intent.cqe_size == 128);
        auto* doorbell = reinterpret_cast<std::uint32_t*>(in_arena(intent.doorbell_offset, 64));
        std::uint8_t* entries = in_arena(
            intent.cq_offset, static_cast<std::uint64_t>(intent.cqe_count) * intent.cqe_size);
        auto* cq_doorbell =
            reinterpret_cast<std::uint32_t*>(in_arena(intent.cq_doorbell_offset, 64));
        if (!ring_shape || doorbell == nullptr || entries == nullptr || cq_doorbell == nullptr) {
            outcome = ReceiveRecovery::journal_invalid;
        } else if (__atomic_load_n(doorbell + kReceiveConsumedWord, __ATOMIC_ACQUIRE) ==
                   intent.consumed_before) {
            outcome = ReceiveRecovery::receive_left;  // its first store was never made
        } else {
            const CompletionRingView ring{
                entries, intent.cqe_count, intent.cqe_size, cq_doorbell,
                event_descriptor_of_receive_cq(intent.cq_doorbell_offset)};
            if (ring.producer_index() != intent.producer_before) {
                outcome = ReceiveRecovery::already_complete;  // the producer index moves last
                // It may have died between the index and the event: an arm still set is owed one.
                ring.raise_event(intent.completion.cqe_opcode, intent.completion.solicited);
            } else {
                // Its owner byte may already be the new one (published, the index not yet moved):
                // the consumer may be reading that CQE, so it is not written again.
                const std::uint8_t expected =
                    ring.owner_byte(intent.completion.cqe_opcode, intent.completion.solicited);
                std::uint8_t* cqe = ring.next_entry();
                if (__atomic_load_n(cqe + mlx5::kCqeOpOwn, __ATOMIC_ACQUIRE) != expected) {
                    ring.claim();
                    fill_responder_cqe(cqe, intent.completion);
                    ring.make_visible(cqe, intent.completion.cqe_opcode,
                                      intent.completion.solicited);
                }
                ring.advance();
                ring.raise_event(intent.completion.cqe_opcode, intent.completion.solicited);
                outcome = ReceiveRecovery::completion_written;
            }
        }
        if (outcome != ReceiveRecovery::journal_invalid)
            journal.armed.store(0, std::memory_order_release);
    }
    detail::logger().warn(
        "software device: process {} exited holding this device's receive lock; taken over: {}",
        holder, describe(outcome));
}

int ReceiveLock::event_descriptor_of_receive_cq(std::uint64_t cq_doorbell_offset) const {
    for (const PublishedQueuePair& slot : layout_->queue_pairs) {
        if (slot.qpn.load(std::memory_order_relaxed) != 0 &&
            slot.receive_cq_doorbell_offset.load(std::memory_order_relaxed) == cq_doorbell_offset) {
            return static_cast<int>(
                       slot.receive_cq_event_descriptor.load(std::memory_order_relaxed)) -
                   1;
        }
    }
    return -1;
}

bool ReceiveLock::try_lock() {
    std::uint32_t holder = 0;
    return layout_->receive_lock.compare_exchange_strong(
        holder, static_cast<std::uint32_t>(::getpid()), std::memory_order_acquire,
        std::memory_order_relaxed);
}

namespace {

// A spin-wait hint to the CPU (another hardware thread gets the core's resources meanwhile).
inline void pause_briefly() {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    asm volatile("yield");
#endif
}

}  // namespace

bool ReceiveLock::lock_briefly() {
    for (int attempt = 0; attempt < 48; ++attempt) {
        if (try_lock()) return true;
        if (attempt < 16) {
            pause_briefly();
        } else {
            std::this_thread::yield();  // the holder may be waiting for this core
        }
    }
    return false;
}

void ReceiveLock::unlock() {
    layout_->receive_lock.store(0, std::memory_order_release);
}

void ReceiveLock::begin_receive(const ReceiveIntent& intent) {
    layout_->receive_journal.intent = intent;
    layout_->receive_journal.armed.store(1, std::memory_order_release);
}

void ReceiveLock::end_receive() {
    layout_->receive_journal.armed.store(0, std::memory_order_release);
}

}  // namespace rdmachan::soft
