#include "src/rc_routing.hpp"

#include <algorithm>
#include <chrono>

#include "common/logger.hpp"
#include "rdmachan/handshake.hpp"
#include "src/post_refusal.hpp"

namespace rdmachan::detail {
namespace {

// Completion queue sizes: the product of peers and depth, bounded as the devices bound a CQ.
std::uint32_t bounded_product(std::uint32_t left, std::uint32_t right) {
    const std::uint64_t product = static_cast<std::uint64_t>(left) * right;
    return product > (1u << 22) ? (1u << 22) : static_cast<std::uint32_t>(product);
}

}  // namespace

RcRouting::RcRouting(Engine& engine) : engine_(engine) {
    const ChannelSettings& settings = engine.settings_;
    const auto peer_count = static_cast<std::uint32_t>(engine.peers_.size());
    // Every request may complete with an error or a flush, signaled or not: the queues hold
    // everything every queue pair can have in flight.
    engine.create_completion_queues(bounded_product(peer_count, settings.max_send_wr),
                                    bounded_product(peer_count, settings.max_recv_wr));
    const transport::QueuePairSettings queue_pair_settings = engine.rc_queue_pair_settings();
    queues_.resize(peer_count);
    for (RcQueue& queue : queues_) {
        queue.queue_pair = engine.domain_->create_queue_pair(queue_pair_settings, engine.send_completions_,
                                                             engine.receive_completions_);
        queue.local.qpn = queue.queue_pair->qpn();
        queue.local.gid = engine.port_.gid;
        queue.local.lid = engine.port_.lid;
        queue.local.psn = settings.psn.has_value() ? *settings.psn : random_psn();
        queue.local.mtu = std::min(settings.mtu, engine.port_.active_mtu);
        queue.local.device = engine.device_->name();
    }
}

// Every queue pair's send and receive depth.
std::uint64_t RcRouting::slot_capacity() const {
    const ChannelSettings& settings = engine_.settings_;
    return static_cast<std::uint64_t>(queues_.size()) * (settings.max_send_wr + settings.max_recv_wr);
}

void RcRouting::connect(std::uint32_t index, const ChannelEndpoint& remote) {
    Engine::Peer& peer = *engine_.peers_[index];
    if (peer.connected) throw Error("connect " + engine_.peer_name(index) + ": already connected");
    std::string name = remote.device.empty() ? "qpn " + std::to_string(remote.qpn)
                                             : remote.device + " qpn " + std::to_string(remote.qpn);
    peer.name = std::make_unique<std::string>(engine_.peers_.size() == 1 ? name
                                                                         : "rank " + std::to_string(index) + " (" + name + ")");
    const ChannelSettings& settings = engine_.settings_;
    RcQueue& queue = queues_[index];
    transport::ConnectSettings connect;
    connect.remote_gid = remote.gid;
    connect.remote_lid = remote.lid;
    connect.remote_qpn = remote.qpn;
    connect.remote_psn = remote.psn;
    connect.local_psn = queue.local.psn;
    connect.path_mtu = std::min(queue.local.mtu, remote.mtu);
    connect.ack_timeout = settings.ack_timeout;
    connect.retry_count = settings.retry_count;
    connect.rnr_retry = settings.rnr_retry;
    connect.min_rnr_timer = settings.min_rnr_timer;
    connect.max_rd_atomic = settings.max_rd_atomic;
    connect.max_dest_rd_atomic = settings.max_rd_atomic;
    connect.source_gid_index = engine_.port_.gid_index;
    try {
        queue.queue_pair->connect(connect);
    } catch (const std::exception& error) {
        throw Error("handshake with " + engine_.peer_name(index) + ": " + error.what());
    }
    queue.remote = remote;
    queue.used = true;
    engine_.set_connected(index, true);
}

void RcRouting::renew(std::uint32_t index, const char* call) {
    RcQueue& queue = queues_[index];
    try {
        queue.queue_pair = engine_.domain_->create_queue_pair(engine_.rc_queue_pair_settings(), engine_.send_completions_,
                                                              engine_.receive_completions_);
    } catch (const std::exception& error) {
        throw Error(std::string(call) + " " + engine_.peer_name(index) + ": creating its new queue pair failed: " +
                    error.what());
    }
    queue.local.qpn = queue.queue_pair->qpn();
    queue.local.psn = engine_.settings_.psn.has_value() ? *engine_.settings_.psn : random_psn();
}

void RcRouting::replace(std::uint32_t index, const ChannelEndpoint& remote) {
    Engine::Peer& peer = *engine_.peers_[index];
    // The old queue pair may still hold work (a peer that died while idle is not in ERR yet).
    if (peer.outstanding != 0) engine_.fail_and_flush(index, "its process was replaced");
    renew(index, "replace");
    engine_.set_connected(index, false);
    peer.send_in_flight = 0;
    connect(index, remote);
    engine_.set_connected(index, false);
    peer.unavailable = kReplacementNotConnected;
    peer.healthy = true;
}

const ChannelEndpoint& RcRouting::prepare(std::uint32_t index, const char* why) {
    Engine::Peer& peer = *engine_.peers_[index];
    if (peer.outstanding != 0) engine_.fail_and_flush(index, why);
    RcQueue& queue = queues_[index];
    if (queue.used) {
        renew(index, "prepare");
        queue.used = false;
    }
    engine_.set_connected(index, false);
    peer.send_in_flight = 0;
    peer.unavailable = why;
    peer.healthy = true;
    return queue.local;
}

void RcRouting::connect_prepared(std::uint32_t index, const ChannelEndpoint& remote) {
    Engine::Peer& peer = *engine_.peers_[index];
    const char* const why = peer.unavailable;
    connect(index, remote);
    engine_.set_connected(index, false);
    peer.unavailable = why;
}

SendRoute RcRouting::route_send(std::uint32_t index, std::uint64_t, mlx5::SendWorkRequest*, std::uint32_t count) {
    if (!engine_.reserve_send_budget(*engine_.peers_[index], count)) {
        return {nullptr, mlx5::CompletionStatus::general_error,
                "the send budget (max_send_wr) stayed full until the deadline"};
    }
    return {queues_[index].queue_pair.get(), mlx5::CompletionStatus::success, nullptr};
}

std::uint64_t RcRouting::post_receive(std::uint32_t index, const LocalSlice& local) {
    const std::uint64_t ticket = engine_.claim_slot(index, Operation::receive);
    if (ticket == kNoTicket) return ticket;
    if (engine_.peers_[index]->unavailable != nullptr) [[unlikely]] {
        return engine_.fail_immediately(ticket, mlx5::CompletionStatus::general_error, engine_.peers_[index]->unavailable);
    }
    const mlx5::ScatterGatherElement element{local.addr(), local.length(), local.lkey()};
    const mlx5::ReceiveWorkRequest request{ticket | kFinalRequest, &element, 1};
    RcQueue& queue = queues_[index];
    flight::record(flight::ChannelEvent::post_receive, index, queue.local.qpn, ticket, local.length());
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + engine_.settings_.deadline;
    while (true) {
        std::uint32_t posted = 0;
        const mlx5::PostResult result = queue.queue_pair->post_receive(&request, 1, &posted);
        if (result == mlx5::PostResult::ok) return ticket;
        if (result != mlx5::PostResult::queue_full || std::chrono::steady_clock::now() >= until) {
            return engine_.fail_immediately(ticket, refusal_status(result), refusal_reason(result));
        }
        if (!engine_.poll_once()) engine_.backoff(round, until);
    }
}

void RcRouting::take_arrival(const mlx5::Completion& completion) {
    // No RC queue pair has receive buffers of the engine's: a wr_id that says so is not ours.
    logger().warn("a completion on QP {} names an engine receive buffer (wr_id {:#x}), which RC has none of; dropped",
                  completion.qp_num, completion.wr_id);
}

void RcRouting::move_to_error(std::uint32_t index, const char* why) {
    Engine::Peer& peer = *engine_.peers_[index];
    RcQueue& queue = queues_[index];
    flight::record(flight::ChannelEvent::qp_error, index, queue.local.qpn, flight::text(why));
    logger().warn("{}: moving QP {} to ERR: {}", engine_.peer_name(index), queue.local.qpn, why);
    peer.healthy = false;
    try {
        queue.queue_pair->move_to_error();
    } catch (const std::exception& error) {
        logger().error("{}: modify to ERR failed: {}", engine_.peer_name(index), error.what());
    }
}

}  // namespace rdmachan::detail
