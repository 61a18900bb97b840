// The software device's TCP links to other devices, and the framing on them: the listening
// socket, the connections (opened in the background or within a bounded wait, accepted), their
// output queues and reads, and the frames read off them, handed in order to the device above
// (LinkEvents). The connections' sockets are in an epoll set of their own, which the progress
// thread watches nested in its own set, or a caller of progress() polls (caller_progress.cpp).
// Everything here runs under the device mutex.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "transport/soft/connection.hpp"
#include "transport/soft/device_statistics.hpp"
#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

class Device;
struct DeviceOptions;

// What the links tell the device above them.
class LinkEvents {
public:
    // A whole frame read from `connection`, in the order the peer sent them (none while a
    // partition is simulated, but hellos).
    virtual void handle_frame(Connection& connection, wire::FrameType type, const std::uint8_t* body,
                              const std::uint8_t* payload, std::uint32_t payload_length) = 0;
    // An identified connection was closed (its socket is gone already).
    virtual void connection_closed(Connection& connection, const char* why) = 0;
    // A turn of reads from one connection begins, and ends: the frames between may be answered
    // together (the ACKs of plain writes, CQEs of compressed CQs). `begins` returns what `ended`
    // is given back.
    virtual bool read_turn_begins(Connection& connection) = 0;
    virtual void read_turn_ended(Connection& connection, bool began) = 0;
    // The hello an outgoing connection opens with.
    virtual wire::Hello opening_hello() const = 0;

protected:
    ~LinkEvents() = default;
};

class PeerLinks {
public:
    PeerLinks(LinkEvents& events, DeviceStatistics& statistics, const Device& owner);
    ~PeerLinks();
    PeerLinks(const PeerLinks&) = delete;
    PeerLinks& operator=(const PeerLinks&) = delete;

    // Listens on the options' address and port (0: any); throws SoftDeviceError naming them.
    void listen(const DeviceOptions& options);
    // The bound port (the device's LID) and IPv4 address (network order).
    std::uint16_t port() const { return port_; }
    std::uint32_t ipv4() const { return ipv4_; }
    int listen_descriptor() const { return listen_socket_; }
    void accept_connections();
    // The connections' epoll set; throws SoftDeviceError when it cannot be made.
    void open_set();
    int set_descriptor() const { return set_; }
    // Handles what the set reports (connects that ended, input, room for output); the number
    // of connections that had events.
    int poll();
    // Forgets the connections that were closed (after the events that may name them).
    void remove_closed();
    // When a connection last brought bytes (steady clock ticks).
    std::int64_t last_input() const { return last_input_.load(std::memory_order_relaxed); }

    // The open outgoing connection to that device, or nullptr (opens nothing).
    Connection* open_connection_to(const std::array<std::uint8_t, 16>& gid, std::uint16_t lid) const;
    // The same, opening it when there is none: `bounded` waits up to a second for the connect (a
    // request needs it now); `background` returns while it is in progress (finish_connect).
    enum class ConnectWait { bounded, background };
    Connection* connection_to(const std::array<std::uint8_t, 16>& gid, std::uint16_t lid,
                              ConnectWait wait = ConnectWait::bounded);
    // Sends what it can now and queues the rest (lost while a partition is simulated, but hellos).
    void queue_output(Connection& connection, const std::vector<std::uint8_t>& bytes);
    void close_connection(Connection& connection, const char* why);
    // Stops writing, reads what is still coming (briefly), then closes every connection.
    void close_gracefully();
    // The bytes received and not yet read (SIOCINQ) on the connections peers opened (false) or
    // this device opened (true).
    std::size_t unread_bytes(bool outgoing) const;

private:
    // A background connect completed (EPOLLOUT): what waited is sent, or the connection closes.
    void finish_connect(Connection& connection);
    void read_connection(Connection& connection);
    // Handles the complete frames at the front of the connection's input, in order.
    void handle_frames(Connection& connection);
    // How much room a read from a socket asks for (read_connection): at least the smallest, up
    // to the largest while reads fill what they ask, so that a window of requests is read in
    // few system calls while an idle connection holds little memory.
    static constexpr std::size_t kSmallestRead = 4u << 10;
    static constexpr std::size_t kLargestRead = 256u << 10;
    void write_connection(Connection& connection);
    // Asks epoll for EPOLLOUT on the connection while output waits for the socket, and stops.
    void watch_output(Connection& connection, bool waiting);

    LinkEvents& events_;
    DeviceStatistics& statistics_;
    const Device& owner_;
    int listen_socket_ = -1;
    std::uint16_t port_ = 0;
    std::uint32_t ipv4_ = 0;
    int set_ = -1;
    std::vector<std::unique_ptr<Connection>> connections_;
    std::atomic<std::int64_t> last_input_{0};
};

}  // namespace rdmachan::soft
