// The queue pair that carries memory layouts' UMR work requests: an RC queue pair of the
// engine's protection domain connected to itself, with a completion queue of its own (UCC's
// tl/mlx5 keeps such a "UMR QP"). A UMR cannot go through a DC initiator, and a refused one takes
// its queue pair to ERR, which must not be a peer's. Created on first use; control path only (it
// allocates, throws and waits).
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transport/device_interface.hpp"

namespace rdmachan::detail {

class LayoutQueuePair {
public:
    // `settings`: the peers' RC queue pair settings, whose max_inline_data bounds a layout's entries.
    LayoutQueuePair(std::shared_ptr<transport::ProtectionDomain> domain, const transport::PortIdentity& port,
                    const transport::QueuePairSettings& settings, std::chrono::milliseconds deadline);
    // Posts the work request signaled and waits for its completion; throws rdmachan::Error naming
    // `call` and the status. A refused or late request's queue pair is never reused.
    void configure(const mlx5::SendWorkRequest& request, const std::string& call);
    // Whether the queue pair exists now (Engine::queue_pair_count counts it).
    bool created() const { return queue_pair_ != nullptr; }

private:
    void create(const std::string& call);

    std::shared_ptr<transport::ProtectionDomain> domain_;
    transport::PortIdentity port_;
    transport::QueuePairSettings settings_;
    std::chrono::milliseconds deadline_;
    std::shared_ptr<transport::CompletionQueue> completions_;
    std::shared_ptr<transport::QueuePair> queue_pair_;
};

}  // namespace rdmachan::detail
