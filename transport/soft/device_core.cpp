// The software device's progress thread and its TCP connections to other devices. The thread
// blocks in epoll_wait when there is nothing to do: on a doorbell (eventfd), a frame from a
// peer, or the next retry/timeout deadline.
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

namespace rdmachan::soft {
namespace {

std::atomic<bool> partitioned_from_everyone{false};

// Counts the requests peers performed on this process's memory; see acquire_remote_writes().
std::atomic<std::uint64_t> remote_accesses{0};

[[noreturn]] void fail_system(const std::string& call) {
    throw SoftDeviceError("software device: " + call + " failed: " + std::strerror(errno));
}

void set_non_blocking(int socket) {
    const int flags = ::fcntl(socket, F_GETFL, 0);
    ::fcntl(socket, F_SETFL, flags | O_NONBLOCK);
    const int one = 1;
    ::setsockopt(socket, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

constexpr std::uint64_t kListenerTag = ~0ull;
constexpr std::uint64_t kEventTag = ~0ull - 1;

}  // namespace

namespace {

// A device talking to thousands of peers holds a socket per peer device: raise the soft limit on
// descriptors to the hard limit once per process, as MPI launchers do.
void raise_open_file_limit() {
    static const bool raised = [] {
        rlimit limit{};
        if (::getrlimit(RLIMIT_NOFILE, &limit) == 0 && limit.rlim_cur < limit.rlim_max) {
            const rlim_t before = limit.rlim_cur;
            limit.rlim_cur = limit.rlim_max;
            if (::setrlimit(RLIMIT_NOFILE, &limit) == 0)
                detail::logger().debug("software device: RLIMIT_NOFILE raised from {} to its hard limit {}", before,
                                       limit.rlim_max);
        }
        return true;
    }();
    (void)raised;
}

// Why a socket could not be made, naming the descriptor limit when that is the reason.
std::string socket_failure(int error) {
    std::string why = std::strerror(error);
    if (error == EMFILE || error == ENFILE) {
        rlimit limit{};
        ::getrlimit(RLIMIT_NOFILE, &limit);
        why += error == EMFILE ? " (this process is out of file descriptors: RLIMIT_NOFILE is " +
                                     std::to_string(limit.rlim_cur) + ", hard limit " + std::to_string(limit.rlim_max) + ")"
                               : " (the system is out of file descriptors: fs.file-max)";
    }
    return why;
}

}  // namespace

DeviceCore::DeviceCore(Device& owner, const DeviceOptions& options) : owner_(owner) {
    raise_open_file_limit();
    transport_mode_ = transport_mode_from_environment();
    if (transport_mode_ == TransportMode::same_host) by_reference_threshold_ = 1;
    if (const char* zero_hop = std::getenv("RDMACHAN_SOFT_ZERO_HOP"); zero_hop != nullptr && *zero_hop != '\0') {
        if (std::strcmp(zero_hop, "0") != 0 && std::strcmp(zero_hop, "1") != 0) {
            throw SoftDeviceError(std::string("RDMACHAN_SOFT_ZERO_HOP = '") + zero_hop + "' is not 0 or 1");
        }
        zero_hop_enabled_ = zero_hop[0] == '1';
    }
    if (const char* setting = std::getenv("RDMACHAN_SOFT_POLL_US"); setting != nullptr && *setting != '\0') {
        char* end = nullptr;
        const unsigned long microseconds = std::strtoul(setting, &end, 10);
        if (*end != '\0' || setting[0] == '-' || microseconds > 100000) {
            throw SoftDeviceError(std::string("RDMACHAN_SOFT_POLL_US = '") + setting +
                                  "' is not a number of microseconds from 0 to 100000");
        }
        poll_after_events_ = std::chrono::microseconds(microseconds);
    }
    if (transport_mode_ != TransportMode::tcp && zero_hop_enabled_ && !published_table.valid()) {
        detail::logger().info("software device: no table for peers' zero-hop writes: {}", published_table.why_not());
    }
    std::random_device random;
    probe_word_ = (static_cast<std::uint64_t>(random()) << 32 | random()) | 1;  // never 0: unreadable memory reads as 0
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(options.port);
    if (::inet_pton(AF_INET, options.address.c_str(), &address.sin_addr) != 1) {
        throw SoftDeviceError("software device: listen address '" + options.address + "' is not an IPv4 address");
    }
    listen_socket_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (listen_socket_ < 0) throw SoftDeviceError("software device: socket: " + socket_failure(errno));
    const int one = 1;
    ::setsockopt(listen_socket_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(listen_socket_, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        const std::string why = std::strerror(errno);
        ::close(listen_socket_);
        throw SoftDeviceError("software device: cannot listen on " + options.address + ":" + std::to_string(options.port) + ": " + why);
    }
    // Every peer device may connect at once (first frames of a large job): a full backlog would
    // make the kernel retry their SYNs after a second.
    ::listen(listen_socket_, SOMAXCONN);
    socklen_t length = sizeof address;
    ::getsockname(listen_socket_, reinterpret_cast<sockaddr*>(&address), &length);
    set_non_blocking(listen_socket_);
    lid = ntohs(address.sin_port);
    ipv4 = address.sin_addr.s_addr;
    gid[10] = 0xff;
    gid[11] = 0xff;
    std::memcpy(gid.data() + 12, &ipv4, 4);

    event_fd_ = ::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    epoll_fd_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (event_fd_ < 0 || epoll_fd_ < 0) fail_system("eventfd/epoll_create1");
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kListenerTag;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_socket_, &event);
    event.data.u64 = kEventTag;
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, event_fd_, &event);
    open_connections_set();
    open_ack_timer();
    thread_ = std::thread([this] { run(); });
}

DeviceCore::~DeviceCore() {
    stopping_.store(true);
    wake();
    if (thread_.joinable()) thread_.join();
    close_connections_gracefully();
    ::close(listen_socket_);
    ::close(event_fd_);
    close_ack_timer();
    if (lock_holder_watch_ >= 0) ::close(lock_holder_watch_);
    ::close(connections_epoll_fd_);
    ::close(epoll_fd_);
}

// Closing a TCP socket that still holds unread input makes the kernel send a reset, and a reset
// makes the peer's kernel drop what it had not read yet — the acknowledgements this device
// sent last. A ConnectX keeps answering until its QPs are destroyed; the equivalent here is to
// stop writing, read what is still coming (briefly), then close.
void DeviceCore::close_connections_gracefully() {
    {
        std::lock_guard lock(mutex);
        send_held_acknowledgements();
    }
    std::vector<pollfd> sockets;
    for (auto& connection : connections_) {
        if (connection->socket < 0) continue;
        ::shutdown(connection->socket, SHUT_WR);
        sockets.push_back({connection->socket, POLLIN, 0});
    }
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(200);
    std::size_t open = sockets.size();
    while (open != 0) {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now());
        if (left.count() <= 0) break;
        if (::poll(sockets.data(), sockets.size(), static_cast<int>(left.count())) <= 0) break;
        for (pollfd& entry : sockets) {
            if (entry.fd < 0 || entry.revents == 0) continue;
            char discard[4096];
            const ssize_t got = ::recv(entry.fd, discard, sizeof discard, MSG_DONTWAIT);
            if (got > 0 || (got < 0 && (errno == EAGAIN || errno == EINTR))) continue;
            ::close(entry.fd);  // end of stream (or an error): nothing more will come
            entry.fd = -1;
            --open;
        }
    }
    for (pollfd& entry : sockets) {
        if (entry.fd >= 0) ::close(entry.fd);
    }
    for (auto& connection : connections_) connection->socket = -1;
}

void DeviceCore::wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t written = ::write(event_fd_, &one, sizeof one);
}

