// The engine under Channel and MultiChannel: one device and protection domain, one send and one
// receive completion queue shared by every peer, and a table of outstanding operations
// (src/slot_table.hpp) whose completions are cached by work-request id so handles can be waited
// for in any order. How peers are reached is its routing, chosen once when it is built: RC, a
// queue pair per peer (src/rc_routing.hpp), or DC, shared initiators and one target
// (src/dc_routing.hpp). A Channel is an RC engine with one peer.
//
// Nothing on the post/poll path allocates, locks or throws: every table is sized when the
// engine is built. Budgets keep the queues from overflowing: a peer never has more send work
// requests in flight than its max_send_wr, and the completion queues hold every completion the
// queue pairs can produce, error and flush completions of unsignaled requests included.
#pragma once

#include <poll.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"
#include "rdmachan/peer_counters.hpp"
#include "src/dc_settings.hpp"
#include "src/flight_events.hpp"
#include "src/layout_queue_pair.hpp"
#include "src/peer_routing.hpp"
#include "src/slot_table.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::detail {

class RcRouting;
class DcRouting;
class DcPeerDirectory;

// Why a replaced peer's operations fail until its replacement has connected its side.
inline constexpr const char* kReplacementNotConnected =
    "the peer was replaced and its replacement is not connected yet (MultiChannel::reconnect, then "
    "PeerEvent::Kind::replacement_connected)";

class Engine {
public:
    // Use make_engine (below): its shared_ptr's deleter is release_owner. `dc.enabled` chooses DC
    // routing (MultiChannel only); otherwise RC, a queue pair per peer.
    Engine(const ChannelSettings& settings, std::uint32_t peer_count, const DcSettings& dc = {});
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    const ChannelSettings& settings() const { return settings_; }
    std::uint32_t peer_count() const { return static_cast<std::uint32_t>(peers_.size()); }
    // What every peer has (below) is made when the peer is first used: in RC at construction
    // (each has its queue pair), in DC when this process first posts to it, receives from it or
    // changes its state. A DC peer never contacted is these defaults: healthy, no counters,
    // connected when the directory has its record (src/dc_peer_directory.hpp).
    const transport::PortIdentity& port() const { return port_; }
    std::string device_name() const { return device_->name(); }
    bool progress() { return device_->progress(); }
    // Completion events (Channel::native_handle, arm): an epoll set of both CQs' event
    // descriptors, made on first use; -1 where the device gives none.
    int event_descriptor();
    // Takes the events raised since the last arm, then arms both CQs; false when a completion is
    // already waiting (or there are no events).
    bool arm();
    // DC: one endpoint per process (any peer index gives it); RC: the queue pair for that peer.
    const ChannelEndpoint& local_endpoint(std::uint32_t peer) const { return routing_->local_endpoint(peer); }
    const ChannelEndpoint& remote_endpoint(std::uint32_t peer) const { return routing_->remote_endpoint(peer); }
    std::string peer_name(std::uint32_t peer) const {
        return peers_[peer] != nullptr && peers_[peer]->name != nullptr ? *peers_[peer]->name : default_peer_name(peer);
    }
    void set_peer_name(std::uint32_t peer, std::string name) {
        peer_state(peer).name = std::make_unique<std::string>(std::move(name));
    }
    bool healthy(std::uint32_t peer) const { return peers_[peer] == nullptr || peers_[peer]->healthy; }
    bool connected(std::uint32_t peer) const {
        return peers_[peer] != nullptr ? peers_[peer]->connected : routing_->reachable_before_contact(peer);
    }
    // DC peers whose state was made (for the memory figures and tests).
    std::uint32_t contacted_peer_count() const { return static_cast<std::uint32_t>(peer_states_.size()); }
    PeerCounters counters(std::uint32_t peer) const;

    MemoryRegion register_memory(void* data, std::size_t length, Access access);
    MemoryRegion allocate_memory(std::size_t length, Access access);
    // A memory layout as a zero-based region: an indirect key configured by a UMR work request
    // on the engine's LayoutQueuePair (src/engine_layout.cpp).
    MemoryRegion register_layout(const MemoryLayout& layout, Access access);
    // RC: INIT -> RTR -> RTS towards the peer's queue pair. Throws rdmachan::Error naming the peer.
    void connect(std::uint32_t peer, const ChannelEndpoint& remote);

