// The engine under Channel: one RC QP on a ring-based device (today the software mlx5 device),
// the mlx5 data path over its rings, and a table of outstanding operations whose completions are
// cached by work-request id so handles can be waited for in any order. Nothing on the post/poll
// path allocates, locks or throws; tables are sized when the channel is built.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/channel.hpp"
#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/receive_queue.hpp"
#include "transport/mlx5/send_queue.hpp"
#include "transport/soft/device.hpp"

namespace rdmachan::detail {

class ChannelCore {
public:
    explicit ChannelCore(const ChannelSettings& settings);
    ~ChannelCore();

    const ChannelSettings& settings() const { return settings_; }
    const ChannelEndpoint& local_endpoint() const { return local_; }
    const ChannelEndpoint& remote_endpoint() const { return remote_; }
    const std::string& peer() const { return peer_; }
    bool healthy() const { return healthy_; }

    MemoryRegion register_memory(void* data, std::size_t length, Access access);
    void connect(const ChannelEndpoint& remote);

    // Data path. A ticket names one outstanding operation; its completion (or the reason it
    // could not be posted) is taken with wait/try_take, exactly once.
    std::uint64_t post_send_request(mlx5::SendWorkRequest& request, Operation operation);
    std::uint64_t post_receive_request(const LocalSlice& local);
    WorkResult wait(std::uint64_t ticket, std::chrono::milliseconds deadline);
    std::optional<WorkResult> try_take(std::uint64_t ticket);
    bool outstanding(std::uint64_t ticket) { return slot_for(ticket) != nullptr; }
    // Moves the QP to ERR and polls until every outstanding operation has its (flush) completion,
    // so the NIC holds no buffer any more.
    void fail_and_flush(const char* why);

    // Scopes: operations posted in a scope carry its id; when the scope ends, what it left is
    // drained. Returns how many completions had not been taken, and the first drain failure.
    std::uint32_t open_scope();
    void adopt(std::uint64_t ticket, std::uint32_t scope);
    struct DrainReport {
        std::uint32_t unpolled = 0;
        std::optional<WorkError> failure;
    };
    DrainReport close_scope(std::uint32_t scope);

private:
    enum class SlotState : std::uint8_t { free, pending, done };
    struct Slot {
        SlotState state = SlotState::free;
        std::uint32_t generation = 0;
        Operation operation = Operation::send;
        bool post_failed = false;
        std::uint32_t scope = 0;  // 0: not in a scope
        mlx5::Completion completion;
    };

    std::uint64_t claim_slot(Operation operation);
    void release(std::uint32_t slot);
    Slot* slot_for(std::uint64_t ticket);
    WorkResult result_of(const Slot& slot) const;
    std::uint64_t fail_immediately(std::uint64_t ticket, std::uint8_t status);
    bool poll_once();
    void backoff(std::uint32_t& round) const;

    ChannelSettings settings_;
    std::shared_ptr<soft::Device> device_;
    std::shared_ptr<soft::ProtectionDomain> domain_;
    std::shared_ptr<soft::CompletionQueue> send_cq_;
    std::shared_ptr<soft::CompletionQueue> receive_cq_;
    std::shared_ptr<soft::QueuePair> queue_pair_;
    std::vector<std::uint64_t> send_wr_ids_;
    std::vector<std::uint32_t> send_wqe_ends_;
    std::vector<std::uint64_t> receive_wr_ids_;
    mlx5::SendQueue send_;
    mlx5::ReceiveQueue receive_;
    mlx5::CompletionQueue send_completions_;
    mlx5::CompletionQueue receive_completions_;
    mlx5::CompletionTarget target_;
    std::vector<Slot> slots_;
    std::vector<std::uint32_t> free_slots_;
    std::uint32_t outstanding_ = 0;
    std::uint32_t next_scope_ = 1;
    ChannelEndpoint local_;
    ChannelEndpoint remote_;
    std::string peer_ = "unconnected peer";
    bool healthy_ = true;
};

}  // namespace rdmachan::detail