void DeviceCore::open_path_soon(QueuePairContext& queue_pair) {
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    if (queue_pair.transport != Transport::reliable_connected) return;
    if (same_gid(remote.gid, gid) && remote.lid == lid) {
        // This device: no connection; its first requests may go zero-hop from the doorbell thread.
        if (zero_hop_enabled_ && published_table.valid()) queue_pair.zero_hop_remote.store(true, std::memory_order_relaxed);
        return;
    }
    paths_to_open_.emplace_back(remote.gid, remote.lid);
    wake();
}

void DeviceCore::notify_doorbell(std::atomic<bool>& queue_pair_flag) {
    queue_pair_flag.store(true);
    doorbells_pending_.store(true);
    // Only a sleeping progress thread needs the system call (seq_cst on both sides: either it
    // sees our flag before sleeping, or we see it asleep).
    if (sleeping_.load()) wake();
}

int DeviceCore::wait_for_events(epoll_event* events, int timeout_ms, Clock::time_point& poll_until) {
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

void DeviceCore::run() {
    epoll_event events[kMaxEvents];
    Clock::time_point poll_until{};  // wait_for_events polls until then instead of sleeping
    while (!stopping_.load()) {
        Clock::time_point deadline;
        bool busy = false;
        {
            std::lock_guard lock(mutex);
            send_held_acknowledgements();
            for (const auto& [remote_gid, remote_lid] : paths_to_open_) {
                connection_to(remote_gid, remote_lid, ConnectWait::background);
            }
            paths_to_open_.clear();
            execute_pending_doorbells();
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
            deadline = next_timer();
            // Callers of progress() hold the connections: a hold already over is settled here,
            // never slept on; otherwise this thread wakes when it runs out.
            if (const Clock::time_point wake_at = settle_connections_holder();
                wake_at != Clock::time_point{} && (deadline == Clock::time_point{} || wake_at < deadline)) {
                deadline = wake_at;
            }
            sleeping_.store(true);
            // More work already waiting: still look at the sockets (timeout 0), so a stream of
            // doorbells can never starve the responses and requests from peers.
            busy = doorbells_pending_.load() || !loopback_.empty() || stopping_.load();
        }
        int timeout_ms = -1;
        if (busy) {
            timeout_ms = 0;
        } else if (deadline != Clock::time_point{}) {
            // Rounded up: a deadline less than a millisecond away must not become a zero timeout,
            // which would make this thread spin until it passes.
            const auto wait = std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()).count();
            timeout_ms = wait <= 0 ? 0 : static_cast<int>(std::min<long long>((wait + 999) / 1000, 1000));
        }
        const int ready = wait_for_events(events, timeout_ms, poll_until);
        sleeping_.store(false);
        std::lock_guard lock(mutex);
        for (int i = 0; i < ready; ++i) {
            const std::uint64_t tag = events[i].data.u64;
            if (tag == kListenerTag) {
                accept_connections();
            } else if (tag == kEventTag) {
                std::uint64_t value;
                while (::read(event_fd_, &value, sizeof value) > 0) {
                }
            } else if (tag == kAckTimerTag) {
                ack_timer_fired();
            } else if (tag == kLockHolderTag) {
                lock_holder_exited();
            }
        }
        // The connections' events: through the outer set when it watches them; when callers of
        // progress() hold them (caller_progress.cpp), still looked at while this thread is awake.
        poll_connections();
        settle_connections_holder();
        // Timers after the sockets: a response already waiting in a socket is never mistaken for a
        // missing one.
        service_timers();
        remove_closed_connections();
    }
}