    // How a MultiChannel on this engine pairs with its peers: its mode's (src/peer_pairing.hpp).
    const PeerPairing& pairing() const { return routing_->pairing(); }

    // DC mode.
    std::uint32_t dc_target_number() const;
    std::uint64_t dc_key() const;
    std::vector<std::uint32_t> dc_initiator_numbers() const;
    using DcPeerAddress = detail::DcPeerAddress;
    // The fixed world's DC peers, each addressed from `directory` on first use.
    void use_dc_directory(std::shared_ptr<const DcPeerDirectory> directory);

    // Peer replacement: the peer's process died and a new one took its rank. Flushes what the
    // old one still holds, then RC: a new queue pair connected to `remote` (the replacement's
    // queue pair for this rank); DC: the replacement's target and initiators. Either way the
    // peer's operations fail, naming why, until mark_replacement_connected(): the replacement
    // may not have connected its side yet.
    void replace_rc_peer(std::uint32_t peer, const ChannelEndpoint& remote);
    void replace_dc_peer(std::uint32_t peer, const DcPeerAddress& remote);
    void mark_replacement_connected(std::uint32_t peer);

    // Membership (src/multi_channel_membership.cpp): a peer slot holds one member at a time,
    // and a pair's connection is made in steps, the peer's operations failing with `why` (a
    // static text) until mark_ready. prepare_rc_peer: flushes what the slot's queue pair holds
    // and gives it a fresh one (the one made at build while it was never connected), returning
    // the endpoint to offer; connect_prepared_rc: RTR and RTS towards the member's queue pair;
    // connect_dc_member: the member's DC target and initiators (a slot's earlier member's are
    // forgotten). disconnect_peer: the member left or failed: its operations are flushed and
    // fail from now on with `why`, its DC arrivals are dropped.
    const ChannelEndpoint& prepare_rc_peer(std::uint32_t peer, const char* why);
    void connect_prepared_rc(std::uint32_t peer, const ChannelEndpoint& remote);
    void connect_dc_member(std::uint32_t peer, const DcPeerAddress& remote, const char* why);
    void mark_ready(std::uint32_t peer) { mark_replacement_connected(peer); }
    void disconnect_peer(std::uint32_t peer, const char* why);
    // Slots no member holds: operations fail with `why` (a static text).
    void mark_absent(std::uint32_t peer, const char* why);
    // Queue pairs this engine created: RC one per peer; DC the initiators plus the target; plus
    // the layouts' queue pair once a layout was registered.
    std::uint32_t queue_pair_count() const { return routing_->queue_pair_count() + (layouts_.created() ? 1 : 0); }

