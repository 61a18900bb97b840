// The engine under Channel and MultiChannel: one device and protection domain, one send and one
// receive completion queue shared by every peer, one RC queue pair per peer, and a table of
// outstanding operations whose completions are cached by work-request id so handles can be
// waited for in any order. A Channel is an engine with one peer.
//
// Nothing on the post/poll path allocates, locks or throws: every table is sized when the
// engine is built. Budgets keep the queues from overflowing: a peer never has more send work
// requests in flight than its max_send_wr, and the completion queues hold every completion the
// queue pairs can produce, error and flush completions of unsignaled requests included.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/peer_counters.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::detail {

class Engine {
public:
    Engine(const ChannelSettings& settings, std::uint32_t peer_count);
    ~Engine();
    Engine(const Engine&) = delete;
    Engine& operator=(const Engine&) = delete;

    const ChannelSettings& settings() const { return settings_; }
    std::uint32_t peer_count() const { return static_cast<std::uint32_t>(peers_.size()); }
    const transport::PortIdentity& port() const { return port_; }
    std::string device_name() const { return device_->name(); }
    const ChannelEndpoint& local_endpoint(std::uint32_t peer) const { return peers_[peer].local; }
    const ChannelEndpoint& remote_endpoint(std::uint32_t peer) const { return peers_[peer].remote; }
    const std::string& peer_name(std::uint32_t peer) const { return peers_[peer].name; }
    void set_peer_name(std::uint32_t peer, std::string name) { peers_[peer].name = std::move(name); }
    bool healthy(std::uint32_t peer) const { return peers_[peer].healthy; }
    bool connected(std::uint32_t peer) const { return peers_[peer].connected; }
    PeerCounters counters(std::uint32_t peer) const;

    MemoryRegion register_memory(void* data, std::size_t length, Access access);
    // INIT -> RTR -> RTS towards the peer's queue pair. Throws rdmachan::Error naming the peer.
    void connect(std::uint32_t peer, const ChannelEndpoint& remote);

    // Data path. A ticket names one outstanding operation — a single work request or a batch
    // posted under one doorbell — whose completion (or the reason it could not be posted) is
    // taken with wait/try_take, exactly once. Only a batch's last request asks for a
    // completion; an error in an earlier one is what the batch reports.
    std::uint64_t post_send(std::uint32_t peer, mlx5::SendWorkRequest* requests, std::uint32_t count,
                            Operation operation);
    // The entries become requests in the engine's own scratch space (no allocation); at most
    // max_send_wr of them (callers check).
    std::uint64_t post_batch(std::uint32_t peer, const WorkBatch::Entry* entries, std::uint32_t count,
                             Operation operation);
    std::uint64_t post_receive(std::uint32_t peer, const LocalSlice& local);
    WorkResult wait(std::uint64_t ticket, std::chrono::milliseconds deadline);
    std::optional<WorkResult> try_take(std::uint64_t ticket);
    bool outstanding(std::uint64_t ticket) { return slot_for(ticket) != nullptr; }
    std::optional<std::uint32_t> peer_of(std::uint64_t ticket);
    // Moves the peer's QP to ERR and polls until each of its outstanding operations has its
    // (flush) completion, so the NIC holds none of its buffers any more.
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

private:
    enum class SlotState : std::uint8_t { free, pending, done };
    struct Slot {
        SlotState state = SlotState::free;
        bool error_seen = false;
        std::uint32_t generation = 0;
        Operation operation = Operation::send;
        std::uint32_t peer = 0;
        std::uint32_t send_requests = 0;  // held against the peer's send budget until done
        std::uint32_t scope = 0;          // 0: not in a scope
        std::uint64_t bytes = 0;          // what the requests carried (requester completions omit it)
        const char* not_posted = nullptr; // set when the device refused the post
        mlx5::Completion completion;
    };
    struct Peer {
        std::shared_ptr<transport::QueuePair> queue_pair;
        ChannelEndpoint local;
        ChannelEndpoint remote;
        std::string name;
        bool connected = false;
        bool healthy = true;
        std::uint32_t send_in_flight = 0;  // send work requests posted and not yet completed
        std::uint32_t outstanding = 0;     // operations (slots) not yet completed
        PeerCounters counters;
    };

    std::uint64_t claim_slot(std::uint32_t peer, Operation operation);
    void release(std::uint32_t slot);
    Slot* slot_for(std::uint64_t ticket);
    void finish(Slot& slot, const mlx5::Completion& completion);
    void deliver(const mlx5::Completion& completion);
    WorkResult result_of(const Slot& slot) const;
    std::uint64_t fail_immediately(std::uint64_t ticket, mlx5::CompletionStatus status, const char* why);
    bool reserve_send_budget(Peer& peer, std::uint32_t count);
    void backoff(std::uint32_t& round) const;

    ChannelSettings settings_;
    std::shared_ptr<transport::Device> device_;
    transport::PortIdentity port_;
    std::shared_ptr<transport::ProtectionDomain> domain_;
    std::shared_ptr<transport::CompletionQueue> send_completions_;
    std::shared_ptr<transport::CompletionQueue> receive_completions_;
    std::vector<Peer> peers_;
    std::vector<mlx5::SendWorkRequest> scratch_requests_;
    std::vector<mlx5::ScatterGatherElement> scratch_elements_;
    std::vector<Slot> slots_;
    std::vector<std::uint32_t> free_slots_;
    std::uint32_t outstanding_ = 0;
    std::uint32_t next_scope_ = 1;
};

}  // namespace rdmachan::detail
