// The software device's TCP links (peer_links.hpp).
#include "transport/soft/peer_links.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstring>
#include <optional>

#include "common/logger.hpp"
#include "transport/soft/device.hpp"
#include "transport/soft/flight_events.hpp"

namespace rdmachan::soft {
namespace {

std::atomic<bool> partitioned_from_everyone{false};

void set_socket_options(int socket) {
    const int flags = ::fcntl(socket, F_GETFL, 0);
    ::fcntl(socket, F_SETFL, flags | O_NONBLOCK);
    const int one = 1;
    ::setsockopt(socket, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

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

bool same_address(const std::array<std::uint8_t, 16>& left, const std::array<std::uint8_t, 16>& right) {
    return std::memcmp(left.data(), right.data(), left.size()) == 0;
}

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

void simulate_partition(bool partitioned) noexcept {
    partitioned_from_everyone.store(partitioned);
    // Zero-hop writes carry no frame to lose: peers are told through this process's tables, and
    // this process's devices check partition_simulated() (zero_hop.cpp).
    PublishedTable::mark_partitioned(partitioned);
}

bool partition_simulated() noexcept {
    return partitioned_from_everyone.load();
}

PeerLinks::PeerLinks(LinkEvents& events, DeviceStatistics& statistics, const Device& owner)
    : events_(events), statistics_(statistics), owner_(owner) {
    raise_open_file_limit();
}

PeerLinks::~PeerLinks() {
    for (auto& connection : connections_) {
        if (connection->socket >= 0) ::close(connection->socket);
    }
    if (listen_socket_ >= 0) ::close(listen_socket_);
    if (set_ >= 0) ::close(set_);
}

void PeerLinks::listen(const DeviceOptions& options) {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(options.port);
    if (::inet_pton(AF_INET, options.address.c_str(), &address.sin_addr) != 1) {
        throw SoftDeviceError("software device: listen address '" + options.address + "' is not an IPv4 address");
    }
    const int socket = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (socket < 0) throw SoftDeviceError("software device: socket: " + socket_failure(errno));
    const int one = 1;
    ::setsockopt(socket, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(socket, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        const std::string why = std::strerror(errno);
        ::close(socket);
        throw SoftDeviceError("software device: cannot listen on " + options.address + ":" + std::to_string(options.port) + ": " + why);
    }
    // Every peer device may connect at once (first frames of a large job): a full backlog would
    // make the kernel retry their SYNs after a second.
    ::listen(socket, SOMAXCONN);
    socklen_t length = sizeof address;
    ::getsockname(socket, reinterpret_cast<sockaddr*>(&address), &length);
    set_socket_options(socket);
    listen_socket_ = socket;
    port_ = ntohs(address.sin_port);
    ipv4_ = address.sin_addr.s_addr;
}

void PeerLinks::open_set() {
    set_ = ::epoll_create1(EPOLL_CLOEXEC);
    if (set_ < 0) throw SoftDeviceError(std::string("software device: epoll_create1 failed: ") + std::strerror(errno));
}

// Closing a TCP socket that still holds unread input makes the kernel send a reset, and a reset
// makes the peer's kernel drop what it had not read yet — the acknowledgements this device
// sent last. A ConnectX keeps answering until its QPs are destroyed; the equivalent here is to
// stop writing, read what is still coming (briefly), then close.
void PeerLinks::close_gracefully() {
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

int PeerLinks::poll() {
    constexpr int kMaxEvents = 64;
    epoll_event events[kMaxEvents];
    const int ready = ::epoll_wait(set_, events, kMaxEvents, 0);
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

void PeerLinks::remove_closed() {
    std::erase_if(connections_, [](const std::unique_ptr<Connection>& connection) { return connection->socket < 0; });
}

void PeerLinks::accept_connections() {
    while (true) {
        const int socket = ::accept4(listen_socket_, nullptr, nullptr, SOCK_CLOEXEC);
        if (socket < 0) return;
        set_socket_options(socket);
        auto connection = std::make_unique<Connection>();
        connection->socket = socket;
        epoll_event event{};
        event.events = EPOLLIN;
        event.data.u64 = reinterpret_cast<std::uint64_t>(connection.get());
        ::epoll_ctl(set_, EPOLL_CTL_ADD, socket, &event);
        connections_.push_back(std::move(connection));
    }
}

Connection* PeerLinks::open_connection_to(const std::array<std::uint8_t, 16>& remote_gid, std::uint16_t remote_lid) const {
    for (auto& connection : connections_) {
        if (connection->outgoing && connection->socket >= 0 && same_address(connection->gid, remote_gid) &&
            connection->lid == remote_lid) {
            return connection.get();
        }
    }
    return nullptr;
}

Connection* PeerLinks::connection_to(const std::array<std::uint8_t, 16>& remote_gid, std::uint16_t remote_lid,
                                     ConnectWait wait) {
    if (Connection* open = open_connection_to(remote_gid, remote_lid); open != nullptr) return open;
    if (remote_gid[10] != 0xff || remote_gid[11] != 0xff) return nullptr;  // not an IPv4-mapped GID
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(remote_lid);
    std::memcpy(&address.sin_addr, remote_gid.data() + 12, 4);
    DeviceStatistics::count_one(statistics_.connects_started);
    const int socket = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (socket < 0) {
        detail::logger().error("software device {}: cannot open a connection to lid {}: {}", owner_.name(), remote_lid,
                               socket_failure(errno));
        DeviceStatistics::count_one(statistics_.connects_failed);
        return nullptr;
    }
    bool connecting = false;
    if (::connect(socket, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0) {
        if (errno != EINPROGRESS) {
            ::close(socket);
            DeviceStatistics::count_one(statistics_.connects_failed);
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
                DeviceStatistics::count_one(statistics_.connects_failed);
                return nullptr;
            }
        }
    }
    set_socket_options(socket);
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
    ::epoll_ctl(set_, EPOLL_CTL_ADD, socket, &event);
    queue_output(*connection, wire::frame(wire::FrameType::hello, events_.opening_hello()));
    connection->awaiting_reply = true;
    connections_.push_back(std::move(connection));
    return connections_.back().get();
}

void PeerLinks::finish_connect(Connection& connection) {
    int error = 0;
    socklen_t length = sizeof error;
    if (::getsockopt(connection.socket, SOL_SOCKET, SO_ERROR, &error, &length) != 0) error = errno;
    if (error != 0) {
        // Requests queued behind the connect fail their QP as on any lost connection; a QP with
        // none finds no connection at its first request and connects then (bounded).
        DeviceStatistics::count_one(statistics_.connects_failed);
        close_connection(connection, "connect failed");
        return;
    }
    connection.connecting = false;
    write_connection(connection);
}

void PeerLinks::queue_output(Connection& connection, const std::vector<std::uint8_t>& bytes) {
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

void PeerLinks::watch_output(Connection& connection, bool waiting) {
    if (connection.write_interest == waiting) return;  // one epoll_ctl per change, not per frame
    epoll_event event{};
    event.events = waiting ? EPOLLIN | EPOLLOUT : EPOLLIN;
    event.data.u64 = reinterpret_cast<std::uint64_t>(&connection);
    ::epoll_ctl(set_, EPOLL_CTL_MOD, connection.socket, &event);
    connection.write_interest = waiting;
}

void PeerLinks::write_connection(Connection& connection) {
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

void PeerLinks::read_connection(Connection& connection) {
    // A peer that answers and then closes leaves its last answers in front of the end of the
    // stream: they are handled before the connection is, as a NIC handles packets in order.
    const char* ended = nullptr;
    ConnectionInput& input = connection.input;
    // The device above answers the frames of this turn together where it can (the ACKs of plain
    // writes, the CQEs of compressed CQs), after the last.
    const struct EndTurn {
        LinkEvents& events;
        Connection& connection;
        bool began;
        ~EndTurn() { events.read_turn_ended(connection, began); }
    } end_turn{events_, connection, events_.read_turn_begins(connection)};
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
            last_input_.store(std::chrono::steady_clock::now().time_since_epoch().count(), std::memory_order_relaxed);
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

void PeerLinks::handle_frames(Connection& connection) {
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
            events_.handle_frame(connection, header.type, body_bytes, body_bytes + wire::body_size(header.type),
                                 header.payload_length);
        }
        input.consume(front->size);
    }
}

void PeerLinks::close_connection(Connection& connection, const char* why) {
    if (connection.socket < 0) return;
    ::epoll_ctl(set_, EPOLL_CTL_DEL, connection.socket, nullptr);
    ::close(connection.socket);
    connection.socket = -1;
    connection.holds_acknowledgement = false;
    if (!connection.identified) return;
    flight::record(flight::SoftEvent::connection_closed, connection.lid, connection.outgoing, flight::text(why));
    detail::logger().info("software device {}: connection to lid {} closed: {}", owner_.name(), connection.lid, why);
    events_.connection_closed(connection, why);
}

std::size_t PeerLinks::unread_bytes(bool outgoing) const {
    std::size_t total = 0;
    for (const auto& connection : connections_) {
        int waiting = 0;
        if (connection->outgoing == outgoing && connection->socket >= 0 && ::ioctl(connection->socket, SIOCINQ, &waiting) == 0) total += static_cast<std::size_t>(waiting);
    }
    return total;
}

}  // namespace rdmachan::soft