    // Data path. A ticket names one outstanding operation — a single work request or a batch
    // posted under one doorbell — whose completion (or the reason it could not be posted) is
    // taken with wait/try_take, exactly once. Only a batch's last request asks for a
    // completion; an error in an earlier one is what the batch reports.
    std::uint64_t post_send(std::uint32_t peer, mlx5::SendWorkRequest* requests, std::uint32_t count,
                            Operation operation);
    // One request of one SGE (the single operations, src/operations.hpp), inlined into the API
    // call: a post to a peer with a queue pair of its own (RC) that needs no wait goes straight to
    // that queue pair's post_one. Anything else (no free slot, no send budget, DC, a peer not
    // connected) takes post_send, which waits or fails the operation naming why.
    [[gnu::always_inline]] std::uint64_t post_one(std::uint32_t index, mlx5::SendWorkRequest& request,
                                                  Operation operation) {
        Peer* const state = peers_[index];
        if (state == nullptr || !slots_.has_free() || state->direct == nullptr ||
            state->send_in_flight >= settings_.max_send_wr) [[unlikely]] {
            return post_send(index, &request, 1, operation);
        }
        Peer& peer = *state;
        const std::uint64_t ticket = claim_free_slot(index, operation);
        Slot& slot = slots_.of(ticket);
        request.wr_id = ticket | kFinalRequest;
        request.flags |= mlx5::kSendSignaled;
        slot.bytes = request.sg_list[0].length;
        slot.send_requests = 1;
        ++peer.send_in_flight;
        flight::record(flight::ChannelEvent::post_send, index, peer.direct_qpn, ticket, 1,
                       static_cast<std::uint64_t>(request.opcode));
        const mlx5::PostResult result = peer.direct->post_one(request);
        if (result == mlx5::PostResult::ok) [[likely]] return ticket;
        return finish_post(index, ticket, *peer.direct, &request, 1, 0, result);
    }
    // The entries become requests in the engine's own scratch space (no allocation); at most
    // max_send_wr of them (callers check). `version`: WorkBatch::version() of the entries, or 0
    // when they are not a WorkBatch's; an RC post of the version the scratch space already
    // holds only writes the new ticket into it (a batch built once and posted many times).
    std::uint64_t post_batch(std::uint32_t peer, const WorkBatch::Entry* entries, std::uint32_t count,
                             Operation operation, std::uint64_t version = 0);
    std::uint64_t post_receive(std::uint32_t peer, const LocalSlice& local) { return routing_->post_receive(peer, local); }
    WorkResult wait(std::uint64_t ticket, std::chrono::milliseconds deadline);
    std::optional<WorkResult> try_take(std::uint64_t ticket);
    // The failure of an operation that got no slot (kNoTicket).
    static WorkResult not_posted_for_want_of_a_slot();
    // The handles' poll, in two steps inlined into PendingWork::poll. ready(): the operation's
    // slot once it is done, after one poll of the queue it completes on if it was not; nullptr
    // before that, and for no operation. take_ready(): its result, built straight into the
    // caller's return value (a success constructs no error object and copies nothing), and the
    // slot freed.
    [[gnu::always_inline]] Slot* ready(std::uint64_t ticket) {
        Slot* entry = slots_.find(ticket);
        if (entry == nullptr || entry->state == SlotState::done) return entry;
        // An operation's completion can only be in the queue of its kind, so only that one is
        // polled (the other keeps its completions: both hold all their queue pairs can have in
        // flight). A DC receive completes when a message from its peer arrives in the receive
        // queue's buffers.
        transport::CompletionQueue& queue =
            entry->operation == Operation::receive ? *receive_completions_ : *send_completions_;
        const std::uint32_t count = queue.poll(poll_buffer_.data(), static_cast<std::uint32_t>(poll_buffer_.size()));
        // The operation's own successful final completion, the one waited for, is known without
        // looking its slot up again; every other goes through deliver.
        const std::uint64_t own_final = ticket | kFinalRequest;
        for (std::uint32_t i = 0; i < count; ++i) {
            const mlx5::Completion& completion = poll_buffer_[i];
            if (completion.wr_id == own_final && completion.status == mlx5::CompletionStatus::success &&
                entry->state == SlotState::pending) [[likely]] {
                record_completion(completion);
                finish(*entry, completion);
            } else {
                deliver(completion);
            }
        }
        return entry->state == SlotState::done ? entry : nullptr;
    }
    [[gnu::always_inline]] std::optional<WorkResult> take_ready(Slot& slot, std::uint64_t ticket) {
        if (slot.completion.status == mlx5::CompletionStatus::success) [[likely]] {
            const WorkCompletion work = completion_of(slot);
            slots_.release(static_cast<std::uint32_t>(ticket));
            return std::optional<WorkResult>(std::in_place, work);
        }
        return take_failure(slot, ticket);
    }
    bool outstanding(std::uint64_t ticket) { return slots_.find(ticket) != nullptr; }
    std::optional<std::uint32_t> peer_of(std::uint64_t ticket);
    // Moves what holds the peer's work to ERR and polls until each of its outstanding operations
    // has its (flush) completion, so the NIC holds none of its buffers any more.
    void fail_and_flush(std::uint32_t peer, const char* why);

