// How the engine reaches its peers: the part of the engine that differs between RC (a queue pair
// per peer, src/rc_routing.hpp) and DC (shared initiators and one target, src/dc_routing.hpp).
// One is chosen when the engine is built, and with it how the peers pair (src/peer_pairing.hpp). The engine's hot path calls none of this: an RC peer's
// single and batched posts go straight to its queue pair (Engine::Peer::direct), and completions
// are told apart by their wr_id (kEngineReceiveBuffer), not by the mode. A general post or a
// receive makes one call here; everything else is control path.
#pragma once

#include <cstdint>

#include "rdmachan/channel.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::detail {

class PeerPairing;

// Where a send goes, or why it cannot.
struct SendRoute {
    transport::QueuePair* queue_pair = nullptr;  // null: refused
    mlx5::CompletionStatus status = mlx5::CompletionStatus::general_error;
    const char* why = nullptr;
};

class PeerRouting {
public:
    virtual ~PeerRouting() = default;
    // How many operations may be outstanding at once: the engine's slot table is this size.
    virtual std::uint64_t slot_capacity() const = 0;
    virtual const ChannelEndpoint& local_endpoint(std::uint32_t peer) const = 0;
    virtual const ChannelEndpoint& remote_endpoint(std::uint32_t peer) const = 0;
    // The queue pair the post fast path may use for a connected peer: its own (RC), or none (DC).
    virtual transport::QueuePair* own_queue_pair(std::uint32_t peer) const = 0;
    // For a send whose slot `ticket` names: the checks of this mode, the send budget, and the
    // queue pair, with the requests' routing fields written.
    virtual SendRoute route_send(std::uint32_t peer, std::uint64_t ticket, mlx5::SendWorkRequest* requests,
                                 std::uint32_t count) = 0;
    // Claims a slot and posts (or queues) the receive; a ticket, as Engine::post_receive.
    virtual std::uint64_t post_receive(std::uint32_t peer, const LocalSlice& local) = 0;
    // A completion of an engine-owned receive buffer (its wr_id has kEngineReceiveBuffer set).
    virtual void take_arrival(const mlx5::Completion& completion) = 0;
    // The first half of failing a peer: whatever holds its work is moved to ERR (or, for work
    // kept in the engine, finished as flushed); the engine then collects the flushes.
    virtual void move_to_error(std::uint32_t peer, const char* why) = 0;
    // The peer's member left: what the routing remembers of it goes. The caller marks the peer
    // disconnected (Engine::set_connected), as it does for either routing.
    virtual void forget(std::uint32_t peer) = 0;
    // Brings shared send queues that failed, and have nothing in flight, back to RTS; true if
    // any is still failed.
    virtual bool recover_shared_queues() = 0;
    virtual std::uint32_t queue_pair_count() const = 0;
    // The peer's first post, its engine state made (Engine::first_post): DC addresses it from the
    // directory if nothing else did, and grows the slot table by the peer's share. RC: nothing
    // (every peer has its state and share from the start).
    virtual void first_post(std::uint32_t peer) = 0;
    // Whether a peer the engine holds no state for can be reached (Engine::connected).
    virtual bool reachable_before_contact(std::uint32_t peer) const = 0;
    // How a MultiChannel of this mode pairs with its peers in the endpoint schema.
    virtual const PeerPairing& pairing() const = 0;
};

}  // namespace rdmachan::detail
