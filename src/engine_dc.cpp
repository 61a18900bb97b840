// The engine's DC mode: W DC initiators shared by every peer, one DC target whose shared
// receive queue holds engine-owned receive buffers, and receives matched to the peer that sent.
//
// Why receives copy: a shared receive queue hands its next buffer to whichever peer's message
// arrives first, so a user's "receive from rank 3" cannot be posted there. The engine keeps its
// own buffers in the SRQ, learns the sender of each arrival from the initiator number (and LID)
// the CQE names, and gives the oldest arrival from that peer to the oldest receive waiting for
// it. One-sided operations (write, read, atomics) stay zero-copy.
#include <algorithm>
#include <cstring>

#include "rdmachan/handshake.hpp"
#include "src/engine.hpp"
#include "common/logger.hpp"

namespace rdmachan::detail {
namespace {

// Receive buffers' wr_ids: far above any ticket (generation << 32 | slot).
constexpr std::uint64_t kReceiveBuffer = 1ull << 63;

std::uint64_t sender_key(std::uint16_t lid, std::uint32_t initiator) {
    return static_cast<std::uint64_t>(lid) << 32 | initiator;
}

}  // namespace

void Engine::build_dc() {
    const std::uint32_t initiator_count = dc_.initiators;
    if (initiator_count == 0 || dc_.receive_buffers == 0 || dc_.receive_size == 0) {
        throw Error("DC: initiators, receive buffers and receive size must be positive");
    }
    // DC initiators and targets are created without scatter-to-CQE (a DC initiator's needs a
    // capability of its own, dc_req_scat_data_cqe); saying so beats running without it.
    if (settings_.scatter_to_cqe) {
        throw Error("scatter_to_cqe: DC mode creates its queue pairs without scatter-to-CQE; it is for RC queue pairs only");
    }
    send_completions_ = domain_->create_completion_queue(
        std::max<std::uint32_t>(settings_.cq_entries, initiator_count * settings_.max_send_wr), cqe_compression());
    receive_completions_ = domain_->create_completion_queue(std::max(settings_.cq_entries, dc_.receive_buffers + 1),
                                                            cqe_compression());

    transport::QueuePairSettings queue_pair_settings;
    queue_pair_settings.max_send_wr = settings_.max_send_wr;
    queue_pair_settings.max_send_sge = settings_.max_send_sge;
    queue_pair_settings.max_inline_data = settings_.max_inline_data;
    queue_pair_settings.port = settings_.port;
    queue_pair_settings.access = static_cast<std::uint32_t>(settings_.access);
    initiators_.resize(initiator_count);
    for (Initiator& initiator : initiators_) {
        initiator.queue_pair = domain_->create_dc_initiator(queue_pair_settings, send_completions_);
        connect_initiator(*initiator.queue_pair);
    }

    dc_key_ = dc_.key.has_value() ? *dc_.key : random_dc_key();
    shared_receive_queue_ = domain_->create_shared_receive_queue(dc_.receive_buffers, receive_completions_);
    target_ = domain_->create_dc_target(shared_receive_queue_, receive_completions_, dc_key_,
                                        static_cast<std::uint32_t>(settings_.access));
    // The DCT number exists from RTR on: the endpoint is published after this.
    target_->make_ready(settings_.port, std::min(settings_.mtu, port_.active_mtu), settings_.min_rnr_timer);

    // From the device: on the software device that is memory its same-host peers map, so their
    // DC sends land here with a memcpy, on their own thread (zero_hop_receive.cpp).
    receive_registration_ = domain_->allocate_memory(static_cast<std::size_t>(dc_.receive_buffers) * dc_.receive_size,
                                                     transport::kAccessLocalWrite);
    receive_memory_ = receive_registration_.data;
    arrived_.resize(dc_.receive_buffers);
    arrival_links_.assign(dc_.receive_buffers, LinkedIndexQueue::kNone);
    for (std::uint32_t index = 0; index < dc_.receive_buffers; ++index) repost_receive_buffer(index);
}

void Engine::connect_initiator(transport::QueuePair& initiator) {
    transport::ConnectSettings connect;
    connect.local_psn = settings_.psn.has_value() ? *settings_.psn : random_psn();
    connect.path_mtu = std::min(settings_.mtu, port_.active_mtu);
    connect.ack_timeout = settings_.ack_timeout;
    connect.retry_count = settings_.retry_count;
    connect.rnr_retry = settings_.rnr_retry;
    connect.max_rd_atomic = settings_.max_rd_atomic;
    connect.source_gid_index = port_.gid_index;
    initiator.connect(connect);
}

std::uint32_t Engine::dc_target_number() const {
    if (target_ == nullptr) throw Error("dc_target_number: this multi-channel is not in DC mode");
    return target_->number();
}

std::vector<std::uint32_t> Engine::dc_initiator_numbers() const {
    std::vector<std::uint32_t> numbers;
    for (const Initiator& initiator : initiators_) numbers.push_back(initiator.queue_pair->qpn());
    return numbers;
}

std::uint32_t Engine::queue_pair_count() const {
    const std::uint32_t layouts = umr_queue_pair_ != nullptr ? 1 : 0;
    if (dc_.enabled) return static_cast<std::uint32_t>(initiators_.size()) + 1 + layouts;
    return static_cast<std::uint32_t>(peers_.size()) + layouts;
}

void Engine::connect_dc(std::uint32_t index, const DcPeerAddress& remote) {
    Peer& peer = peers_[index];
    if (peer.connected) throw Error("connect " + peer.name + ": already connected");
    // "rank N" (set at construction) stays the name: a longer one would be a heap block per
    // peer, and at thousands of DC peers every byte per peer counts (docs/SCALE.md).
    logger().debug("rank {}: {} DC target {}", index, remote.device, remote.dctn);
    peer.address_vector = domain_->dc_address_vector(port_, remote.gid, remote.lid, remote.dctn, remote.key);
    for (std::uint32_t initiator : remote.initiators) {
        const std::uint64_t key = sender_key(remote.lid, initiator);
        auto position = std::lower_bound(senders_.begin(), senders_.end(), std::make_pair(key, 0u),
                                         [](const auto& left, const auto& right) { return left.first < right.first; });
        if (position != senders_.end() && position->first == key && position->second != index) {
            throw Error("DC: rank " + std::to_string(position->second) + " and rank " + std::to_string(index) +
                        " both publish DC initiator " + std::to_string(initiator) + " on LID " +
                        std::to_string(remote.lid) + ": their receives could not be told apart");
        }
        if (position == senders_.end() || position->first != key) senders_.insert(position, {key, index});
    }
    peer.connected = true;
}

void Engine::forget_dc_sender(std::uint32_t index) {
    Peer& peer = peers_[index];
    // Messages the old process sent that no receive took: they belong to a session that has gone.
    while (!peer.arrivals.empty()) repost_receive_buffer(peer.arrivals.pop(arrival_links_));
    // Its old initiators name the old process: a late message from them is dropped, not matched.
    std::erase_if(senders_, [index](const auto& entry) { return entry.second == index; });
    peer.connected = false;
    peer.initiator = -1;
}

void Engine::replace_dc_peer(std::uint32_t index, const DcPeerAddress& remote) {
    if (peers_[index].outstanding != 0) fail_and_flush_dc(index, "its process was replaced");
    connect_dc_member(index, remote, kReplacementNotConnected);
}

void Engine::connect_dc_member(std::uint32_t index, const DcPeerAddress& remote, const char* why) {
    Peer& peer = peers_[index];
    if (peer.outstanding != 0) fail_and_flush_dc(index, why);
    forget_dc_sender(index);
    connect_dc(index, remote);
    peer.connected = false;
    peer.unavailable = why;
    peer.healthy = true;
}

std::int32_t Engine::choose_initiator(Peer& peer, std::uint32_t count) {
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    for (;;) {
        // Ordering: a peer stays on its initiator while it has work there.
        std::int32_t chosen = -1;
        if (peer.initiator >= 0 && peer.send_in_flight > 0 && !initiators_[peer.initiator].failed) {
            chosen = peer.initiator;
        } else {
            for (std::uint32_t index = 0; index < initiators_.size(); ++index) {
                if (initiators_[index].failed) continue;
                if (chosen < 0 || initiators_[index].send_in_flight < initiators_[chosen].send_in_flight) {
                    chosen = static_cast<std::int32_t>(index);
                }
            }
        }
        if (chosen >= 0 && initiators_[chosen].send_in_flight + count <= settings_.max_send_wr) {
            peer.initiator = chosen;
            return chosen;
        }
        if (poll_once()) continue;
        if (std::chrono::steady_clock::now() >= until) return -1;
        backoff(round, until);
    }
}

void Engine::recover_failed_initiators() {
    for (Initiator& initiator : initiators_) {
        if (!initiator.failed || initiator.send_in_flight != 0) continue;
        // Everything it held has completed (flushed): RESET, back to RTS, producer index 0.
        try {
            domain_->recover_dc_initiator(*initiator.queue_pair);
            connect_initiator(*initiator.queue_pair);
            initiator.failed = false;
            logger().info("DC initiator {} recovered", initiator.queue_pair->qpn());
        } catch (const std::exception& error) {
            logger().error("DC initiator {} could not be recovered: {}", initiator.queue_pair->qpn(), error.what());
        }
    }
}

void Engine::repost_receive_buffer(std::uint32_t index) {
    const mlx5::ScatterGatherElement element{
        reinterpret_cast<std::uint64_t>(receive_memory_) + static_cast<std::uint64_t>(index) * dc_.receive_size,
        dc_.receive_size, receive_registration_.lkey};
    const mlx5::ReceiveWorkRequest request{kReceiveBuffer | index, &element, 1};
    std::uint32_t posted = 0;
    if (shared_receive_queue_->post_receive(&request, 1, &posted) != mlx5::PostResult::ok) {
        logger().error("DC: receive buffer {} could not be posted back to the shared receive queue", index);
    }
}

void Engine::match_dc_arrival(const mlx5::Completion& completion) {
    if ((completion.wr_id & kReceiveBuffer) == 0) return;
    const auto index = static_cast<std::uint32_t>(completion.wr_id & ~kReceiveBuffer);
    if (index >= arrived_.size()) return;
    if (completion.status != mlx5::CompletionStatus::success) {
        // Flushed at teardown, or a message larger than a receive buffer: the sender's own
        // completion reports it to the sender.
        if (completion.status != mlx5::CompletionStatus::work_request_flushed) {
            logger().warn("DC: a receive failed ({}); the sender's completion says why",
                          mlx5::to_string(completion.status));
            repost_receive_buffer(index);
        }
        return;
    }
    const std::uint64_t key = sender_key(completion.slid, completion.src_qp);
    auto found = std::lower_bound(senders_.begin(), senders_.end(), std::make_pair(key, 0u),
                                  [](const auto& left, const auto& right) { return left.first < right.first; });
    if (found == senders_.end() || found->first != key) {
        logger().warn("DC: a message from initiator {} (LID {}) that no rank published; dropped", completion.src_qp,
                      completion.slid);
        repost_receive_buffer(index);
        return;
    }
    Peer& peer = peers_[found->second];
    // A receive buffer is in no list until it is reposted, so arrivals never exceed the buffers.
    arrived_[index] = completion;
    peer.arrivals.push(arrival_links_, index);
    match_receives(found->second);
}

void Engine::match_receives(std::uint32_t index) {
    Peer& peer = peers_[index];
    while (!peer.arrivals.empty() && !peer.waiting.empty()) {
        const std::uint32_t buffer = peer.arrivals.pop(arrival_links_);
        Slot& slot = slots_[peer.waiting.pop(waiting_links_)];
        mlx5::Completion completion = arrived_[buffer];
        // A write with immediate consumed a receive but placed its bytes at the write's target:
        // byte_len is the write's length, and nothing is copied.
        const bool data_in_buffer = completion.opcode != mlx5::CompletionOpcode::receive_rdma_with_immediate;
        if (data_in_buffer && completion.byte_len > slot.receive_length) {
            completion.status = mlx5::CompletionStatus::local_length_error;
        } else if (data_in_buffer && completion.byte_len != 0) {
            std::memcpy(reinterpret_cast<void*>(slot.receive_addr),
                        receive_memory_ + static_cast<std::size_t>(buffer) * dc_.receive_size, completion.byte_len);
        }
        repost_receive_buffer(buffer);
        finish(slot, completion);
    }
}

std::uint64_t Engine::post_dc_receive(std::uint32_t index, const LocalSlice& local) {
    Peer& peer = peers_[index];
    const std::uint64_t ticket = claim_slot(index, Operation::receive);
    if (ticket == kNoTicket) return ticket;
    if (peer.unavailable != nullptr) [[unlikely]] {
        return fail_immediately(ticket, mlx5::CompletionStatus::general_error, peer.unavailable);
    }
    if (local.zero_based()) [[unlikely]] {
        // A DC receive lands in the engine's buffers and is copied out by the CPU, which cannot
        // follow a layout's key: the NIC alone scatters through it.
        return fail_immediately(ticket, mlx5::CompletionStatus::local_protection_error,
                                "a memory layout cannot be a DC receive's target (DC receives are copied from the "
                                "engine's buffers by the CPU; receive into a plain region)");
    }
    const auto slot_index = static_cast<std::uint32_t>(ticket);
    Slot& slot = slots_[slot_index];
    slot.receive_addr = local.addr();
    slot.receive_length = local.length();
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    while (peer.waiting.size() >= settings_.max_recv_wr) {
        if (poll_once()) continue;
        if (std::chrono::steady_clock::now() >= until) {
            return fail_immediately(ticket, mlx5::CompletionStatus::general_error,
                                    "the queue stayed full until the deadline");
        }
        backoff(round, until);
    }
    peer.waiting.push(waiting_links_, slot_index);
    match_receives(index);
    return ticket;
}

void Engine::fail_and_flush_dc(std::uint32_t index, const char* why) {
    Peer& peer = peers_[index];
    logger().warn("{}: failing its work on DC: {}", peer.name, why);
    peer.healthy = false;
    // Its receives wait in the engine, not in the NIC: they end here.
    mlx5::Completion flushed;
    flushed.status = mlx5::CompletionStatus::work_request_flushed;
    flushed.is_receive = true;
    while (!peer.waiting.empty()) finish(slots_[peer.waiting.pop(waiting_links_)], flushed);
    // Its sends are on a shared initiator: that initiator goes to ERR (the other peers' work on
    // it fails too, as on hardware) and is recovered once flushed.
    if (peer.send_in_flight != 0 && peer.initiator >= 0) {
        Initiator& initiator = initiators_[peer.initiator];
        initiator.failed = true;
        try {
            initiator.queue_pair->move_to_error();
        } catch (const std::exception& error) {
            logger().error("{}: moving DC initiator to ERR failed: {}", peer.name, error.what());
        }
    }
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    std::uint32_t round = 0;
    while (peer.outstanding != 0 && std::chrono::steady_clock::now() < until) {
        if (!poll_once()) backoff(round, until);
    }
    if (peer.outstanding != 0) {
        logger().error("{}: {} operations not flushed within the deadline", peer.name, peer.outstanding);
    }
}

}  // namespace rdmachan::detail