int DeviceCore::poll_connections() {
    epoll_event events[kMaxEvents];
    const int ready = ::epoll_wait(connections_epoll_fd_, events, kMaxEvents, 0);
    for (int i = 0; i < ready; ++i) {
        Connection* connection = reinterpret_cast<Connection*>(events[i].data.u64);
        if (connection->connecting) {
            // Writable or failed: the background connect ended, one way or the other.
            finish_connect(*connection);
            if (connection->socket >= 0 && (events[i].events & EPOLLIN) != 0) read_connection(*connection);
            continue;
        }
        if ((events[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) != 0) read_connection(*connection);
        if (connection->socket >= 0 && (events[i].events & EPOLLOUT) != 0) write_connection(*connection);
    }
    return ready < 0 ? 0 : ready;
}

void DeviceCore::remove_closed_connections() {
    // Called after the events that may refer to them were handled, under the same hold of the mutex.
    held_acknowledgements_.forget([](const Connection& connection) { return connection.socket < 0; });
    std::erase_if(connections_, [](const std::unique_ptr<Connection>& connection) { return connection->socket < 0; });
}

void DeviceCore::accept_connections() {
    while (true) {
        const int socket = ::accept4(listen_socket_, nullptr, nullptr, SOCK_CLOEXEC);
        if (socket < 0) return;
        set_non_blocking(socket);
        auto connection = std::make_unique<Connection>();
        connection->socket = socket;
        epoll_event event{};
        event.events = EPOLLIN;
        event.data.u64 = reinterpret_cast<std::uint64_t>(connection.get());
        ::epoll_ctl(connections_epoll_fd_, EPOLL_CTL_ADD, socket, &event);
        connections_.push_back(std::move(connection));
    }
}

Connection* DeviceCore::open_connection_to(const std::array<std::uint8_t, 16>& remote_gid, std::uint16_t remote_lid) {
    for (auto& connection : connections_) {
        if (connection->outgoing && connection->socket >= 0 && same_gid(connection->gid, remote_gid) && connection->lid == remote_lid) {
            return connection.get();
        }
    }
    return nullptr;
}

Connection* DeviceCore::connection_to(const std::array<std::uint8_t, 16>& remote_gid, std::uint16_t remote_lid,
                                      ConnectWait wait) {
    if (Connection* open = open_connection_to(remote_gid, remote_lid); open != nullptr) return open;
    if (remote_gid[10] != 0xff || remote_gid[11] != 0xff) return nullptr;  // not an IPv4-mapped GID
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(remote_lid);
    std::memcpy(&address.sin_addr, remote_gid.data() + 12, 4);
    count_one(statistics.connects_started);
    const int socket = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (socket < 0) {
        detail::logger().error("software device {}: cannot open a connection to lid {}: {}", owner_.name(), remote_lid,
                               socket_failure(errno));
        count_one(statistics.connects_failed);
        return nullptr;
    }
    bool connecting = false;
    if (::connect(socket, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        if (errno != EINPROGRESS) {
            ::close(socket);
            count_one(statistics.connects_failed);
            return nullptr;
        }
        if (wait == ConnectWait::background) {
            connecting = true;
        } else {
            // A bounded connect: the progress thread never waits more than a second for a peer.
            pollfd waiting{socket, POLLOUT, 0};
            int error = 0;
            socklen_t length = sizeof error;
            if (::poll(&waiting, 1, 1000) != 1 || ::getsockopt(socket, SOL_SOCKET, SO_ERROR, &error, &length) != 0 ||
                error != 0) {
                ::close(socket);
                count_one(statistics.connects_failed);
                return nullptr;
            }
        }
    }
    set_non_blocking(socket);
    auto connection = std::make_unique<Connection>();
    connection->socket = socket;
    connection->gid = remote_gid;
    connection->lid = remote_lid;
    connection->identified = true;
    connection->outgoing = true;
    connection->connecting = connecting;
    connection->write_interest = connecting;  // EPOLLOUT says when the connect completed
    epoll_event event{};
    event.events = connecting ? EPOLLIN | EPOLLOUT : EPOLLIN;
    event.data.u64 = reinterpret_cast<std::uint64_t>(connection.get());
    ::epoll_ctl(connections_epoll_fd_, EPOLL_CTL_ADD, socket, &event);
    queue_output(*connection, wire::frame(wire::FrameType::hello, make_hello(0)));
    connection->awaiting_reply = true;
    connections_.push_back(std::move(connection));
    return connections_.back().get();
}

void DeviceCore::finish_connect(Connection& connection) {
    int error = 0;
    socklen_t length = sizeof error;
    if (::getsockopt(connection.socket, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error != 0) {
        // Requests queued behind the connect fail their QP as on any lost connection; a QP with
        // none finds no connection at its first request and connects then (bounded).
        count_one(statistics.connects_failed);
        close_connection(connection, "connect failed");
        return;
    }
    connection.connecting = false;
    write_connection(connection);
}

void simulate_partition(bool partitioned) noexcept {
    partitioned_from_everyone.store(partitioned);
    // Zero-hop writes carry no frame to lose: peers are told through this process's tables, and
    // this process's devices check partition_simulated() (zero_hop.cpp).
    PublishedTable::mark_partitioned(partitioned);
}

bool partition_simulated() noexcept {
    return partitioned_from_everyone.load();
}

void note_remote_access() noexcept {
    remote_accesses.fetch_add(1, std::memory_order_release);
}

void acquire_remote_writes() noexcept {
    (void)remote_accesses.load(std::memory_order_acquire);
}

void DeviceCore::queue_output(Connection& connection, const std::vector<std::uint8_t>& bytes) {
    if (connection.socket < 0) return;
    // Lost on the wire; but a hello and its reply go through, as a connection opened during a
    // partition (its SYN got through): otherwise requests would wait for the reply forever.
    const bool hello = bytes.size() > sizeof(wire::FrameHeader) &&
                       bytes[offsetof(wire::FrameHeader, type)] == static_cast<std::uint8_t>(wire::FrameType::hello);
    if (partitioned_from_everyone.load(std::memory_order_relaxed) && !hello) return;
    if (connection.connecting) {
        connection.output.insert(connection.output.end(), bytes.begin(), bytes.end());
        return;
    }
    // Nothing queued before it: straight from the frame to the socket, with no copy into the
    // output; only what the kernel does not take waits there (in order: it is all that is queued).
    std::size_t sent = 0;
    if (connection.output_offset == connection.output.size()) {
        while (sent < bytes.size()) {
            const ssize_t written = ::send(connection.socket, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
            if (written > 0) {
                sent += static_cast<std::size_t>(written);
            } else if (written < 0 && errno == EINTR) {
                continue;
            } else {
                break;  // EAGAIN, or an error write_connection meets again and reports
            }
        }
        if (sent == bytes.size()) return;
        connection.output.clear();
        connection.output_offset = 0;
    }
    connection.output.insert(connection.output.end(), bytes.begin() + static_cast<std::ptrdiff_t>(sent), bytes.end());
    write_connection(connection);
}

void DeviceCore::watch_output(Connection& connection, bool waiting) {
    if (connection.write_interest == waiting) return;  // one epoll_ctl per change, not per frame
    epoll_event event{};
    event.events = waiting ? EPOLLIN | EPOLLOUT : EPOLLIN;
    event.data.u64 = reinterpret_cast<std::uint64_t>(&connection);
    ::epoll_ctl(connections_epoll_fd_, EPOLL_CTL_MOD, connection.socket, &event);
    connection.write_interest = waiting;
}

void DeviceCore::write_connection(Connection& connection) {
    while (connection.output_offset < connection.output.size()) {
        const ssize_t written = ::send(connection.socket, connection.output.data() + connection.output_offset,
                                       connection.output.size() - connection.output_offset, MSG_NOSIGNAL);
        if (written > 0) {
            connection.output_offset += static_cast<std::size_t>(written);
            continue;
        }
        if (written < 0 && errno == EINTR) continue;
        if (written < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
            watch_output(connection, true);
            return;
        }
        close_connection(connection, "send failed");
        return;
    }
    connection.output.clear();
    connection.output_offset = 0;
    watch_output(connection, false);
}

namespace {

// The frame at the front of a connection's input, once its header is in: the header and the
// frame's whole size (meaningful only when well formed).
struct FrontFrame {
    wire::FrameHeader header;
    std::size_t size;
    bool well_formed() const {
        return header.magic == wire::kMagic && wire::body_size(header.type) != 0 && header.payload_length <= wire::kMaxPayload;
    }
};

std::optional<FrontFrame> front_frame(const ConnectionInput& input) {
    if (input.unread_size() < sizeof(wire::FrameHeader)) return std::nullopt;
    FrontFrame front;
    std::memcpy(&front.header, input.unread(), sizeof front.header);
    front.size = sizeof front.header + wire::body_size(front.header.type) + front.header.payload_length;
    return front;
}

}  // namespace

void DeviceCore::read_connection(Connection& connection) {
    // A peer that answers and then closes leaves its last answers in front of the end of the
    // stream: they are handled before the connection is, as a NIC handles packets in order.
    const char* ended = nullptr;
    ConnectionInput& input = connection.input;
    // The ACKs of the plain writes among the frames of this turn go as one, after the last; the
    // CQEs for compressed CQs too, as sessions where they can (held_completions.hpp).
    held_acknowledgements_.begin_turn(connection);
    const bool holds_completions = !held_completions_.turn_open();
    if (holds_completions) held_completions_.begin_turn();
    const struct EndCoalescing {
        DeviceCore& core;
        Connection& connection;
        bool holds_completions;
        ~EndCoalescing() {
            core.held_acknowledgements_.end_turn();
            core.end_acknowledgement_turn(connection);
            if (holds_completions) {
                core.write_held_completions();
                core.held_completions_.end_turn();
            }
        }
    } end_coalescing{*this, connection, holds_completions};
    // A bounded number of reads per wake-up, so that one busy peer does not hold the thread from
    // the others; epoll is level-triggered, so what is left wakes the thread again.
    constexpr int kReadsPerTurn = 16;
    std::size_t asked = 0;
    for (int reads = 0; connection.socket >= 0 && reads < kReadsPerTurn; ++reads) {
        // A connection that carries little keeps a small buffer (thousands of them may be open);
        // one whose read filled what it asked for gets twice the room for the next, up to
        // kLargestRead, and room for the rest of a frame already begun, so one read can end it.
        std::size_t wanted = kSmallestRead;
        if (reads > 0) wanted = std::max(wanted, std::min(2 * asked, kLargestRead));
        if (const std::optional<FrontFrame> front = front_frame(input); front && front->well_formed() && front->size > input.unread_size()) {
            wanted = std::max(wanted, front->size - input.unread_size());
        }
        std::uint8_t* into = input.room(wanted);
        asked = input.room_size();
        const ssize_t received = ::recv(connection.socket, into, asked, 0);
        if (received > 0) {
            last_input_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
            input.commit(static_cast<std::size_t>(received));
            handle_frames(connection);
            // Less than asked for: the socket is empty now, so the recv that would say EAGAIN is
            // saved (bytes arriving later wake the thread again).
            if (static_cast<std::size_t>(received) < asked) break;
            continue;
        }
        if (received < 0 && errno == EINTR) continue;
        if (received < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
        ended = received == 0 ? "peer closed the connection" : "receive failed";
        break;
    }
    if (ended != nullptr) close_connection(connection, ended);
}

void DeviceCore::handle_frames(Connection& connection) {
    ConnectionInput& input = connection.input;
    while (connection.socket >= 0) {
        const std::optional<FrontFrame> front = front_frame(input);
        if (!front) return;
        if (!front->well_formed()) {
            close_connection(connection, "malformed frame from peer");
            return;
        }
        if (input.unread_size() < front->size) return;
        const wire::FrameHeader& header = front->header;
        const std::uint8_t* body_bytes = input.unread() + sizeof header;
        if (!partitioned_from_everyone.load(std::memory_order_relaxed) || header.type == wire::FrameType::hello) {
            handle_frame(connection, header.type, body_bytes, body_bytes + wire::body_size(header.type), header.payload_length);
        }
        input.consume(front->size);
    }
}

void DeviceCore::close_connection(Connection& connection, const char* why) {
    if (connection.socket < 0) return;
    ::epoll_ctl(connections_epoll_fd_, EPOLL_CTL_DEL, connection.socket, nullptr);
    ::close(connection.socket);
    connection.socket = -1;
    connection.holds_acknowledgement = false;
    if (!connection.identified) return;
    flight::record(flight::SoftEvent::connection_closed, connection.lid, connection.outgoing, flight::text(why));
    detail::logger().info("software device {}: connection to lid {} closed: {}", owner_.name(), connection.lid, why);
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
            fail_queue_pair(*queue_pair, mlx5::kSyndromeTransportRetryExceeded, "connection to the peer device lost");
        }
    }
}

void DeviceCore::watch_lock_holder(const PeerProcess& peer) {
    if (lock_holder_watch_ >= 0) {
        ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, lock_holder_watch_, nullptr);
        ::close(lock_holder_watch_);
        lock_holder_watch_ = -1;
    }
    // The connection's pidfd goes with the connection: the watch keeps a copy of its own.
    const int watch = ::fcntl(peer.descriptor(), F_DUPFD_CLOEXEC, 0);
    if (watch < 0) return;  // the lock is then taken over when this device next needs it
    epoll_event event{};
    event.events = EPOLLIN;
    event.data.u64 = kLockHolderTag;
    if (::epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, watch, &event) != 0) {
        ::close(watch);
        return;
    }
    lock_holder_watch_ = watch;
    lock_holder_pid_ = peer.pid();
}

void DeviceCore::lock_holder_exited() {
    ::epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, lock_holder_watch_, nullptr);
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
                close_connection(connection, "request before hello");
                return;
            }
            wire::Request request;
            std::memcpy(&request, body, sizeof request);
            handle_request(connection, request, payload, payload_length);
            return;
        }
        case wire::FrameType::response: {
            wire::Response response;
            std::memcpy(&response, body, sizeof response);
            handle_response(response, payload, payload_length);
            return;
        }
    }
}

