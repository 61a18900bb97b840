// The software device's progress thread, and what it does with what its links (peer_links.hpp)
// read. The thread blocks in epoll_wait when there is nothing to do: on a doorbell (eventfd), a
// frame from a peer, or the next retry/timeout deadline.
#include "transport/soft/device_core.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/eventfd.h>
#include <sys/timerfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <random>
#include <thread>

#include "transport/soft/flight_events.hpp"
#include "common/logger.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/environment_switch.hpp"

namespace rdmachan::soft {
namespace {

// Counts the requests peers performed on this process's memory; see acquire_remote_writes().
std::atomic<std::uint64_t> remote_accesses{0};


constexpr std::uint64_t kListenerTag = ~0ull;

}  // namespace

DeviceCore::DeviceCore(Device& owner, const DeviceOptions& options)
    : owner_(owner),
      loop_(*this),
      links_(*this, statistics, owner),
      completions_(owner, statistics, published_table, receive_lock_held_),
      answers_(links_, loopback_, statistics, gid, lid),
      requester_({owner, mutex, loop_, links_, loopback_, answers_, completions_, queue_pairs, translation, published_table,
                  arena, statistics, gid, lid, settings_, *this}),
      responder_(owner, queue_pairs, translation, answers_, completions_, published_table, receive_lock_held_, statistics,
                 requester_) {
    settings_.transport_mode = transport_mode_from_environment();
    completions_.set_transport_mode(settings_.transport_mode);
    if (settings_.transport_mode == TransportMode::same_host) settings_.by_reference_threshold = 1;
    settings_.zero_hop_enabled = environment_switch("RDMACHAN_SOFT_ZERO_HOP").value_or(settings_.zero_hop_enabled);
    settings_.doorbell_requests_enabled =
        environment_switch("RDMACHAN_SOFT_DOORBELL_REQUESTS").value_or(settings_.doorbell_requests_enabled);
    if (const char* setting = std::getenv("RDMACHAN_SOFT_POLL_US"); setting != nullptr && *setting != '\0') {
        char* end = nullptr;
        const unsigned long microseconds = std::strtoul(setting, &end, 10);
        if (*end != '\0' || setting[0] == '-' || microseconds > 100000) {
            throw SoftDeviceError(std::string("RDMACHAN_SOFT_POLL_US = '") + setting +
                                  "' is not a number of microseconds from 0 to 100000");
        }
        loop_.set_poll_after_events(std::chrono::microseconds(microseconds));
    }
    if (settings_.transport_mode != TransportMode::tcp && settings_.zero_hop_enabled && !published_table.valid()) {
        detail::logger().info("software device: no table for peers' zero-hop writes: {}", published_table.why_not());
    }
    std::random_device random;
    probe_word_ = (static_cast<std::uint64_t>(random()) << 32 | random()) | 1;  // never 0: unreadable memory reads as 0
    links_.listen(options);
    lid = links_.port();
    ipv4 = links_.ipv4();
    gid[10] = 0xff;
    gid[11] = 0xff;
    std::memcpy(gid.data() + 12, &ipv4, 4);

    loop_.open();
    loop_.watch(links_.listen_descriptor(), kListenerTag);
    open_connections_set();
    open_ack_timer();
    loop_.start();
}

DeviceCore::~DeviceCore() {
    loop_.stop();
    close_connections_gracefully();
    close_ack_timer();
    if (lock_holder_watch_ >= 0) ::close(lock_holder_watch_);
}

void DeviceCore::close_connections_gracefully() {
    {
        std::lock_guard lock(mutex);
        answers_.send_deferred();
    }
    links_.close_gracefully();
}

void DeviceCore::open_path_soon(QueuePairContext& queue_pair) {
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    if (queue_pair.transport != Transport::reliable_connected) return;
    if (same_gid(remote.gid, gid) && remote.lid == lid) {
        // This device: no connection; its first requests may go zero-hop from the doorbell thread.
        if (settings_.zero_hop_enabled && published_table.valid()) queue_pair.zero_hop_remote.store(true, std::memory_order_relaxed);
        return;
    }
    paths_to_open_.emplace_back(remote.gid, remote.lid);
    wake();
}

Clock::time_point DeviceCore::before_wait(bool& busy) {
    std::lock_guard lock(mutex);
    answers_.send_deferred();
    for (const auto& [remote_gid, remote_lid] : paths_to_open_) {
        links_.connection_to(remote_gid, remote_lid, PeerLinks::ConnectWait::background);
    }
    paths_to_open_.clear();
    requester_.execute_pending_doorbells();
    while (!loopback_.empty()) {
        std::vector<std::uint8_t> frame = std::move(loopback_.front());
        loopback_.pop_front();
        Connection self;
        self.gid = gid;
        self.lid = lid;
        self.identified = true;
        const auto* header = reinterpret_cast<const wire::FrameHeader*>(frame.data());
        const std::uint8_t* body = frame.data() + sizeof(wire::FrameHeader);
        handle_frame(self, header->type, body, body + wire::body_size(header->type), header->payload_length);
    }
    Clock::time_point deadline = requester_.next_timer();
    // Callers of progress() hold the connections: a hold already over is settled here, never
    // slept on; otherwise this thread wakes when it runs out.
    if (const Clock::time_point wake_at = settle_connections_holder();
        wake_at != Clock::time_point{} && (deadline == Clock::time_point{} || wake_at < deadline)) {
        deadline = wake_at;
    }
    busy = !loopback_.empty();
    return deadline;
}

void DeviceCore::after_wait(const epoll_event* events, int ready) {
    std::lock_guard lock(mutex);
    for (int i = 0; i < ready; ++i) {
        const std::uint64_t tag = events[i].data.u64;
        if (tag == kListenerTag) {
            links_.accept_connections();
        } else if (tag == kAckTimerTag) {
            ack_timer_fired();
        } else if (tag == kLockHolderTag) {
            lock_holder_exited();
        }
    }
    // The connections' events: through the outer set when it watches them; when callers of
    // progress() hold them (caller_progress.cpp), still looked at while this thread is awake.
    links_.poll();
    settle_connections_holder();
    // Timers after the sockets: a response already waiting in a socket is never mistaken for a
    // missing one.
    requester_.service_timers();
    remove_closed_connections();
}

void DeviceCore::remove_closed_connections() {
    // Called after the events that may refer to them were handled, under the same hold of the mutex.
    answers_.forget_closed();
    links_.remove_closed();
}

void note_remote_access() noexcept {
    remote_accesses.fetch_add(1, std::memory_order_release);
}

void acquire_remote_writes() noexcept {
    (void)remote_accesses.load(std::memory_order_acquire);
}

bool DeviceCore::read_turn_begins(Connection& connection) {
    // The ACKs of the plain writes among the frames of this turn go as one, after the last; the
    // CQEs for compressed CQs too, as sessions where they can (held_completions.hpp).
    answers_.begin_turn(connection);
    return completions_.begin_turn();
}

void DeviceCore::read_turn_ended(Connection& connection, bool began) {
    answers_.end_turn(connection);
    completions_.end_turn(began);
}

void DeviceCore::connection_closed(Connection& connection, const char*) {
    // A peer that completes zero-hop receives here connected to us; if it is gone holding our
    // receive lock, the lock is taken over once its process has exited.
    if (!connection.outgoing && connection.peer_process.is_open() &&
        published_table.receive_lock_holder() == connection.peer_process.pid()) {
        watch_lock_holder(connection.peer_process);
    }
    // Our requests travel on the connection we opened; one the peer opened carries only its
    // requests and our answers. Its end says nothing about our requests, whose answers may
    // still be unread on the other connection.
    if (!connection.outgoing) return;
    // Requests that were sent to that device will never be answered: the transport gives up on
    // them, as hardware does once its retries run out.
    for (auto& [qpn, queue_pair] : queue_pairs) {
        const RemoteQueuePair& remote = queue_pair->receive_attributes.remote;
        if (same_gid(remote.gid, connection.gid) && remote.lid == connection.lid && !queue_pair->in_flight.empty() &&
            queue_pair->state == QueuePairState::ready_to_send) {
            requester_.fail_queue_pair(*queue_pair, mlx5::kSyndromeTransportRetryExceeded, "connection to the peer device lost");
        }
    }
}

void DeviceCore::watch_lock_holder(const PeerProcess& peer) {
    if (lock_holder_watch_ >= 0) {
        loop_.remove(lock_holder_watch_);
        ::close(lock_holder_watch_);
        lock_holder_watch_ = -1;
    }
    // The connection's pidfd goes with the connection: the watch keeps a copy of its own.
    const int watch = ::fcntl(peer.descriptor(), F_DUPFD_CLOEXEC, 0);
    if (watch < 0) return;  // the lock is then taken over when this device next needs it
    if (!loop_.watch(watch, kLockHolderTag)) {
        ::close(watch);
        return;
    }
    lock_holder_watch_ = watch;
    lock_holder_pid_ = peer.pid();
}

void DeviceCore::lock_holder_exited() {
    loop_.remove(lock_holder_watch_);
    ::close(lock_holder_watch_);
    lock_holder_watch_ = -1;
    // Does nothing when it had let the lock go before it exited (finish_receive_journal logs a
    // takeover and what it found).
    (void)published_table.take_over_receive_lock(lock_holder_pid_);
    lock_holder_pid_ = 0;
}

void DeviceCore::handle_frame(Connection& connection, wire::FrameType type, const std::uint8_t* body,
                              const std::uint8_t* payload, std::uint32_t payload_length) {
    switch (type) {
        case wire::FrameType::hello: {
            wire::Hello hello;
            std::memcpy(&hello, body, sizeof hello);
            handle_hello(connection, hello);
            return;
        }
        case wire::FrameType::request: {
            if (!connection.identified) {
                links_.close_connection(connection, "request before hello");
                return;
            }
            wire::Request request;
            std::memcpy(&request, body, sizeof request);
            responder_.handle_request(connection, request, payload, payload_length);
            return;
        }
        case wire::FrameType::response: {
            wire::Response response;
            std::memcpy(&response, body, sizeof response);
            requester_.handle_response(response, payload, payload_length);
            return;
        }
    }
}

void DeviceCore::open_ack_timer() {
    ack_timer_fd_ = ::timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
    if (ack_timer_fd_ < 0) throw SoftDeviceError(std::string("software device: timerfd_create failed: ") + std::strerror(errno));
    loop_.watch(ack_timer_fd_, kAckTimerTag);
}

void DeviceCore::close_ack_timer() {
    if (ack_timer_fd_ >= 0) ::close(ack_timer_fd_);
}

void DeviceCore::ack_timer_fired() {
    std::uint64_t expirations;
    [[maybe_unused]] const ssize_t got = ::read(ack_timer_fd_, &expirations, sizeof expirations);
    ack_timer_armed_for_ = {};
}

void DeviceCore::arm_ack_timer(Clock::time_point deadline) {
    // An expiry at or before this one is armed: the progress thread wakes then and computes its
    // next deadline from every QP, this one included.
    if (ack_timer_armed_for_ != Clock::time_point{} && ack_timer_armed_for_ <= deadline) return;
    static_assert(std::is_same_v<Clock, std::chrono::steady_clock>, "the timerfd counts CLOCK_MONOTONIC, as steady_clock");
    const auto since_boot = std::chrono::duration_cast<std::chrono::nanoseconds>(deadline.time_since_epoch()).count();
    itimerspec expiry{};
    expiry.it_value.tv_sec = static_cast<time_t>(since_boot / 1'000'000'000);
    expiry.it_value.tv_nsec = static_cast<long>(since_boot % 1'000'000'000);
    if (expiry.it_value.tv_sec == 0 && expiry.it_value.tv_nsec == 0) expiry.it_value.tv_nsec = 1;  // 0 would disarm
    if (::timerfd_settime(ack_timer_fd_, TFD_TIMER_ABSTIME, &expiry, nullptr) == 0) {
        ack_timer_armed_for_ = deadline;
    } else {
        wake();  // cannot arm it: let the progress thread see the deadline itself
    }
}

}  // namespace rdmachan::soft