    // Scopes: operations posted in a scope carry its id; when the scope ends, what it left is
    // drained. Returns how many completions had not been taken, and the first drain failure.
    std::uint32_t open_scope();
    void adopt(std::uint64_t ticket, std::uint32_t scope);
    struct DrainReport {
        std::uint32_t unpolled = 0;
        std::optional<WorkError> failure;
    };
    DrainReport close_scope(std::uint32_t scope);

    // Polls both completion queues once; true if anything arrived.
    bool poll_once();

    // Ownership. Channel, MultiChannel, their prepared forms and ScopedWork share the engine
    // through shared_ptr; a PendingWork, made and dropped once per operation, holds a plain
    // pointer counted here without an atomic instruction: a channel and its handles are used by
    // one thread at a time (channel.hpp), destroying them included. The engine is deleted when
    // both its last shared owner (release_owner is the shared_ptr's deleter) and its last
    // handle are gone, whichever goes last; a handle that outlives its channel still waits.
    void add_handle() noexcept { ++handles_; }
    void drop_handle() noexcept {
        if (--handles_ == 0 && orphaned_) [[unlikely]] delete this;
    }
    static void release_owner(Engine* engine) noexcept;

private:
    // The routings are the engine's two halves by mode: they use its slots, peers, queues and
    // waits as the engine's own functions do.
    friend class RcRouting;
    friend class DcRouting;

    // What every peer has, whatever the mode; the mode's own per-peer state is its routing's.
    struct Peer {
        // Its own queue pair while connected (RC), which the post fast path uses; null otherwise.
        transport::QueuePair* direct = nullptr;
        std::uint32_t direct_qpn = 0;
        std::uint32_t send_in_flight = 0;  // send work requests posted and not yet completed
        std::uint32_t outstanding = 0;     // operations (slots) not yet completed
        // DC: its routing state (DcRouting's), and whether the slot table has grown by its share
        // (its first post). RC: no routing state here, and the share was counted at construction.
        std::uint32_t routing_state = kNoRoutingState;
        bool slot_share = false;
        bool connected = false;
        bool healthy = true;
        const char* unavailable = nullptr;  // set while a replacement is being connected
        // A name of its own (RC: the peer's device and queue pair; a member's id); null: "rank N",
        // made when asked for. A string here cost 32 bytes per DC peer contacted.
        std::unique_ptr<std::string> name;
        PeerCounters counters;
    };
    // Kept small: a DC peer's state is made for every peer a process contacts (docs/SCALE.md).
    static_assert(sizeof(Peer) <= 80);
    static constexpr std::uint32_t kNoRoutingState = ~0u;
    std::string default_peer_name(std::uint32_t index) const;
    // The peer's state, made if it has none (control path: it may allocate).
    Peer& peer_state(std::uint32_t index) {
        if (peers_[index] != nullptr) [[likely]] return *peers_[index];
        return make_peer_state(index);
    }
    Peer& make_peer_state(std::uint32_t index);
    // The peer's state for a post. Its first post makes it (DC: addressed from the directory)
    // and grows the slot table by its share: before any slot is claimed, so that no reference
    // into the table is held while it moves.
    Peer& peer_for_post(std::uint32_t index) {
        Peer* const peer = peers_[index];
        if (peer != nullptr && peer->slot_share) [[likely]] return *peer;
        return first_post(index);
    }
    Peer& first_post(std::uint32_t index);

