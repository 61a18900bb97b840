// The software device's progress thread: it sleeps in epoll_wait on the descriptors it watches
// (its own eventfd for wake-ups, and what the device adds: the listening socket, the connections'
// set, timers, a pidfd), or polls for a while after events (RDMACHAN_SOFT_POLL_US), and runs the
// device's turns (ProgressWork) around each wait. Doorbells rung while it is awake cost a flag;
// only a sleeping thread is woken with a system call.
#pragma once

#include <sys/epoll.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <thread>

namespace rdmachan::soft {

// What the progress thread does in each turn, the device's.
class ProgressWork {
public:
    // Before the wait: the work that is due. Returns when the wait must end at the latest (the
    // zero time point: no deadline); `busy` set: more work already waits, so the wait only looks
    // at the descriptors.
    virtual std::chrono::steady_clock::time_point before_wait(bool& busy) = 0;
    // After the wait: the events it returned (the loop's own wake-ups already taken).
    virtual void after_wait(const epoll_event* events, int count) = 0;

protected:
    ~ProgressWork() = default;
};

class ProgressLoop {
public:
    explicit ProgressLoop(ProgressWork& work) : work_(work) {}
    ~ProgressLoop();
    // Makes the eventfd and the epoll set; throws SoftDeviceError when it cannot. Once, before
    // anything is watched (the device opens its listening socket first, whose failure names the
    // descriptor limit).
    void open();
    ProgressLoop(const ProgressLoop&) = delete;
    ProgressLoop& operator=(const ProgressLoop&) = delete;

    void start();
    // Asks the thread to end, wakes it and joins it.
    void stop();
    // After events, poll this long before sleeping in epoll_wait (RDMACHAN_SOFT_POLL_US; 0, the
    // default: sleep at once). A peer's answer or next request that comes within it is handled
    // without a wake-up; but a polling thread loses the scheduler's preference for a woken one
    // (transport/soft/README.md, "Polling after events").
    void set_poll_after_events(std::chrono::microseconds span) { poll_after_events_ = span; }

    // Adds a descriptor to the set (EPOLLIN), its events reported with `tag`; false when epoll
    // refused it. remove() takes it out.
    bool watch(int descriptor, std::uint64_t tag);
    bool remove(int descriptor);

    void wake();
    // A doorbell: the queue pair's flag and the loop's are set; a sleeping thread is woken.
    void notify_doorbell(std::atomic<bool>& queue_pair_flag);
    // The doorbells rung since the last take (true: look at every queue pair's flag).
    bool take_doorbells() { return doorbells_pending_.exchange(false); }
    // Work left for the next turn (a long batch cut short).
    void note_doorbell_left() { doorbells_pending_.store(true); }
    bool sleeping() const { return sleeping_.load(); }

private:
    void run();
    static constexpr int kMaxEvents = 64;
    int wait_for_events(epoll_event* events, int timeout_ms, std::chrono::steady_clock::time_point& poll_until);

    ProgressWork& work_;
    int event_fd_ = -1;
    int epoll_fd_ = -1;
    std::atomic<bool> sleeping_{false};
    std::atomic<bool> stopping_{false};
    std::atomic<bool> doorbells_pending_{false};
    std::chrono::microseconds poll_after_events_{0};
    std::thread thread_;
};

}  // namespace rdmachan::soft