std::size_t DeviceCore::unread_bytes(bool outgoing) const {
    std::size_t total = 0;
    for (const auto& connection : connections_) {
        int waiting = 0;
        if (connection->outgoing == outgoing && connection->socket >= 0 && ::ioctl(connection->socket, SIOCINQ, &waiting) == 0) total += static_cast<std::size_t>(waiting);
    }
    return total;
}

void DeviceCore::respond_coalescing(Connection& connection, const wire::Response& response) {
    if (!held_acknowledgements_.in_turn(connection) || connection.socket < 0 || !connection.accepts_coalesced_acknowledgements) {
        respond(connection, response);
        return;
    }
    if (connection.holds_acknowledgement && connection.held_acknowledgement.destination_qpn != response.destination_qpn) {
        send_held_acknowledgement(connection);
    }
    note_remote_access();  // as respond: released before anything can learn of the write
    if (connection.holds_acknowledgement) count_one(statistics.coalesced_acknowledgements);
    connection.held_acknowledgement = response;
    connection.holds_acknowledgement = true;
}

void DeviceCore::end_acknowledgement_turn(Connection& connection) {
    if (!held_acknowledgements_.deferring() || !connection.holds_acknowledgement || connection.socket < 0) {
        send_held_acknowledgement(connection);
        return;
    }
    held_acknowledgements_.defer(connection);
}

