#include "src/layout_queue_pair.hpp"

#include <thread>

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

LayoutQueuePair::LayoutQueuePair(std::shared_ptr<transport::ProtectionDomain> domain,
                                 const transport::PortIdentity& port, const transport::QueuePairSettings& settings,
                                 std::chrono::milliseconds deadline)
    : domain_(std::move(domain)), port_(port), settings_(settings), deadline_(deadline) {
    settings_.max_send_wr = 4;
    settings_.max_recv_wr = 1;
}

void LayoutQueuePair::create(const std::string& call) {
    try {
        completions_ = domain_->create_completion_queue(8);
        std::shared_ptr<transport::QueuePair> queue_pair = domain_->create_queue_pair(settings_, completions_, completions_);
        transport::ConnectSettings connect;
        connect.remote_gid = port_.gid;
        connect.remote_lid = port_.lid;
        connect.remote_qpn = queue_pair->qpn();
        connect.path_mtu = port_.active_mtu;
        connect.source_gid_index = port_.gid_index;
        queue_pair->connect(connect);
        queue_pair_ = std::move(queue_pair);
    } catch (const std::exception& error) {
        throw Error(call + ": the queue pair for memory layouts could not be set up: " + error.what());
    }
}

void LayoutQueuePair::configure(const mlx5::SendWorkRequest& request, const std::string& call) {
    if (queue_pair_ == nullptr) create(call);
    mlx5::SendWorkRequest signaled = request;
    signaled.flags |= mlx5::kSendSignaled;
    std::uint32_t posted = 0;
    const mlx5::PostResult result = queue_pair_->post_send(&signaled, 1, &posted);
    if (result != mlx5::PostResult::ok) {
        throw Error(call + ": the layout's work request was refused before posting (" +
                    std::to_string(static_cast<int>(result)) + ")");
    }
    const auto until = std::chrono::steady_clock::now() + deadline_;
    mlx5::Completion completion;
    while (completions_->poll(&completion, 1) == 0) {
        if (std::chrono::steady_clock::now() >= until) {
            queue_pair_.reset();  // it may still complete: never reused
            throw Error(call + ": no completion within the deadline (" + std::to_string(deadline_.count()) + " ms)");
        }
        std::this_thread::yield();
    }
    if (completion.status != mlx5::CompletionStatus::success) {
        queue_pair_.reset();  // in ERR now, as a NIC leaves it: the next layout gets a new one
        throw Error(call + ": the device refused the layout: " + mlx5::to_string(completion.status) + " (syndrome " +
                    std::to_string(completion.syndrome) + ")");
    }
}

}  // namespace rdmachan::detail