    void set_connected(std::uint32_t index, bool connected);
    transport::QueuePairSettings rc_queue_pair_settings() const;
    // ChannelSettings::cqe_compression as the transport spells it, for every CQ of the engine's.
    transport::CqeCompression cqe_compression() const;
    void create_completion_queues(std::uint32_t send_entries, std::uint32_t receive_entries);
    // No free slot is refused at once: every slot holds an operation whose result was not taken,
    // and only taking one (on this thread, the only one using the engine) frees it, so waiting
    // for a slot could only end at the deadline. wait(kNoTicket) says why.
    std::uint64_t claim_slot(std::uint32_t peer, Operation operation) {
        if (!slots_.has_free()) [[unlikely]] return kNoTicket;
        return claim_free_slot(peer, operation);
    }
    // The caller saw slots_.has_free().
    std::uint64_t claim_free_slot(std::uint32_t peer, Operation operation) {
        ++outstanding_;
        ++peers_[peer]->outstanding;
        return slots_.claim(peer, operation);
    }
    bool reserve_send_budget(Peer& peer, std::uint32_t count) {
        if (peer.send_in_flight + count <= settings_.max_send_wr) [[likely]] return true;
        return wait_for_send_budget(peer, count);
    }
    bool wait_for_send_budget(Peer& peer, std::uint32_t count);
    std::uint64_t post_scratch_requests(std::uint32_t index, std::uint64_t ticket, std::uint32_t count, std::uint64_t bytes);
    std::uint64_t finish_post(std::uint32_t index, std::uint64_t ticket, transport::QueuePair& queue_pair,
                              mlx5::SendWorkRequest* requests, std::uint32_t count, std::uint32_t done,
                              mlx5::PostResult result);
    bool poll_queue(transport::CompletionQueue& queue) {
        // The engine's own buffer: a local array of 16 completions was initialised on every call.
        const std::uint32_t count = queue.poll(poll_buffer_.data(), static_cast<std::uint32_t>(poll_buffer_.size()));
        for (std::uint32_t i = 0; i < count; ++i) deliver(poll_buffer_[i]);
        return count != 0;
    }
    void report_error_completion(const mlx5::Completion& completion) const;
    void report_deadline(const Slot& slot, std::uint64_t ticket, std::chrono::milliseconds deadline) const;
    void finish(Slot& slot, const mlx5::Completion& completion) {
        Peer& peer = *peers_[slot.peer];
        if (!slot.error_seen) slot.completion = completion;
        slot.state = SlotState::done;
        peer.send_in_flight -= slot.send_requests;
        if (slot.shared_queue != nullptr) slot.shared_queue->send_in_flight -= slot.send_requests;
        --peer.outstanding;
        --outstanding_;
        if (slot.completion.status == mlx5::CompletionStatus::success) {
            peer.counters.operations += slot.send_requests == 0 ? 1 : slot.send_requests;
            peer.counters.bytes += slot.completion.is_receive ? slot.completion.byte_len : slot.bytes;
        } else {
            ++peer.counters.errors;
        }
    }
    // Every completion polled: recorded, then a success (the common case) ends its operation
    // here; errors, flushes and arrivals in engine-owned receive buffers go to
    // deliver_error_or_arrival.
    static void record_completion(const mlx5::Completion& completion) {
        flight::record(flight::ChannelEvent::completion, completion.qp_num, completion.wr_id,
                       static_cast<std::uint64_t>(completion.status), completion.syndrome, completion.byte_len);
    }
    void deliver(const mlx5::Completion& completion) {
        record_completion(completion);
        if (completion.status != mlx5::CompletionStatus::success || (completion.wr_id & kEngineReceiveBuffer) != 0)
            [[unlikely]] {
            deliver_error_or_arrival(completion);
            return;
        }
        Slot* entry = slots_.find(completion.wr_id);
        // A taken or failed operation's stragglers end nothing; nor does a batch's earlier request.
        if (entry != nullptr && entry->state == SlotState::pending && (completion.wr_id & kFinalRequest) != 0) {
            finish(*entry, completion);
        }
    }
    void deliver_error_or_arrival(const mlx5::Completion& completion);
    // A shared send queue had an error: it is recovered by a later poll once it holds nothing.
    void mark_failed(SharedSendQueue& queue) {
        queue.failed = true;
        shared_queue_failed_ = true;
    }
    WorkResult result_of(const Slot& slot) const {
        if (slot.completion.status == mlx5::CompletionStatus::success) [[likely]] return success_of(slot);
        return failure_of(slot);
    }
    static WorkResult success_of(const Slot& slot) { return WorkResult(completion_of(slot)); }
    static WorkCompletion completion_of(const Slot& slot) {
        const mlx5::Completion& completion = slot.completion;
        WorkCompletion work;
        work.bytes = completion.is_receive ? completion.byte_len : static_cast<std::uint32_t>(slot.bytes);
        if ((completion.flags & mlx5::kCompletionWithImmediate) != 0) work.immediate = completion.immediate;
        return work;
    }
    std::optional<WorkResult> take_failure(Slot& slot, std::uint64_t ticket);
    // Out of line: the error names the peer (a string copy), which the success path never needs.
    [[gnu::noinline]] WorkResult failure_of(const Slot& slot) const;
    std::uint64_t fail_immediately(std::uint64_t ticket, mlx5::CompletionStatus status, const char* why);
    // Polls until the peer has no operation outstanding, or the deadline.
    void collect_flushes(std::uint32_t index);
    // A wait's pause after a poll that found nothing, as settings_.wait says; a block on the
    // completion event ends at `until` (none given: after 10 ms, for loops that read their own
    // deadline).
    void backoff(std::uint32_t& round, std::chrono::steady_clock::time_point until = {});
    void block_for_event(std::chrono::steady_clock::time_point until);
    bool arm_queues(bool take_every_event);
    RcRouting& rc_routing(const char* call, std::uint32_t peer) const;
    DcRouting& dc_routing(const char* call) const;