void DeviceCore::send_held_acknowledgements() {
    held_acknowledgements_.send_deferred([this](Connection& connection) { send_held_acknowledgement(connection); });
}

void DeviceCore::send_held_acknowledgement(Connection& connection) {
    if (!connection.holds_acknowledgement) return;
    connection.holds_acknowledgement = false;
    respond(connection, connection.held_acknowledgement);
}

void DeviceCore::respond(Connection& connection, const wire::Response& response, const void* payload,
                         std::uint32_t payload_length) {
    send_held_acknowledgement(connection);  // answers leave in the order of their requests
    // What the request wrote into this process's memory is released before the answer leaves:
    // the initiator may learn of the write from it and tell this process out of band.
    note_remote_access();
    std::vector<std::uint8_t> frame = wire::frame(wire::FrameType::response, response, payload, payload_length);
    if (connection.socket < 0 && same_gid(connection.gid, gid) && connection.lid == lid) {
        loopback_.push_back(std::move(frame));
        return;
    }
    queue_output(connection, frame);
}

bool DeviceCore::send_request(QueuePairContext& queue_pair, const std::vector<std::uint8_t>& frame) {
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    if (same_gid(remote.gid, gid) && remote.lid == lid) {
        loopback_.push_back(frame);
        return true;
    }
    Connection* connection = connection_to(remote.gid, remote.lid);
    if (connection == nullptr) return false;
    queue_output(*connection, frame);
    return connection->socket >= 0;
}

}  // namespace rdmachan::soft
