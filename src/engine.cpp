#include "src/engine.hpp"
#include "src/registered.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "rdmachan/handshake.hpp"
#include "src/dc_peer_directory.hpp"
#include "src/dc_routing.hpp"
#include "src/flight_events.hpp"
#include "src/post_refusal.hpp"
#include "src/rc_routing.hpp"
#include "common/logger.hpp"

namespace rdmachan {

// Builds MemoryRegion values (their constructor is private to keep them honest).
class EngineAccess {
public:
    static MemoryRegion make(transport::Registration registration, void* data, std::size_t length) {
        auto registered = std::make_shared<detail::Registered>();
        registered->owner = std::move(registration.owner);
        registered->deregister = std::move(registration.deregister);
        return MemoryRegion(std::move(registered), data, length, registration.lkey, registration.rkey);
    }
};

namespace detail {
namespace {

// A deadline that starts when the first wait does: a post that never has to wait reads no
// clock (three clock reads were a fifth of a post's instructions).
class LazyDeadline {
public:
    explicit LazyDeadline(std::chrono::milliseconds span) : span_(span) {}
    bool passed() {
        const auto now = std::chrono::steady_clock::now();
        if (!started_) {
            until_ = now + span_;
            started_ = true;
        }
        return now >= until_;
    }

private:
    std::chrono::milliseconds span_;
    std::chrono::steady_clock::time_point until_{};
    bool started_ = false;
};

}  // namespace

Engine::Engine(const ChannelSettings& settings, std::uint32_t peer_count, const DcSettings& dc)
    : settings_(settings),
      device_(transport::open_device(settings.device)),
      port_(device_->port_identity(settings.port, settings.gid_index)),
      domain_(device_->allocate_protection_domain()),
      layouts_(domain_, port_, rc_queue_pair_settings(), settings.deadline) {
    peers_.resize(peer_count, nullptr);
    // An RC peer has its queue pair from the start, and so its state and its share of the slots.
    if (!dc.enabled) {
        for (std::uint32_t index = 0; index < peer_count; ++index) make_peer_state(index).slot_share = true;
    }
    // The routing creates the completion queues (sized for what its queue pairs can hold) and
    // its queue pairs.
    if (dc.enabled) {
        auto routing = std::make_unique<DcRouting>(*this, dc);
        dc_ = routing.get();
        routing_ = std::move(routing);
    } else {
        auto routing = std::make_unique<RcRouting>(*this);
        rc_ = routing.get();
        routing_ = std::move(routing);
    }

    scratch_requests_.resize(settings.max_send_wr);
    scratch_elements_.resize(settings.max_send_wr);
    // Each scratch request has its own element for good (post_batch writes the element, not
    // these): two stores less per request posted.
    for (std::uint32_t i = 0; i < settings.max_send_wr; ++i) {
        scratch_requests_[i].sg_list = &scratch_elements_[i];
        scratch_requests_[i].num_sge = 1;
    }
    // One slot per request the budgets admit: a slot is free whenever a post can proceed.
    slots_.allocate(routing_->slot_capacity());
}

void Engine::create_completion_queues(std::uint32_t send_entries, std::uint32_t receive_entries) {
    send_completions_ = domain_->create_completion_queue(std::max(settings_.cq_entries, send_entries), cqe_compression());
    receive_completions_ =
        domain_->create_completion_queue(std::max(settings_.cq_entries, receive_entries), cqe_compression());
}

void Engine::release_owner(Engine* engine) noexcept {
    if (engine->handles_ == 0) {
        delete engine;
    } else {
        engine->orphaned_ = true;  // the last PendingWork deletes it (drop_handle)
    }
}

transport::QueuePairSettings Engine::rc_queue_pair_settings() const {
    transport::QueuePairSettings queue_pair_settings;
    queue_pair_settings.max_send_wr = settings_.max_send_wr;
    queue_pair_settings.max_recv_wr = settings_.max_recv_wr;
    queue_pair_settings.max_send_sge = settings_.max_send_sge;
    queue_pair_settings.max_recv_sge = settings_.max_recv_sge;
    queue_pair_settings.max_inline_data = settings_.max_inline_data;
    queue_pair_settings.port = settings_.port;
    queue_pair_settings.access = static_cast<std::uint32_t>(settings_.access);
    queue_pair_settings.scatter_to_cqe = settings_.scatter_to_cqe;
    return queue_pair_settings;
}

transport::CqeCompression Engine::cqe_compression() const {
    switch (settings_.cqe_compression) {
        case CqeCompression::off: return transport::CqeCompression::off;
        case CqeCompression::hash: return transport::CqeCompression::hash;
        case CqeCompression::checksum: return transport::CqeCompression::checksum;
        case CqeCompression::checksum_stride_index: return transport::CqeCompression::checksum_stride_index;
    }
    throw Error("cqe_compression: " + std::to_string(static_cast<int>(settings_.cqe_compression)) +
                " is not off, hash, checksum or checksum_stride_index");
}

Engine::~Engine() {
    // Nothing may be left in the NIC's hands when the buffers go away.
    for (std::uint32_t peer = 0; peer < peers_.size(); ++peer) {
        if (peers_[peer] != nullptr && peers_[peer]->outstanding != 0) {
            fail_and_flush(peer, "channel destroyed with work outstanding");
        }
    }
    if (event_set_ >= 0) ::close(event_set_);
}

int Engine::event_descriptor() {
    if (event_set_made_) return event_set_;
    if (send_completions_ == nullptr || receive_completions_ == nullptr) return -1;
    event_set_made_ = true;
    const int send = send_completions_->event_descriptor();
    const int receive = receive_completions_->event_descriptor();
    if (send < 0 || receive < 0) return -1;
    const int set = ::epoll_create1(EPOLL_CLOEXEC);
    if (set < 0) {
        logger().warn("{}: no completion events: epoll_create1: {}", device_->name(), std::strerror(errno));
        return -1;
    }
    for (const int member : {send, receive}) {
        epoll_event event{};
        event.events = EPOLLIN;
        event.data.fd = member;
        if (::epoll_ctl(set, EPOLL_CTL_ADD, member, &event) != 0 && errno != EEXIST) {
            logger().warn("{}: no completion events: epoll_ctl: {}", device_->name(), std::strerror(errno));
            ::close(set);
            return -1;
        }
    }
    event_members_[0] = {send, POLLIN, 0};
    event_members_[1] = {receive, POLLIN, 0};
    event_member_count_ = send == receive ? 1 : 2;
    event_set_ = set;
    return event_set_;
}

bool Engine::arm() {
    if (event_descriptor() < 0) return false;
    return arm_queues(true);
}

// Takes the raised events, then arms every CQ; false when a completion is waiting. An
// application that calls arm() may have been woken by either CQ, so it takes every event; the
// engine's own sleep takes only the events its poll saw raised (a read each): one arm raises at
// most one event, so a CQ whose descriptor was not readable has none to take, and arming it again
// is harmless.
bool Engine::arm_queues(bool take_every_event) {
    transport::CompletionQueue* const queues[2] = {send_completions_.get(), receive_completions_.get()};
    for (nfds_t i = 0; i < event_member_count_; ++i) {
        if (take_every_event || (event_members_[i].revents & POLLIN) != 0) queues[i]->take_event();
        event_members_[i].revents = 0;
    }
    for (nfds_t i = 0; i < event_member_count_; ++i) {
        if (!queues[i]->arm()) return false;
    }
    return true;
}

// Arms, then sleeps until an event or `until`; returns at once when a completion is waiting. An
// event raised after the sleep ended makes the next one return at once.
void Engine::block_for_event(std::chrono::steady_clock::time_point until) {
    if (!arm_queues(false)) return;
    const auto now = std::chrono::steady_clock::now();
    if (until == std::chrono::steady_clock::time_point{}) until = now + std::chrono::milliseconds(10);
    if (until <= now) return;
    const auto left = std::chrono::ceil<std::chrono::milliseconds>(until - now).count();
    // An interrupted or timed-out wait returns as a woken one does: the caller polls, then
    // reads its deadline.
    (void)::poll(event_members_, event_member_count_, static_cast<int>(std::min<long long>(left, 1 << 30)));
}

PeerCounters Engine::counters(std::uint32_t peer) const {
    if (peers_[peer] == nullptr) return PeerCounters{};
    PeerCounters counters = peers_[peer]->counters;
    counters.outstanding = peers_[peer]->outstanding;
    return counters;
}

std::string Engine::default_peer_name(std::uint32_t index) const {
    return peers_.size() == 1 ? "unconnected peer" : "rank " + std::to_string(index);
}

Engine::Peer& Engine::make_peer_state(std::uint32_t index) {
    Peer& peer = peer_states_.emplace_back();
    peers_[index] = &peer;
    return peer;
}

Engine::Peer& Engine::first_post(std::uint32_t index) {
    Peer& peer = peer_state(index);
    routing_->first_post(index);
    peer.slot_share = true;
    return peer;
}

MemoryRegion Engine::register_memory(void* data, std::size_t length, Access access) {
    transport::Registration registration = domain_->register_memory(data, length, static_cast<std::uint32_t>(access));
    return EngineAccess::make(std::move(registration), data, length);
}

MemoryRegion Engine::allocate_memory(std::size_t length, Access access) {
    transport::Registration registration = domain_->allocate_memory(length, static_cast<std::uint32_t>(access));
    std::uint8_t* const memory = registration.data;
    return EngineAccess::make(std::move(registration), memory, length);
}

RcRouting& Engine::rc_routing(const char* call, std::uint32_t peer) const {
    if (rc_ == nullptr) {
        throw Error(std::string(call) + " " + peer_name(peer) + ": a DC multi-channel has no queue pair per peer");
    }
    return *rc_;
}

DcRouting& Engine::dc_routing(const char* call) const {
    if (dc_ == nullptr) throw Error(std::string(call) + ": this multi-channel is not in DC mode");
    return *dc_;
}

void Engine::set_connected(std::uint32_t index, bool connected) {
    Peer& peer = peer_state(index);
    peer.connected = connected;
    peer.direct = connected ? routing_->own_queue_pair(index) : nullptr;
    peer.direct_qpn = peer.direct != nullptr ? peer.direct->qpn() : 0;
}

void Engine::connect(std::uint32_t index, const ChannelEndpoint& remote) {
    rc_routing("connect", index).connect(index, remote);
}

void Engine::replace_rc_peer(std::uint32_t index, const ChannelEndpoint& remote) {
    rc_routing("replace", index).replace(index, remote);
}

const ChannelEndpoint& Engine::prepare_rc_peer(std::uint32_t index, const char* why) {
    return rc_routing("prepare", index).prepare(index, why);
}

void Engine::connect_prepared_rc(std::uint32_t index, const ChannelEndpoint& remote) {
    rc_routing("connect", index).connect_prepared(index, remote);
}

std::uint32_t Engine::dc_target_number() const { return dc_routing("dc_target_number").target_number(); }
std::uint64_t Engine::dc_key() const { return dc_routing("dc_key").key(); }
std::vector<std::uint32_t> Engine::dc_initiator_numbers() const {
    return dc_routing("dc_initiator_numbers").initiator_numbers();
}

void Engine::use_dc_directory(std::shared_ptr<const DcPeerDirectory> directory) {
    dc_routing("use_dc_directory").use_directory(std::move(directory));
}

void Engine::replace_dc_peer(std::uint32_t index, const DcPeerAddress& remote) {
    dc_routing("replace_dc_peer").replace(index, remote);
}

void Engine::connect_dc_member(std::uint32_t index, const DcPeerAddress& remote, const char* why) {
    dc_routing("connect_dc_member").connect_member(index, remote, why);
}

void Engine::disconnect_peer(std::uint32_t index, const char* why) {
    Peer& peer = peer_state(index);
    if (peer.outstanding != 0) fail_and_flush(index, why);
    routing_->forget(index);
    set_connected(index, false);
    peer.unavailable = why;
    peer.healthy = true;
}

void Engine::mark_absent(std::uint32_t index, const char* why) {
    set_connected(index, false);
    peer_state(index).unavailable = why;
}

void Engine::mark_replacement_connected(std::uint32_t index) {
    peer_state(index).unavailable = nullptr;
    set_connected(index, true);
}

std::optional<std::uint32_t> Engine::peer_of(std::uint64_t ticket) {
    if (Slot* entry = slots_.find(ticket)) return entry->peer;
    return std::nullopt;
}

std::uint64_t Engine::fail_immediately(std::uint64_t ticket, mlx5::CompletionStatus status, const char* why) {
    Slot& entry = slots_.of(ticket);
    mlx5::Completion completion;
    completion.status = status;
    entry.error_seen = false;
    entry.not_posted = why;
    flight::record(flight::ChannelEvent::post_refused, entry.peer, ticket, static_cast<std::uint64_t>(status), flight::text(why));
    finish(entry, completion);
    return ticket;
}

bool Engine::wait_for_send_budget(Peer& peer, std::uint32_t count) {
    std::uint32_t round = 0;
    LazyDeadline deadline(settings_.deadline);
    while (peer.send_in_flight + count > settings_.max_send_wr) {
        if (poll_once()) continue;
        if (deadline.passed()) return false;
        backoff(round);
    }
    return true;
}

std::uint64_t Engine::post_send(std::uint32_t index, mlx5::SendWorkRequest* requests, std::uint32_t count,
                                Operation operation) {
    Peer& peer = peer_for_post(index);
    const std::uint64_t ticket = claim_slot(index, operation);
    if (ticket == kNoTicket) return ticket;
    Slot& slot = slots_.of(ticket);
    if (!peer.connected) [[unlikely]] {
        return fail_immediately(ticket, mlx5::CompletionStatus::general_error,
                                peer.unavailable != nullptr ? peer.unavailable : "the peer is not connected");
    }
    const SendRoute route = routing_->route_send(index, ticket, requests, count);
    if (route.queue_pair == nullptr) [[unlikely]] return fail_immediately(ticket, route.status, route.why);
    for (std::uint32_t i = 0; i < count; ++i) {
        requests[i].wr_id = ticket;
        requests[i].flags &= ~static_cast<std::uint32_t>(mlx5::kSendSignaled);
        for (std::uint32_t element = 0; element < requests[i].num_sge; ++element) {
            slot.bytes += requests[i].sg_list[element].length;
        }
    }
    requests[count - 1].wr_id = ticket | kFinalRequest;
    requests[count - 1].flags |= mlx5::kSendSignaled;
    slot.send_requests = count;
    peer.send_in_flight += count;

    flight::record(flight::ChannelEvent::post_send, index, route.queue_pair->qpn(), ticket, count,
                   static_cast<std::uint64_t>(requests[0].opcode));
    std::uint32_t posted = 0;
    const mlx5::PostResult result = route.queue_pair->post_send(requests, count, &posted);
    if (result == mlx5::PostResult::ok) [[likely]] return ticket;
    return finish_post(index, ticket, *route.queue_pair, requests, count, posted, result);
}

// The rest of a post the queue did not take at once: retried while the queue is full, until the
// deadline; a refusal fails the operation (and a batch taken in part is flushed).
std::uint64_t Engine::finish_post(std::uint32_t index, std::uint64_t ticket, transport::QueuePair& queue_pair,
                                  mlx5::SendWorkRequest* requests, std::uint32_t count, std::uint32_t done,
                                  mlx5::PostResult result) {
    Slot& slot = slots_.of(ticket);
    std::uint32_t round = 0;
    LazyDeadline deadline(settings_.deadline);
    while (true) {
        const bool retry = result == mlx5::PostResult::queue_full && !deadline.passed();
        if (!retry) {
            const auto status = refusal_status(result);
            if (done != 0) {
                // Part of the batch is in the NIC without its final request: take it back.
                slot.not_posted = refusal_reason(result);
                finish(slot, [&] { mlx5::Completion failed; failed.status = status; return failed; }());
                fail_and_flush(index, "a batch could only be posted in part");
                return ticket;
            }
            return fail_immediately(ticket, status, refusal_reason(result));
        }
        if (!poll_once()) backoff(round);  // the ring frees as completions arrive
        std::uint32_t posted = 0;
        result = queue_pair.post_send(requests + done, count - done, &posted);
        done += posted;
        if (result == mlx5::PostResult::ok) return ticket;
    }
}

std::uint64_t Engine::post_batch(std::uint32_t index, const WorkBatch::Entry* entries, std::uint32_t count,
                                 Operation operation, std::uint64_t version) {
    Peer* const peer = peers_[index];
    // The common case, a batch to a peer with its own queue pair (RC) that can go at once (a free
    // slot, send budget), takes its ticket first, so that each request gets its wr_id as it is
    // converted: one pass over the batch. Anything else is converted with no ticket and takes
    // post_send, which waits, routes (DC) and fails the operation naming why.
    const bool at_once = peer != nullptr && slots_.has_free() && peer->direct != nullptr &&
                         peer->send_in_flight + count <= settings_.max_send_wr;
    const std::uint64_t ticket = at_once ? claim_free_slot(index, operation) : 0;
    mlx5::SendWorkRequest* const requests = scratch_requests_.data();
    if (at_once && version != 0 && version == scratch_version_ && count == scratch_count_) {
        // The same batch as last time, converted then: only the ticket is new.
        for (std::uint32_t i = 0; i + 1 < count; ++i) requests[i].wr_id = ticket;
        return post_scratch_requests(index, ticket, count, scratch_bytes_);
    }
    mlx5::ScatterGatherElement* const elements = scratch_elements_.data();
    const std::uint32_t max_inline = settings_.max_inline_data;
    std::uint64_t bytes = 0;
    for (std::uint32_t i = 0; i < count; ++i) {
        const WorkBatch::Entry& entry = entries[i];
        mlx5::ScatterGatherElement& element = elements[i];
        element = {entry.local_addr, entry.local_length, entry.lkey};
        // Every field these opcodes use is written, but sg_list and num_sge, which the constructor
        // set for good; the others (atomics, DC stream, layout) keep the zeros the scratch space
        // was made with (post_send sets the DC address vector itself).
        mlx5::SendWorkRequest& request = requests[i];
        request.wr_id = ticket;
        request.remote_addr = entry.remote_addr;
        request.rkey = entry.rkey;
        request.immediate = entry.immediate.value_or(0);
        switch (entry.kind) {
            case WorkBatch::Kind::send:
                request.opcode = entry.immediate ? mlx5::SendOpcode::send_with_immediate : mlx5::SendOpcode::send;
                break;
            case WorkBatch::Kind::write:
                request.opcode =
                    entry.immediate ? mlx5::SendOpcode::rdma_write_with_immediate : mlx5::SendOpcode::rdma_write;
                break;
            case WorkBatch::Kind::read:
                request.opcode = mlx5::SendOpcode::rdma_read;
                break;
        }
        // Small payloads travel inside the WQE: no DMA read of the buffer, which is free at once.
        // A layout's bytes are not contiguous here: they never go inline.
        request.flags = entry.kind != WorkBatch::Kind::read && entry.local_length <= max_inline && !entry.zero_based
                            ? mlx5::kSendInline
                            : 0;
        bytes += entry.local_length;
    }
    if (!at_once) [[unlikely]] {
        scratch_version_ = 0;  // post_send sets flags and DC address vectors of its own
        return post_send(index, requests, count, operation);
    }
    requests[count - 1].flags |= mlx5::kSendSignaled;
    scratch_version_ = version;
    scratch_count_ = count;
    scratch_bytes_ = bytes;
    return post_scratch_requests(index, ticket, count, bytes);
}

// The RC batch in the scratch space, each request but the last carrying `ticket` and the last
// signaled: its final wr_id, the budgets, the record, the post.
std::uint64_t Engine::post_scratch_requests(std::uint32_t index, std::uint64_t ticket, std::uint32_t count, std::uint64_t bytes) {
    mlx5::SendWorkRequest* const requests = scratch_requests_.data();
    requests[count - 1].wr_id = ticket | kFinalRequest;
    Slot& slot = slots_.of(ticket);
    slot.bytes = bytes;
    slot.send_requests = count;
    Peer& peer = *peers_[index];
    peer.send_in_flight += count;
    transport::QueuePair& queue_pair = *peer.direct;
    flight::record(flight::ChannelEvent::post_send, index, peer.direct_qpn, ticket, count,
                   static_cast<std::uint64_t>(requests[0].opcode));
    std::uint32_t posted = 0;
    const mlx5::PostResult result = queue_pair.post_send(requests, count, &posted);
    if (result == mlx5::PostResult::ok) [[likely]] return ticket;
    return finish_post(index, ticket, queue_pair, requests, count, posted, result);
}

// Out of line: error and flush completions, and arrivals in engine-owned receive buffers
// (deliver recorded the event).
void Engine::deliver_error_or_arrival(const mlx5::Completion& completion) {
    if (completion.status != mlx5::CompletionStatus::success &&
        completion.status != mlx5::CompletionStatus::work_request_flushed) [[unlikely]] {
        report_error_completion(completion);
    }
    if ((completion.wr_id & kEngineReceiveBuffer) != 0) {
        routing_->take_arrival(completion);
        return;
    }
    Slot* entry = slots_.find(completion.wr_id);
    if (completion.status != mlx5::CompletionStatus::success && entry != nullptr) {
        // On a shared send queue, a flush says only that the queue failed, maybe for another peer.
        if (entry->shared_queue == nullptr || completion.status != mlx5::CompletionStatus::work_request_flushed) {
            peers_[entry->peer]->healthy = false;
        }
        if (entry->shared_queue != nullptr) mark_failed(*entry->shared_queue);
    }
    if (entry == nullptr || entry->state != SlotState::pending) return;  // a taken or failed operation's stragglers
    if ((completion.wr_id & kFinalRequest) != 0) {
        finish(*entry, completion);
    } else if (completion.status != mlx5::CompletionStatus::success && !entry->error_seen) {
        // An earlier request of a batch failed: that is the batch's outcome. The final request
        // still completes (flushed), and only then are the batch's buffers free.
        entry->completion = completion;
        entry->error_seen = true;
    }
}

// Out of line: an error completion writes the flight record (no allocation, lock or throw).
void Engine::report_error_completion(const mlx5::Completion& completion) const {
    char reason[160];
    std::snprintf(reason, sizeof reason, "error completion on QP 0x%x: %s (syndrome 0x%02x)", completion.qp_num,
                  to_string(completion.status), completion.syndrome);
    flight::dump_automatically(reason);
}

bool Engine::poll_once() {
    const bool sends = poll_queue(*send_completions_);
    const bool receives = poll_queue(*receive_completions_);
    if (shared_queue_failed_) [[unlikely]] shared_queue_failed_ = routing_->recover_shared_queues();
    return sends || receives;
}

// Spin briefly, then yield, then sleep: 16 processes on 2 cores must all make progress. With
// completion events (adaptive and event modes), sleep on them instead of between polls.
void Engine::backoff(std::uint32_t& round, std::chrono::steady_clock::time_point until) {
    ++round;
    if (settings_.wait != WaitMode::spin && event_descriptor() >= 0) {
        // Adaptive spins as spin mode does, with the device's caller progress, then sleeps on the
        // completion event where spin mode would yield and sleep between polls; event sleeps at
        // once. A longer spin (spin_polls) keeps busy traffic off the event's system calls.
        const std::uint32_t spins = settings_.wait == WaitMode::adaptive ? settings_.spin_polls : 0;
        if (round <= spins) {
            device_->progress();
            return;
        }
        if (round == spins + 1) device_->stop_progress();
        block_for_event(until);
        return;
    }
    // A software device reads its sockets here rather than waking its own thread for each frame,
    // while this thread spins; once it starts giving the core away (yields, then sleeps), the
    // device's own thread takes them back: a thread that yields on a busy machine may not run
    // again for a scheduler slice, and would hold every frame until then.
    if (round <= settings_.spin_polls) {
        device_->progress();
        return;
    }
    if (round == settings_.spin_polls + 1) device_->stop_progress();
    if (round - settings_.spin_polls <= settings_.yield_polls) {
        std::this_thread::yield();
        return;
    }
    std::this_thread::sleep_for(settings_.sleep);
}

WorkResult Engine::failure_of(const Slot& slot) const {
    const mlx5::Completion& completion = slot.completion;
    WorkError error;
    error.operation = slot.operation;
    error.status = static_cast<std::uint8_t>(completion.status);
    error.syndrome = completion.syndrome;
    error.vendor_syndrome = completion.vendor_error;
    error.peer = peer_name(slot.peer);
    error.not_posted = slot.not_posted;
    return WorkResult::failure(std::move(error));
}

std::optional<WorkResult> Engine::try_take(std::uint64_t ticket) {
    if (ticket == kNoTicket) [[unlikely]] return not_posted_for_want_of_a_slot();
    Slot* slot = ready(ticket);
    if (slot == nullptr) return std::nullopt;
    return take_ready(*slot, ticket);
}

// Out of line: a failed operation's result names the peer (a string copy).
std::optional<WorkResult> Engine::take_failure(Slot& slot, std::uint64_t ticket) {
    std::optional<WorkResult> result(failure_of(slot));
    slots_.release(static_cast<std::uint32_t>(ticket));
    return result;
}

WorkResult Engine::not_posted_for_want_of_a_slot() {
    WorkError error;
    error.status = static_cast<std::uint8_t>(mlx5::CompletionStatus::general_error);
    error.peer = "(no peer: the operation got no slot)";
    error.not_posted = kNoSlotReason;
    return WorkResult::failure(error);
}

WorkResult Engine::wait(std::uint64_t ticket, std::chrono::milliseconds deadline) {
    if (ticket == kNoTicket) [[unlikely]] return not_posted_for_want_of_a_slot();
    Slot* entry = slots_.find(ticket);
    if (entry == nullptr) {
        WorkError error;
        error.status = static_cast<std::uint8_t>(mlx5::CompletionStatus::general_error);
        error.peer = "(no operation: it could not be posted, or its completion was already taken)";
        return WorkResult::failure(error);
    }
    // The clock is read only once a poll found nothing: a completion that is already there (on
    // the software device's same-host path it is written before the post returns) costs no
    // clock read, 20-25 ns here. The deadline then runs from that first empty poll.
    std::chrono::steady_clock::time_point until{};
    std::uint32_t round = 0;
    while (entry->state != SlotState::done) {
        if (poll_once()) continue;
        const auto now = std::chrono::steady_clock::now();
        if (until == std::chrono::steady_clock::time_point{}) {
            until = now + deadline;
        } else if (now >= until) {
            report_deadline(*entry, ticket, deadline);
            WorkError error;
            error.operation = entry->operation;
            error.deadline_expired = true;
            error.peer = peer_name(entry->peer);
            return WorkResult::failure(error);
        }
        backoff(round, until);
    }
    WorkResult result = result_of(*entry);
    slots_.release(static_cast<std::uint32_t>(ticket));
    return result;
}

void Engine::report_deadline(const Slot& slot, std::uint64_t ticket, std::chrono::milliseconds deadline) const {
    flight::record(flight::ChannelEvent::deadline, slot.peer, ticket, static_cast<std::uint64_t>(slot.operation),
                   static_cast<std::uint64_t>(deadline.count()));
    char reason[160];
    std::snprintf(reason, sizeof reason, "deadline of %lld ms passed waiting for an operation with peer %u",
                  static_cast<long long>(deadline.count()), slot.peer);
    flight::dump_automatically(reason);
}

void Engine::fail_and_flush(std::uint32_t index, const char* why) {
    routing_->move_to_error(index, why);
    collect_flushes(index);
}

void Engine::collect_flushes(std::uint32_t index) {
    // The device flushes everything it holds; collect those completions so no slot stays pending.
    if (peers_[index] == nullptr) return;
    Peer& peer = *peers_[index];
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    std::uint32_t round = 0;
    while (peer.outstanding != 0 && std::chrono::steady_clock::now() < until) {
        if (!poll_once()) backoff(round, until);
    }
    // A last look: a thread that was not scheduled until the deadline had passed still collects
    // what arrived meanwhile.
    if (peer.outstanding != 0) poll_once();
    if (peer.outstanding != 0) {
        logger().error("{}: {} operations not flushed within the deadline", peer_name(index), peer.outstanding);
    }
}

std::uint32_t Engine::open_scope() { return next_scope_++; }

void Engine::adopt(std::uint64_t ticket, std::uint32_t scope) {
    if (Slot* entry = slots_.find(ticket)) entry->scope = scope;
}

Engine::DrainReport Engine::close_scope(std::uint32_t scope) {
    DrainReport report;
    for (std::uint32_t slot = 0; slot < slots_.size(); ++slot) {
        Slot& entry = slots_[slot];
        if (entry.state == SlotState::free || entry.scope != scope) continue;
        ++report.unpolled;
        const std::uint64_t ticket = slots_.ticket_of(slot);
        const std::uint32_t peer = entry.peer;
        WorkResult result = wait(ticket, settings_.deadline);
        if (!result.ok() && result.error().deadline_expired) {
            if (!report.failure.has_value()) report.failure = result.error();
            fail_and_flush(peer, "a scope's work did not complete before the deadline");
            if (slots_.find(ticket) != nullptr) slots_.release(slot);
        }
    }
    return report;
}

}  // namespace detail
}  // namespace rdmachan
