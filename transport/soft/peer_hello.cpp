// The hello exchange that opens a connection between two software devices, and the choice of
// path it settles: TCP with the payload in the frame, or the same-host path, where the
// responder moves payloads by cross-memory attach between the two processes' registered memory.
#include <arpa/inet.h>

#include <cstring>
#include <memory>

#include "common/logger.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {

wire::Hello DeviceCore::make_hello(std::uint8_t flags) const {
    const HostIdentity identity = this_host_identity();
    wire::Hello hello{};
    std::memcpy(hello.gid, gid.data(), 16);
    hello.lid = lid;
    hello.same_host_flags = flags;
    std::memcpy(hello.boot_id, identity.boot_id.data(), 16);
    hello.uid = identity.uid;
    hello.network_namespace = identity.network_namespace;
    hello.pid_namespace = identity.pid_namespace;
    hello.pid = identity.pid;
    hello.published_table = -1;
    if ((flags & wire::kHelloReply) == 0 && settings_.transport_mode != TransportMode::tcp) hello.same_host_flags |= wire::kOffersSameHost;
    if ((flags & wire::kHelloReply) == 0) hello.same_host_flags |= wire::kAcceptsCoalescedAcks;
    // Both ways: each side checks, by reading it, that the pid it holds a pidfd for is the peer's.
    hello.probe_address = reinterpret_cast<std::uint64_t>(&probe_word_);
    hello.probe_value = probe_word_;
    return hello;
}

std::string DeviceCore::peer_name(const Connection& connection) const {
    char address[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, connection.gid.data() + 12, address, sizeof address);
    return std::string("soft:") + address + ":" + std::to_string(connection.lid);
}

void DeviceCore::handle_hello(Connection& connection, const wire::Hello& hello) {
    HostIdentity peer;
    std::memcpy(peer.boot_id.data(), hello.boot_id, 16);
    peer.uid = hello.uid;
    peer.network_namespace = hello.network_namespace;
    peer.pid_namespace = hello.pid_namespace;
    peer.pid = hello.pid;
    const HostIdentity mine = this_host_identity();
    const char* elsewhere = different_host_reason(mine, peer);

    if ((hello.same_host_flags & wire::kHelloReply) == 0) {
        // A caller: identify it, decide whether its payloads may move by reference, answer.
        std::memcpy(connection.gid.data(), hello.gid, 16);
        connection.lid = hello.lid;
        connection.identified = true;
        connection.accepts_coalesced_acknowledgements = (hello.same_host_flags & wire::kAcceptsCoalescedAcks) != 0;
        std::uint8_t flags = wire::kHelloReply;
        wire::Hello reply{};
        std::int32_t refusal = 0;
        if (elsewhere == nullptr) {
            flags |= wire::kSameHost;
            if ((hello.same_host_flags & wire::kOffersSameHost) == 0) {
                refusal = -1;  // the caller asked for TCP
            } else if (settings_.transport_mode == TransportMode::tcp) {
                refusal = -2;  // we were asked for TCP
            } else {
                refusal = probe_cross_memory_attach(hello.pid, hello.probe_address, hello.probe_value);
                // The pidfd every move into and out of the caller goes through (same_host.hpp).
                if (refusal == 0) refusal = connection.peer_process.open(hello.pid, hello.probe_address, hello.probe_value);
                if (refusal == 0) {
                    flags |= wire::kCrossMemoryAttach;
                    connection.by_reference = true;
                }
            }
        }
        reply = make_hello(flags);
        reply.refusal = refusal;
        reply.published_table = (flags & wire::kCrossMemoryAttach) != 0 && published_table.valid() ? published_table.descriptor() : -1;
        links_.queue_output(connection, wire::frame(wire::FrameType::hello, reply));
        return;
    }

    // The answer to our hello: the path is settled for the requests executed from now on.
    if (!connection.outgoing || !connection.awaiting_reply) {
        links_.close_connection(connection, "unexpected hello reply");
        return;
    }
    connection.awaiting_reply = false;
    const std::string name = peer_name(connection);
    const bool same_host = (hello.same_host_flags & wire::kSameHost) != 0;
    if (settings_.transport_mode == TransportMode::same_host && !same_host) {
        detail::logger().error("software device {}: RDMACHAN_SOFT_TRANSPORT=shm, but peer device {} is not on this host: {}",
                               owner_.name(), name, elsewhere != nullptr ? elsewhere : "it says so");
        links_.close_connection(connection, "RDMACHAN_SOFT_TRANSPORT=shm and the peer is on another host");
        return;
    }
    connection.by_reference = (hello.same_host_flags & wire::kCrossMemoryAttach) != 0;
    if (connection.by_reference) {
        const char* no_zero_hop = "RDMACHAN_SOFT_ZERO_HOP=0";
        if (settings_.zero_hop_enabled) {
            // Zero-hop writes go by pid: first the pidfd that makes sure the pid is the peer's.
            if (connection.peer_process.open(hello.pid, hello.probe_address, hello.probe_value) != 0) {
                no_zero_hop = "its pid could not be held by a pidfd and checked";
            } else {
                // Copies: the hello is packed, and make_unique takes its arguments by reference.
                const int descriptor = hello.published_table;
                auto table = std::make_unique<PeerTable>(connection.peer_process, descriptor);
                if (table->valid()) connection.peer_table = std::move(table);
                else no_zero_hop = table->why_not();
            }
        }
        if (connection.peer_table != nullptr) {
            // Now rather than in the first transfer: the peer's arena mapped, and its QPs' first
            // requests tried zero-hop on the thread that rings their doorbell.
            connection.peer_table->map_arena();
            for (auto& [qpn, queue_pair] : queue_pairs) {
                const RemoteQueuePair& remote = queue_pair->receive_attributes.remote;
                if (same_gid(remote.gid, connection.gid) && remote.lid == connection.lid) {
                    queue_pair->zero_hop_remote.store(true, std::memory_order_relaxed);
                }
            }
        }
        if (connection.peer_table != nullptr) {
            detail::logger().info("software device {}: peer {} is on this host: payloads move by cross-memory attach, "
                                  "RDMA writes zero-hop from the doorbell thread",
                                  owner_.name(), name);
        } else {
            detail::logger().info("software device {}: peer {} is on this host: payloads move by cross-memory attach "
                                  "(no zero-hop writes: {})",
                                  owner_.name(), name, no_zero_hop);
        }
    } else if (!same_host) {
        detail::logger().info("software device {}: peer {} uses TCP: {}", owner_.name(), name,
                              elsewhere != nullptr ? elsewhere : "it is on another host");
    } else if (hello.refusal == -1 || hello.refusal == -2) {
        detail::logger().info("software device {}: peer {} is on this host but uses TCP: RDMACHAN_SOFT_TRANSPORT=tcp {}",
                              owner_.name(), name, hello.refusal == -1 ? "here" : "at the peer");
    } else {
        // Cross-memory attach refused (Yama ptrace_scope, a seccomp profile, ...): payloads travel
        // in the frames instead.
        detail::logger().warn("software device {}: peer {} is on this host but cross-memory attach is refused ({}): "
                              "payloads travel over TCP",
                              owner_.name(), name, std::strerror(hello.refusal));
    }
    // Released after the QPs above were marked: a test that sees the count sees them marked.
    statistics.answered_hellos.fetch_add(1, std::memory_order_release);
}

}  // namespace rdmachan::soft
