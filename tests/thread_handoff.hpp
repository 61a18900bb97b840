// A value two threads of a race test hand each other (the arm/complete races of
// soft_completion_events_test and emulated_events_test): a waiter spins first, for as long as the
// other thread takes to answer on a free core, so that on an idle machine the race runs at full
// speed; past that the other thread is not running (the cores are busy with other work), and a
// waiter that kept spinning would hold a core the other needs for a whole time slice, at every
// one of a million hand-overs. So it then sleeps on the value's futex. A store wakes it only when
// it sleeps: a wake-up call on every store would delay the storer by a system call each time,
// which changes the race (the other thread, still spinning, gets ahead of it).
#pragma once

#include <linux/futex.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <cstdint>
#include <ctime>

namespace rdmachan::test {

class Handoff {
  public:
    using Clock = std::chrono::steady_clock;

    explicit Handoff(std::uint32_t initial) : value_(initial) {}
    Handoff(const Handoff&) = delete;
    Handoff& operator=(const Handoff&) = delete;

    // Waits until `done(value)`, or until `stop` is set or `deadline` passes (false).
    template <typename Done>
    bool wait(Done done, const std::atomic<bool>& stop, Clock::time_point deadline) {
        const Clock::time_point spin_until = Clock::now() + std::chrono::microseconds(50);
        for (;;) {
            const std::uint32_t seen = value_.load(std::memory_order_seq_cst);
            if (done(seen)) return true;
            if (stop.load(std::memory_order_relaxed)) return false;
            const Clock::time_point now = Clock::now();
            if (now >= deadline) return false;
            if (now < spin_until) continue;
            // Counted before the kernel compares the value with `seen` again, so that a store
            // either comes before that comparison or sees a sleeper to wake. At most a
            // millisecond asleep at a time, so that `stop` and the deadline are seen.
            sleepers_.fetch_add(1, std::memory_order_seq_cst);
            const timespec nap{0, 1'000'000};
            ::syscall(SYS_futex, &value_, FUTEX_WAIT_PRIVATE, seen, &nap, nullptr, 0);
            sleepers_.fetch_sub(1, std::memory_order_relaxed);
        }
    }

    void store(std::uint32_t stored) {
        value_.store(stored, std::memory_order_seq_cst);
        if (sleepers_.load(std::memory_order_seq_cst) != 0)
            ::syscall(SYS_futex, &value_, FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
    }

  private:
    static_assert(sizeof(std::atomic<std::uint32_t>) == sizeof(std::uint32_t) &&
                  std::atomic<std::uint32_t>::is_always_lock_free);
    std::atomic<std::uint32_t> value_;  // the futex word
    std::atomic<std::uint32_t> sleepers_{0};
};

}  // namespace rdmachan::test
