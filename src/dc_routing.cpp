// Why DC receives copy: a shared receive queue hands its next buffer to whichever peer's message
// arrives first, so a user's "receive from rank 3" cannot be posted there. The routing keeps its
// own buffers in the SRQ, learns the sender of each arrival from the initiator number (and LID)
// the CQE names, and gives the oldest arrival from that peer to the oldest receive waiting for
// it. One-sided operations (write, read, atomics) stay zero-copy.
#include "src/dc_routing.hpp"

#include <algorithm>
#include <chrono>
#include <cstring>

#include "common/logger.hpp"
#include "rdmachan/handshake.hpp"

namespace rdmachan::detail {
namespace {

// Why a peer's posts fail when its first post could not make its address vector.
constexpr const char* kNotAddressed = "its DC address vector could not be made (the log says why)";

}  // namespace

DcRouting::DcRouting(Engine& engine, const DcSettings& settings) : engine_(engine), settings_(settings) {
    const ChannelSettings& channel = engine.settings_;
    const std::uint32_t initiator_count = settings.initiators;
    if (initiator_count == 0 || settings.receive_buffers == 0 || settings.receive_size == 0) {
        throw Error("DC: initiators, receive buffers and receive size must be positive");
    }
    // DC initiators and targets are created without scatter-to-CQE (a DC initiator's needs a
    // capability of its own, dc_req_scat_data_cqe); saying so beats running without it.
    if (channel.scatter_to_cqe) {
        throw Error("scatter_to_cqe: DC mode creates its queue pairs without scatter-to-CQE; it is for RC queue pairs only");
    }
    engine.create_completion_queues(initiator_count * channel.max_send_wr, settings.receive_buffers + 1);
    transport::ProtectionDomain& domain = *engine.domain_;

    transport::QueuePairSettings queue_pair_settings;
    queue_pair_settings.max_send_wr = channel.max_send_wr;
    queue_pair_settings.max_send_sge = channel.max_send_sge;
    queue_pair_settings.max_inline_data = channel.max_inline_data;
    queue_pair_settings.port = channel.port;
    queue_pair_settings.access = static_cast<std::uint32_t>(channel.access);
    initiators_.resize(initiator_count);
    for (Initiator& initiator : initiators_) {
        initiator.queue_pair = domain.create_dc_initiator(queue_pair_settings, engine.send_completions_);
        connect_initiator(*initiator.queue_pair);
    }

    key_ = settings.key.has_value() ? *settings.key : random_dc_key();
    shared_receive_queue_ = domain.create_shared_receive_queue(settings.receive_buffers, engine.receive_completions_);
    target_ = domain.create_dc_target(shared_receive_queue_, engine.receive_completions_, key_,
                                      static_cast<std::uint32_t>(channel.access));
    // The DCT number exists from RTR on: the endpoint is published after this.
    target_->make_ready(channel.port, std::min(channel.mtu, engine.port_.active_mtu), channel.min_rnr_timer);

    own_.gid = engine.port_.gid;
    own_.lid = engine.port_.lid;
    own_.psn = channel.psn.has_value() ? *channel.psn : random_psn();
    own_.mtu = std::min(channel.mtu, engine.port_.active_mtu);
    own_.device = engine.device_->name();

    // The initiators' send depth and a receive depth (receives wait here, not in a queue pair),
    // and one receive more for each peer once it is contacted (first_post); more receives than
    // that wait for a slot, as a full queue does, up to the deadline.
    capacity_ = static_cast<std::uint64_t>(initiator_count) * channel.max_send_wr + channel.max_recv_wr;
    waiting_links_.assign(capacity_, LinkedIndexQueue::kNone);
    receive_targets_.resize(capacity_);

    // From the device: on the software device that is memory its same-host peers map, so their
    // DC sends land here with a memcpy, on their own thread (zero_hop_receive.cpp).
    receive_registration_ = domain.allocate_memory(
        static_cast<std::size_t>(settings.receive_buffers) * settings.receive_size, transport::kAccessLocalWrite);
    receive_memory_ = receive_registration_.data;
    arrived_.resize(settings.receive_buffers);
    arrival_links_.assign(settings.receive_buffers, LinkedIndexQueue::kNone);
    for (std::uint32_t buffer = 0; buffer < settings.receive_buffers; ++buffer) repost_receive_buffer(buffer);
}

void DcRouting::connect_initiator(transport::QueuePair& initiator) {
    const ChannelSettings& channel = engine_.settings_;
    transport::ConnectSettings connect;
    connect.local_psn = channel.psn.has_value() ? *channel.psn : random_psn();
    connect.path_mtu = std::min(channel.mtu, engine_.port_.active_mtu);
    connect.ack_timeout = channel.ack_timeout;
    connect.retry_count = channel.retry_count;
    connect.rnr_retry = channel.rnr_retry;
    connect.max_rd_atomic = channel.max_rd_atomic;
    connect.source_gid_index = engine_.port_.gid_index;
    initiator.connect(connect);
}

std::vector<std::uint32_t> DcRouting::initiator_numbers() const {
    std::vector<std::uint32_t> numbers;
    for (const Initiator& initiator : initiators_) numbers.push_back(initiator.queue_pair->qpn());
    return numbers;
}

DcRouting::Peer& DcRouting::peer_of(std::uint32_t index) {
    Engine::Peer& common = engine_.peer_state(index);
    if (common.routing_state == Engine::kNoRoutingState) {
        common.routing_state = static_cast<std::uint32_t>(peers_.size());
        peers_.emplace_back();
    }
    return peers_[common.routing_state];
}

bool DcRouting::address_from_directory(std::uint32_t index, Peer& peer) {
    const std::optional<DcPeerRecord> record = directory_ != nullptr ? directory_->record(index) : std::nullopt;
    if (!record.has_value()) return false;
    try {
        peer.address_vector =
            engine_.domain_->dc_address_vector(engine_.port_, record->gid, record->lid, record->dctn, record->key);
    } catch (const std::exception& error) {
        // On the post path: the peer's operations fail naming why, nothing is thrown.
        // Its sends fail (route_send says why); its messages are still its own, since a
        // receive needs no address vector.
        logger().error("rank {}: its DC address vector could not be made: {}", index, error.what());
        peer.addressed = Addressed::from_directory;
        peer.address_failed = true;
        engine_.set_connected(index, true);
        return false;
    }
    peer.addressed = Addressed::from_directory;
    engine_.set_connected(index, true);
    return true;
}

void DcRouting::first_post(std::uint32_t index) {
    Peer& peer = peer_of(index);
    if (peer.addressed == Addressed::not_yet) address_from_directory(index, peer);
    // Its share of the slots: room for one receive from it besides everything else.
    engine_.slots_.grow(1);
    waiting_links_.push_back(LinkedIndexQueue::kNone);
    receive_targets_.emplace_back();
    ++capacity_;
}

void DcRouting::connect(std::uint32_t index, const DcPeerAddress& remote) {
    Engine::Peer& common = engine_.peer_state(index);
    if (common.connected) throw Error("connect " + engine_.peer_name(index) + ": already connected");
    // Refused before anything changes: a receive names only LID and initiator.
    for (std::uint32_t initiator : remote.initiators) {
        const std::optional<std::uint32_t> other = claimant(remote.lid, initiator);
        if (other.has_value() && *other != index) {
            throw Error(handshake::DirectoryView::describe({*other, index, initiator, remote.lid}));
        }
    }
    // The name stays "rank N" (Engine::peer_name), made when asked for: a name of its own would
    // be a heap block per peer, and at thousands of DC peers every byte per peer counts.
    logger().debug("rank {}: {} DC target {}", index, remote.device, remote.dctn);
    Peer& peer = peer_of(index);
    peer.address_vector =
        engine_.domain_->dc_address_vector(engine_.port_, remote.gid, remote.lid, remote.dctn, remote.key);
    peer.addressed = Addressed::explicitly;
    peer.address_failed = false;
    for (std::uint32_t initiator : remote.initiators) {
        const std::uint64_t key = handshake::dc_sender_key(remote.lid, initiator);
        const std::size_t position = sender_position(key);
        // Already there: this rank named the initiator twice (any other claimant was refused above).
        if (position == senders_.size() || senders_[position].first != key)
            senders_.insert(senders_.begin() + static_cast<std::ptrdiff_t>(position), {key, index});
    }
    engine_.set_connected(index, true);
}

void DcRouting::forget(std::uint32_t index) {
    Peer& peer = peer_of(index);
    // Messages the old process sent that no receive took: they belong to a session that has gone.
    while (!peer.arrivals.empty()) repost_receive_buffer(peer.arrivals.pop(arrival_links_));
    // Its old initiators name the old process: a late message from them is dropped, not matched.
    std::erase_if(senders_, [index](const auto& entry) { return entry.second == index; });
    peer.initiator = -1;
    peer.addressed = Addressed::forgotten;
}

void DcRouting::replace(std::uint32_t index, const DcPeerAddress& remote) {
    if (engine_.peer_state(index).outstanding != 0) engine_.fail_and_flush(index, "its process was replaced");
    connect_member(index, remote, kReplacementNotConnected);
}

void DcRouting::connect_member(std::uint32_t index, const DcPeerAddress& remote, const char* why) {
    Engine::Peer& common = engine_.peer_state(index);
    if (common.outstanding != 0) engine_.fail_and_flush(index, why);
    forget(index);
    engine_.set_connected(index, false);  // forgotten: connect takes it as a peer never connected
    connect(index, remote);
    engine_.set_connected(index, false);  // addressable now, usable once `why` is cleared
    common.unavailable = why;
    common.healthy = true;
}

bool DcRouting::fits_receive_buffers(const mlx5::SendWorkRequest* requests, std::uint32_t count) const {
    static_assert(kDcMaxSendBytes == 16384, "the refusal message in route_send names the limit");
    for (std::uint32_t i = 0; i < count; ++i) {
        const mlx5::SendOpcode opcode = requests[i].opcode;
        if (opcode != mlx5::SendOpcode::send && opcode != mlx5::SendOpcode::send_with_immediate &&
            opcode != mlx5::SendOpcode::send_with_invalidate) {
            continue;
        }
        std::uint64_t bytes = 0;
        for (std::uint32_t element = 0; element < requests[i].num_sge; ++element) bytes += requests[i].sg_list[element].length;
        if (bytes > settings_.receive_size) return false;
    }
    return true;
}

SendRoute DcRouting::route_send(std::uint32_t index, std::uint64_t ticket, mlx5::SendWorkRequest* requests,
                                std::uint32_t count) {
    // Engine::post_send made both states (first_post) before it claimed the slot.
    Engine::Peer& common = *engine_.peers_[index];
    // A failed peer is not retried on initiators the live peers share (its next failure would
    // take their work down with it).
    if (!common.healthy) return {nullptr, mlx5::CompletionStatus::general_error, "the peer failed earlier"};
    Peer& peer = peers_[common.routing_state];
    if (peer.address_failed) [[unlikely]] return {nullptr, mlx5::CompletionStatus::general_error, kNotAddressed};
    if (!fits_receive_buffers(requests, count)) {
        // The target's receive buffer would be too short: the request would fail there, and
        // the error would take down the initiator every live peer shares.
        return {nullptr, mlx5::CompletionStatus::local_length_error,
                "a send in DC mode carries at most 16384 bytes (rdmachan::kDcMaxSendBytes, the DC target's receive "
                "buffers); use an RDMA write for more"};
    }
    if (!engine_.reserve_send_budget(common, count)) {
        return {nullptr, mlx5::CompletionStatus::general_error,
                "the send budget (max_send_wr) stayed full until the deadline"};
    }
    const std::int32_t chosen = choose_initiator(common, peer, count);
    if (chosen < 0) {
        return {nullptr, mlx5::CompletionStatus::general_error, "no DC initiator had room until the deadline"};
    }
    Initiator& initiator = initiators_[chosen];
    engine_.slots_.of(ticket).shared_queue = &initiator.shared;
    initiator.shared.send_in_flight += count;
    for (std::uint32_t i = 0; i < count; ++i) requests[i].dc_address_vector = peer.address_vector.data();
    return {initiator.queue_pair.get(), mlx5::CompletionStatus::success, nullptr};
}

std::int32_t DcRouting::choose_initiator(Engine::Peer& common, Peer& peer, std::uint32_t count) {
    const std::uint32_t depth = engine_.settings_.max_send_wr;
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + engine_.settings_.deadline;
    for (;;) {
        // Ordering: a peer stays on its initiator while it has work there.
        std::int32_t chosen = -1;
        if (peer.initiator >= 0 && common.send_in_flight > 0 && !initiators_[peer.initiator].shared.failed) {
            chosen = peer.initiator;
        } else {
            for (std::uint32_t index = 0; index < initiators_.size(); ++index) {
                if (initiators_[index].shared.failed) continue;
                if (chosen < 0 || initiators_[index].shared.send_in_flight < initiators_[chosen].shared.send_in_flight) {
                    chosen = static_cast<std::int32_t>(index);
                }
            }
        }
        if (chosen >= 0 && initiators_[chosen].shared.send_in_flight + count <= depth) {
            peer.initiator = chosen;
            return chosen;
        }
        if (engine_.poll_once()) continue;
        if (std::chrono::steady_clock::now() >= until) return -1;
        engine_.backoff(round, until);
    }
}

bool DcRouting::recover_shared_queues() {
    bool still_failed = false;
    for (Initiator& initiator : initiators_) {
        if (!initiator.shared.failed) continue;
        if (initiator.shared.send_in_flight != 0) {
            still_failed = true;
            continue;
        }
        // Everything it held has completed (flushed): RESET, back to RTS, producer index 0.
        try {
            engine_.domain_->recover_dc_initiator(*initiator.queue_pair);
            connect_initiator(*initiator.queue_pair);
            initiator.shared.failed = false;
            logger().info("DC initiator {} recovered", initiator.queue_pair->qpn());
        } catch (const std::exception& error) {
            logger().error("DC initiator {} could not be recovered: {}", initiator.queue_pair->qpn(), error.what());
            still_failed = true;
        }
    }
    return still_failed;
}

void DcRouting::repost_receive_buffer(std::uint32_t buffer) {
    const mlx5::ScatterGatherElement element{
        reinterpret_cast<std::uint64_t>(receive_memory_) + static_cast<std::uint64_t>(buffer) * settings_.receive_size,
        settings_.receive_size, receive_registration_.lkey};
    const mlx5::ReceiveWorkRequest request{kEngineReceiveBuffer | buffer, &element, 1};
    std::uint32_t posted = 0;
    if (shared_receive_queue_->post_receive(&request, 1, &posted) != mlx5::PostResult::ok) {
        logger().error("DC: receive buffer {} could not be posted back to the shared receive queue", buffer);
    }
}

void DcRouting::take_arrival(const mlx5::Completion& completion) {
    const auto buffer = static_cast<std::uint32_t>(completion.wr_id & ~kEngineReceiveBuffer);
    if (buffer >= arrived_.size()) return;
    if (completion.status != mlx5::CompletionStatus::success) {
        // Flushed at teardown, or a message larger than a receive buffer: the sender's own
        // completion reports it to the sender.
        if (completion.status != mlx5::CompletionStatus::work_request_flushed) {
            logger().warn("DC: a receive failed ({}); the sender's completion says why",
                          mlx5::to_string(completion.status));
            repost_receive_buffer(buffer);
        }
        return;
    }
    const std::optional<std::uint32_t> sender = sender_of(completion.slid, completion.src_qp);
    if (!sender.has_value()) {
        logger().warn("DC: a message from initiator {} (LID {}) that no rank published; dropped", completion.src_qp,
                      completion.slid);
        repost_receive_buffer(buffer);
        return;
    }
    // A receive buffer is in no list until it is reposted, so arrivals never exceed the buffers.
    arrived_[buffer] = completion;
    peer_of(*sender).arrivals.push(arrival_links_, buffer);
    match_receives(*sender);
}

std::size_t DcRouting::sender_position(std::uint64_t key) const {
    const auto found = std::lower_bound(senders_.begin(), senders_.end(), key,
                                        [](const auto& entry, std::uint64_t wanted) { return entry.first < wanted; });
    return static_cast<std::size_t>(found - senders_.begin());
}

std::optional<std::uint32_t> DcRouting::claimant(std::uint16_t lid, std::uint32_t initiator) const {
    const std::uint64_t key = handshake::dc_sender_key(lid, initiator);
    if (const std::size_t position = sender_position(key); position != senders_.size() && senders_[position].first == key)
        return senders_[position].second;
    const std::optional<std::uint32_t> rank = directory_ != nullptr ? directory_->sender(lid, initiator) : std::nullopt;
    if (!rank.has_value()) return std::nullopt;
    const Engine::Peer* common = engine_.peers_[*rank];
    if (common == nullptr || common->routing_state == Engine::kNoRoutingState) return rank;
    const Addressed addressed = peers_[common->routing_state].addressed;
    if (addressed == Addressed::not_yet || addressed == Addressed::from_directory) return rank;
    return std::nullopt;  // the rank's directory entry names a process it no longer is
}

std::optional<std::uint32_t> DcRouting::sender_of(std::uint16_t lid, std::uint32_t initiator) {
    const std::optional<std::uint32_t> rank = claimant(lid, initiator);
    if (!rank.has_value()) return std::nullopt;
    Peer& peer = peer_of(*rank);
    if (peer.addressed == Addressed::not_yet) address_from_directory(*rank, peer);
    return rank;
}

void DcRouting::match_receives(std::uint32_t index) {
    Peer& peer = peer_of(index);
    while (!peer.arrivals.empty() && !peer.waiting.empty()) {
        const std::uint32_t buffer = peer.arrivals.pop(arrival_links_);
        const std::uint32_t slot = peer.waiting.pop(waiting_links_);
        const ReceiveTarget& target = receive_targets_[slot];
        mlx5::Completion completion = arrived_[buffer];
        // A write with immediate consumed a receive but placed its bytes at the write's target:
        // byte_len is the write's length, and nothing is copied.
        const bool data_in_buffer = completion.opcode != mlx5::CompletionOpcode::receive_rdma_with_immediate;
        if (data_in_buffer && completion.byte_len > target.length) {
            completion.status = mlx5::CompletionStatus::local_length_error;
        } else if (data_in_buffer && completion.byte_len != 0) {
            std::memcpy(reinterpret_cast<void*>(target.addr),
                        receive_memory_ + static_cast<std::size_t>(buffer) * settings_.receive_size, completion.byte_len);
        }
        repost_receive_buffer(buffer);
        engine_.finish(engine_.slots_[slot], completion);
    }
}

std::uint64_t DcRouting::post_receive(std::uint32_t index, const LocalSlice& local) {
    Engine::Peer& common = engine_.peer_for_post(index);
    Peer& peer = peers_[common.routing_state];
    const std::uint64_t ticket = engine_.claim_slot(index, Operation::receive);
    if (ticket == kNoTicket) return ticket;
    if (common.unavailable != nullptr) [[unlikely]] {
        return engine_.fail_immediately(ticket, mlx5::CompletionStatus::general_error, common.unavailable);
    }
    if (local.zero_based()) [[unlikely]] {
        // A DC receive lands in the routing's buffers and is copied out by the CPU, which cannot
        // follow a layout's key: the NIC alone scatters through it.
        return engine_.fail_immediately(ticket, mlx5::CompletionStatus::local_protection_error,
                                        "a memory layout cannot be a DC receive's target (DC receives are copied from "
                                        "the engine's buffers by the CPU; receive into a plain region)");
    }
    const auto slot = static_cast<std::uint32_t>(ticket);
    receive_targets_[slot] = {local.addr(), local.length()};
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + engine_.settings_.deadline;
    while (peer.waiting.size() >= engine_.settings_.max_recv_wr) {
        if (engine_.poll_once()) continue;
        if (std::chrono::steady_clock::now() >= until) {
            return engine_.fail_immediately(ticket, mlx5::CompletionStatus::general_error,
                                            "the queue stayed full until the deadline");
        }
        engine_.backoff(round, until);
    }
    peer.waiting.push(waiting_links_, slot);
    match_receives(index);
    return ticket;
}

void DcRouting::move_to_error(std::uint32_t index, const char* why) {
    Peer& peer = peer_of(index);
    Engine::Peer& common = *engine_.peers_[index];
    flight::record(flight::ChannelEvent::qp_error, index, 0, flight::text(why));
    logger().warn("{}: failing its work on DC: {}", engine_.peer_name(index), why);
    common.healthy = false;
    // Its receives wait in the routing, not in the NIC: they end here.
    mlx5::Completion flushed;
    flushed.status = mlx5::CompletionStatus::work_request_flushed;
    flushed.is_receive = true;
    while (!peer.waiting.empty()) engine_.finish(engine_.slots_[peer.waiting.pop(waiting_links_)], flushed);
    // Its sends are on a shared initiator: that initiator goes to ERR (the other peers' work on
    // it fails too, as on hardware) and is recovered once flushed.
    if (common.send_in_flight != 0 && peer.initiator >= 0) {
        Initiator& initiator = initiators_[peer.initiator];
        engine_.mark_failed(initiator.shared);
        try {
            initiator.queue_pair->move_to_error();
        } catch (const std::exception& error) {
            logger().error("{}: moving DC initiator to ERR failed: {}", engine_.peer_name(index), error.what());
        }
    }
}

}  // namespace rdmachan::detail
