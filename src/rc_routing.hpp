// RC routing: a queue pair per peer, connected to that peer's queue pair for this rank. Its
// completion queues hold everything every queue pair can have in flight; a peer's own queue
// pair is also the one the engine's post fast path uses (Engine::Peer::direct).
#pragma once

#include <memory>
#include <vector>

#include "src/engine.hpp"
#include "src/peer_pairing.hpp"

namespace rdmachan::detail {

class RcRouting final : public PeerRouting {
public:
    // Creates the engine's completion queues and a queue pair per peer.
    explicit RcRouting(Engine& engine);

    std::uint64_t slot_capacity() const override;
    const ChannelEndpoint& local_endpoint(std::uint32_t peer) const override { return queues_[peer].local; }
    const ChannelEndpoint& remote_endpoint(std::uint32_t peer) const override { return queues_[peer].remote; }
    transport::QueuePair* own_queue_pair(std::uint32_t peer) const override { return queues_[peer].queue_pair.get(); }
    SendRoute route_send(std::uint32_t peer, std::uint64_t ticket, mlx5::SendWorkRequest* requests,
                         std::uint32_t count) override;
    std::uint64_t post_receive(std::uint32_t peer, const LocalSlice& local) override;
    void take_arrival(const mlx5::Completion& completion) override;
    void move_to_error(std::uint32_t peer, const char* why) override;
    void forget(std::uint32_t) override {}
    bool recover_shared_queues() override { return false; }
    std::uint32_t queue_pair_count() const override { return static_cast<std::uint32_t>(queues_.size()); }
    const PeerPairing& pairing() const override { return rc_pairing(); }
    void first_post(std::uint32_t) override {}
    bool reachable_before_contact(std::uint32_t) const override { return false; }

    // INIT -> RTR -> RTS towards the peer's queue pair. Throws rdmachan::Error naming the peer.
    void connect(std::uint32_t peer, const ChannelEndpoint& remote);
    // Engine::replace_rc_peer, prepare_rc_peer and connect_prepared_rc.
    void replace(std::uint32_t peer, const ChannelEndpoint& remote);
    const ChannelEndpoint& prepare(std::uint32_t peer, const char* why);
    void connect_prepared(std::uint32_t peer, const ChannelEndpoint& remote);

private:
    struct RcQueue {
        std::shared_ptr<transport::QueuePair> queue_pair;
        bool used = false;  // was ever connected: membership gives the slot's next member a fresh one
        ChannelEndpoint local;
        ChannelEndpoint remote;
    };
    // A new queue pair for the peer, with a new PSN; `call` names the caller in the error.
    void renew(std::uint32_t peer, const char* call);

    Engine& engine_;
    std::vector<RcQueue> queues_;
};

}  // namespace rdmachan::detail
