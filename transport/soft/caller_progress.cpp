// Progress from the caller's thread: a thread that waits for something to arrive over TCP (a
// completion, or memory a peer writes) can read and handle the device's connections itself,
// instead of waiting for the progress thread to be woken by the frame. A woken thread costs a
// scheduler wake-up per frame (on this machine, 2 CPUs, a blocking loopback ping-pong is 38 us
// one-way against 3.7 us when both ends poll), which is what UCX avoids by progressing from the
// application's thread.
//
// How the two threads share the sockets:
//   - The connections' sockets are in their own epoll set. While the progress thread owns them,
//     that set is inside the progress thread's set (nested epoll): a frame wakes that thread.
//   - A caller of progress() that finds traffic on the connections (bytes came within
//     kTrafficWindow) takes the set out of the progress thread's (one epoll_ctl), polls it with
//     a zero timeout and handles what came, under the device mutex taken by try-lock (never a
//     wait: when the progress thread holds it, that thread does the work). Each such call extends
//     the callers' hold by kHold.
//   - The progress thread, whenever it is awake, still polls the set; and it puts the set back
//     into its own once the hold has run out (it sleeps until then at most). A frame that comes
//     after the callers stopped calling waits for at most that long, never forever.
//   - A caller that finds the traffic gone puts the set back itself.
// Everything handled here is handled by the same code, under the same mutex, as on the progress
// thread; what only that thread does (retransmissions, RNR waits, timeouts) it still does, at
// most a hold late: while the callers hold the connections it never sleeps past the hold's end.
// ACKs: a caller leaves the ACK of the plain writes it read held (Answers::end_turn), so
// that it sees what they wrote and can answer first; the held ACK goes at the caller's next
// progress() or doorbell, or when the progress thread next runs, so within the hold.
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>

#include "transport/soft/flight_events.hpp"
#include "transport/soft/device_core.hpp"
#include "transport/soft/environment_switch.hpp"

namespace rdmachan::soft {
namespace {

// How long one progress() call holds the connections for the callers.
constexpr auto kHold = std::chrono::milliseconds(1);
// progress() polls the sockets only while bytes came over them this recently; otherwise the
// traffic is elsewhere (zero-hop, or none) and the call costs no system call.
constexpr auto kTrafficWindow = std::chrono::milliseconds(1);

}  // namespace

void DeviceCore::open_connections_set() {
    caller_progress_enabled_ = environment_switch("RDMACHAN_SOFT_CALLER_PROGRESS").value_or(caller_progress_enabled_);
    links_.open_set();
    connections_attached_ = false;
    attach_connections(true, "the device opened");
}

void DeviceCore::attach_connections(bool attached, const char* why) {
    if (connections_attached_ == attached) return;
    if (!(attached ? loop_.watch(links_.set_descriptor(), kConnectionsTag) : loop_.remove(links_.set_descriptor()))) return;
    connections_attached_ = attached;
    flight::record(flight::SoftEvent::connections_holder, attached, flight::text(why));
}

Clock::time_point DeviceCore::settle_connections_holder() {
    if (connections_attached_) return {};
    // The hold is read once: stop_progress may clear it (to 0, which as a deadline would read as
    // none) at any time, also between two reads.
    const Clock::time_point held_until = connections_held_until();
    if (Clock::now() >= held_until) attach_connections(true, "the callers' hold ended");
    if (connections_attached_) return {};
    // Still the callers' (or the set could not be put back: then again in a millisecond).
    return std::max(held_until, Clock::now() + std::chrono::milliseconds(1));
}

int DeviceCore::progress_from_caller() {
    if (!caller_progress_enabled_) return 0;
    const Clock::time_point now = Clock::now();
    const bool traffic = now.time_since_epoch().count() - links_.last_input() <
                         std::chrono::duration_cast<Clock::duration>(kTrafficWindow).count();
    // No traffic on the connections and the progress thread watching them: nothing to do here.
    if (!traffic && connections_held_until() <= now) return 0;
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return 0;
    answers_.send_deferred();
    if (!traffic) {
        attach_connections(true, "no traffic on the connections");
        connections_held_until_.store(0, std::memory_order_relaxed);
        return 0;
    }
    connections_held_until_.store((now + kHold).time_since_epoch().count(), std::memory_order_relaxed);
    if (connections_attached_) {
        // The progress thread may be asleep with no deadline: the timer wakes it when the hold
        // runs out, and from then on it sleeps no longer than the hold (before_wait).
        attach_connections(false, "a caller polls them");
        arm_ack_timer(now + kHold);
    }
    answers_.set_deferring(true);
    const int handled = links_.poll();
    answers_.set_deferring(false);
    if (handled == 0) return 0;
    count_one(statistics.caller_progress_turns);
    remove_closed_connections();
    // What only the progress thread does it still does: a deadline made here (an RNR NAK read
    // here, say) is seen when it wakes at the end of the hold at the latest; a frame for itself
    // or a path to open wakes it now.
    if (!loopback_.empty() || !paths_to_open_.empty()) wake();
    return handled;
}

void DeviceCore::stop_progress_from_caller() {
    if (connections_held_until() <= Clock::now()) return;  // nobody holds them: nothing to hand back
    connections_held_until_.store(0, std::memory_order_relaxed);
    // Never a wait: whoever holds the mutex, the progress thread puts the set back when it next
    // runs, which is by the end of the hold at the latest.
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return;
    attach_connections(true, "stop_progress");
    answers_.send_deferred();
}

}  // namespace rdmachan::soft
