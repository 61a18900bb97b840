// DC routing (MultiChannel only): W DC initiators shared by every peer, one DC target whose
// shared receive queue holds engine-owned receive buffers, and receives matched to the peer that
// sent. Per peer it keeps only an address vector, its current initiator and two linked queues:
// nothing sized by the queue depth (docs/SCALE.md), and only for the peers this process has
// contacted. The fixed world's peers are addressed from a directory (src/dc_peer_directory.hpp)
// when this process first posts to them or first receives from them; peers added by the
// application, members and replacements are addressed when they connect.
#pragma once

#include <array>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "src/dc_peer_directory.hpp"
#include "src/engine.hpp"
#include "src/linked_index_queue.hpp"
#include "src/peer_pairing.hpp"

namespace rdmachan::detail {

class DcRouting final : public PeerRouting {
public:
    // Creates the engine's completion queues, the initiators, the target and its receive buffers.
    DcRouting(Engine& engine, const DcSettings& settings);

    std::uint64_t slot_capacity() const override { return capacity_; }
    const ChannelEndpoint& local_endpoint(std::uint32_t) const override { return own_; }
    const ChannelEndpoint& remote_endpoint(std::uint32_t) const override { return no_remote_; }
    transport::QueuePair* own_queue_pair(std::uint32_t) const override { return nullptr; }
    SendRoute route_send(std::uint32_t peer, std::uint64_t ticket, mlx5::SendWorkRequest* requests,
                         std::uint32_t count) override;
    std::uint64_t post_receive(std::uint32_t peer, const LocalSlice& local) override;
    void take_arrival(const mlx5::Completion& completion) override;
    void move_to_error(std::uint32_t peer, const char* why) override;
    void forget(std::uint32_t peer) override;
    bool recover_shared_queues() override;
    std::uint32_t queue_pair_count() const override { return static_cast<std::uint32_t>(initiators_.size()) + 1; }
    const PeerPairing& pairing() const override { return dc_pairing(); }
    void first_post(std::uint32_t peer) override;
    bool reachable_before_contact(std::uint32_t peer) const override {
        return directory_ != nullptr && directory_->record(peer).has_value();
    }

    std::uint32_t target_number() const { return target_->number(); }
    std::uint64_t key() const { return key_; }
    std::vector<std::uint32_t> initiator_numbers() const;
    // Engine::replace_dc_peer and connect_dc_member: a peer addressed explicitly.
    void connect(std::uint32_t peer, const DcPeerAddress& remote);
    void replace(std::uint32_t peer, const DcPeerAddress& remote);
    void connect_member(std::uint32_t peer, const DcPeerAddress& remote, const char* why);
    // Engine::use_dc_directory: the fixed world's peers, addressed from it on first use.
    void use_directory(std::shared_ptr<const DcPeerDirectory> directory) { directory_ = std::move(directory); }

private:
    // Where a peer's address came from: a directory match of a receive is taken only while it
    // is the directory's (a replacement's or a member's initiators are its own).
    enum class Addressed : std::uint8_t { not_yet, from_directory, explicitly, forgotten };
    struct Peer {
        std::array<std::uint8_t, 48> address_vector{};  // where its work requests go
        std::int32_t initiator = -1;                    // the initiator its sends in flight are on
        Addressed addressed = Addressed::not_yet;
        bool address_failed = false;  // its address vector could not be made: its sends fail
        LinkedIndexQueue arrivals;  // receive buffers holding a message from it (arrival_links_)
        LinkedIndexQueue waiting;   // receive slots waiting for one (waiting_links_), at most max_recv_wr
    };
    struct Initiator {
        std::shared_ptr<transport::QueuePair> queue_pair;
        SharedSendQueue shared;
    };
    // Where a waiting receive's message is copied to, by slot.
    struct ReceiveTarget {
        std::uint64_t addr = 0;
        std::uint32_t length = 0;
    };

    void connect_initiator(transport::QueuePair& initiator);
    // The peer's routing state, made if it has none (with its engine state).
    Peer& peer_of(std::uint32_t index);
    // Addresses a peer nothing addressed yet from the directory; false when it has no record.
    bool address_from_directory(std::uint32_t index, Peer& peer);
    // The rank whose initiator `initiator` on LID `lid` is now, without making any state: a rank
    // addressed explicitly, or the directory's while the rank is still its process.
    std::optional<std::uint32_t> claimant(std::uint16_t lid, std::uint32_t initiator) const;
    // Where `key` (handshake::dc_sender_key) is in senders_, or would be inserted.
    std::size_t sender_position(std::uint64_t key) const;
    // The rank a receive from initiator `initiator` on LID `lid` came from, if any.
    std::optional<std::uint32_t> sender_of(std::uint16_t lid, std::uint32_t initiator);
    bool fits_receive_buffers(const mlx5::SendWorkRequest* requests, std::uint32_t count) const;
    std::int32_t choose_initiator(Engine::Peer& common, Peer& peer, std::uint32_t count);
    void repost_receive_buffer(std::uint32_t buffer);
    void match_receives(std::uint32_t peer);

    Engine& engine_;
    DcSettings settings_;
    std::uint64_t key_ = 0;
    std::uint64_t capacity_ = 0;
    ChannelEndpoint own_;        // the process's one endpoint: no queue pair number of its own
    ChannelEndpoint no_remote_;  // a DC peer has no single remote queue pair
    std::deque<Peer> peers_;  // by Engine::Peer::routing_state; elements never move
    std::shared_ptr<const DcPeerDirectory> directory_;
    std::vector<Initiator> initiators_;  // sized once: slots point at their SharedSendQueue
    std::shared_ptr<transport::SharedReceiveQueue> shared_receive_queue_;
    std::shared_ptr<transport::DcTarget> target_;
    std::uint8_t* receive_memory_ = nullptr;  // the receive buffers, owned by receive_registration_
    transport::Registration receive_registration_;
    std::vector<mlx5::Completion> arrived_;     // by receive buffer
    std::vector<std::uint32_t> arrival_links_;  // by receive buffer: the next in its peer's arrivals
    std::vector<std::uint32_t> waiting_links_;  // by slot: the next in its peer's waiting receives
    std::vector<ReceiveTarget> receive_targets_;  // by slot
    // (LID << 32 | initiator number) -> rank, sorted: who sent a receive, for peers addressed
    // explicitly (the directory has the fixed world's).
    std::vector<std::pair<std::uint64_t, std::uint32_t>> senders_;
};

}  // namespace rdmachan::detail