    ChannelSettings settings_;
    std::shared_ptr<transport::Device> device_;
    transport::PortIdentity port_;
    std::shared_ptr<transport::ProtectionDomain> domain_;
    std::shared_ptr<transport::CompletionQueue> send_completions_;
    std::shared_ptr<transport::CompletionQueue> receive_completions_;
    int event_set_ = -1;  // epoll set of the CQs' event descriptors, once made
    bool event_set_made_ = false;
    // The CQs' own descriptors (one when both CQs are one): a wait inside the engine polls them
    // directly, one wake-up fewer than through the epoll set.
    pollfd event_members_[2] = {};
    nfds_t event_member_count_ = 0;
    // By rank: its state, or null for a DC peer not contacted yet (8 bytes, the whole cost of
    // such a peer here). The states are in a deque, whose elements never move.
    std::vector<Peer*> peers_;
    std::deque<Peer> peer_states_;
    std::vector<mlx5::SendWorkRequest> scratch_requests_;
    std::vector<mlx5::ScatterGatherElement> scratch_elements_;
    // What the scratch space holds: the WorkBatch version it was converted from by an RC post
    // at once (0: nothing reusable, e.g. after post_send changed it), its count and bytes.
    std::uint64_t scratch_version_ = 0;
    std::uint32_t scratch_count_ = 0;
    std::uint64_t scratch_bytes_ = 0;
    std::array<mlx5::Completion, 16> poll_buffer_;  // what one poll of a queue returns
    SlotTable slots_;
    std::uint32_t outstanding_ = 0;
    std::uint32_t handles_ = 0;  // PendingWork handles holding this engine
    bool orphaned_ = false;      // the last shared owner is gone: the last handle deletes it
    bool shared_queue_failed_ = false;  // a shared send queue waits for recovery (mark_failed)
    std::uint32_t next_scope_ = 1;

    // Declared after the completion queues and the domain: their queue pairs go first.
    std::unique_ptr<PeerRouting> routing_;
    RcRouting* rc_ = nullptr;  // routing_, in RC mode
    DcRouting* dc_ = nullptr;  // routing_, in DC mode
    LayoutQueuePair layouts_;
};

// An engine whose shared owners and PendingWork handles keep it alive together (add_handle).
inline std::shared_ptr<Engine> make_engine(const ChannelSettings& settings, std::uint32_t peer_count,
                                           const DcSettings& dc = {}) {
    return std::shared_ptr<Engine>(new Engine(settings, peer_count, dc), &Engine::release_owner);
}

}  // namespace rdmachan::detail

namespace rdmachan {

// Takes a handle reference on the engine (no atomic: see Engine::add_handle).
inline PendingWork::PendingWork(detail::Engine* engine, std::uint64_t ticket, Operation operation) noexcept
    : engine_(engine), ticket_(ticket), operation_(operation) {
    engine->add_handle();
}

}  // namespace rdmachan
