// The progress thread (progress_loop.hpp).
#include "transport/soft/progress_loop.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>

#include "transport/soft/device.hpp"

namespace rdmachan::soft {
namespace {

// The eventfd's events: never a descriptor the device watches (theirs are small tags or pointers).
constexpr std::uint64_t kWakeTag = ~0ull - 1;

}  // namespace

void ProgressLoop::open() {
    event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (event_fd_ < 0 || epoll_fd_ < 0) {
        const std::string why = std::strerror(errno);
        if (event_fd_ >= 0) ::close(event_fd_);
        if (epoll_fd_ >= 0) ::close(epoll_fd_);
        event_fd_ = epoll_fd_ = -1;
        throw SoftDeviceError("software device: eventfd/epoll_create1 failed: " + why);
    }
    watch(event_fd_, kWakeTag);
}

ProgressLoop::~ProgressLoop() {
    stop();
    if (event_fd_ >= 0) ::close(event_fd_);
    if (epoll_fd_ >= 0) ::close(epoll_fd_);
}

void ProgressLoop::start() {
    thread_ = std::thread([this] { run(); });
}

void ProgressLoop::stop() {
    stopping_.store(true);
    if (event_fd_ >= 0) wake();
    if (thread_.joinable()) thread_.join();
}

bool ProgressLoop::watch(int descriptor, std::uint64_t tag) {
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = tag;
    return ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, descriptor, &event) == 0;
}

bool ProgressLoop::remove(int descriptor) {
    return ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, descriptor, nullptr) == 0;
}

void ProgressLoop::wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(event_fd_, &one, sizeof one);
}

void ProgressLoop::notify_doorbell(std::atomic<bool>& queue_pair_flag) {
    queue_pair_flag.store(true);
    doorbells_pending_.store(true);
    // Only a sleeping progress thread needs the system call (seq_cst on both sides: either it
    // sees our flag before sleeping, or we see it asleep).
    if (sleeping_.load()) wake();
}

int ProgressLoop::wait_for_events(epoll_event* events, int timeout_ms, std::chrono::steady_clock::time_point& poll_until) {
    using Clock = std::chrono::steady_clock;
    int ready = 0;
    if (timeout_ms != 0 && Clock::now() < poll_until) {
        // Still within the window after the last events: poll, giving the core to any other
        // runnable thread between polls, until something comes, a doorbell rings or it ends.
        while ((ready = ::epoll_wait(epoll_fd_, events, kMaxEvents, 0)) == 0 && !doorbells_pending_.load() &&
               Clock::now() < poll_until) {
            std::this_thread::yield();
        }
        // Nothing came (the sockets were just looked at): sleep, unless a doorbell rang.
        if (ready == 0 && !doorbells_pending_.load()) ready = ::epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    } else {
        ready = ::epoll_wait(epoll_fd_, events, kMaxEvents, timeout_ms);
    }
    // Every burst of events opens the window again.
    if (ready > 0 && poll_after_events_.count() > 0) poll_until = Clock::now() + poll_after_events_;
    return ready;
}

void ProgressLoop::run() {
    using Clock = std::chrono::steady_clock;
    epoll_event events[kMaxEvents];
    Clock::time_point poll_until{};  // wait_for_events polls until then instead of sleeping
    while (!stopping_.load()) {
        bool busy = false;
        const Clock::time_point deadline = work_.before_wait(busy);
        sleeping_.store(true);
        // More work already waiting: still look at the descriptors (timeout 0), so a stream of
        // doorbells can never starve the responses and requests from peers.
        busy = busy || doorbells_pending_.load() || stopping_.load();
        int timeout_ms = -1;
        if (busy) {
            timeout_ms = 0;
        } else if (deadline != Clock::time_point{}) {
            // Rounded up: a deadline less than a millisecond away must not become a zero timeout,
            // which would make this thread spin until it passes.
            const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
            timeout_ms = wait <= 0 ? 0 : static_cast<int>(std::min<long long>((wait + 999) / 1000, 1000));
        }
        int ready = wait_for_events(events, timeout_ms, poll_until);
        sleeping_.store(false);
        // The wake-ups are the loop's own: taken here, the rest handed to the device.
        int kept = 0;
        for (int i = 0; i < ready; ++i) {
            if (events[i].data.u64 == kWakeTag) {
                std::uint64_t value;
                while (::read(event_fd_, &value, sizeof value) > 0) {
                }
                continue;
            }
            events[kept++] = events[i];
        }
        ready = kept;
        work_.after_wait(events, ready);
    }
}

}  // namespace rdmachan::soft
