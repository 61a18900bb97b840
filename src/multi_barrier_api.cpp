// MultiChannel's barrier at its three levels (blocking, unpolled, scoped) and its result, over
// the state in src/multi_barrier.hpp.
#include "common/logger.hpp"
#include "rdmachan/multi_channel.hpp"
#include "src/engine.hpp"
#include "src/multi_barrier.hpp"

namespace rdmachan {

std::vector<std::uint32_t> BarrierResult::failed_peers() const {
    std::vector<std::uint32_t> peers;
    for (const BarrierFailure& failure : failures_) peers.push_back(failure.peer);
    return peers;
}

std::string BarrierResult::message() const {
    std::string text;
    for (const BarrierFailure& failure : failures_) {
        if (!text.empty()) text += "\n";
        text += "rank " + std::to_string(failure.peer) + ": " + failure.reason;
    }
    return text;
}

PendingBarrier::PendingBarrier(PendingBarrier&& other) noexcept
    : barrier_(std::move(other.barrier_)) {}

PendingBarrier& PendingBarrier::operator=(PendingBarrier&& other) noexcept {
    if (this != &other) {
        if (barrier_ != nullptr) (void)wait();
        barrier_ = std::move(other.barrier_);
    }
    return *this;
}

PendingBarrier::~PendingBarrier() {
    if (barrier_ == nullptr) return;
    const BarrierResult result = wait();
    if (!result.ok())
        detail::logger().warn("pending barrier dropped unfinished: {}", result.message());
}

BarrierResult PendingBarrier::wait() {
    if (barrier_ == nullptr)
        throw Error(
            "PendingBarrier::wait: this handle holds no barrier (already waited for, or moved)");
    return std::exchange(barrier_, nullptr)->finish();
}

std::optional<BarrierResult> PendingBarrier::poll() {
    if (barrier_ == nullptr) return std::nullopt;
    std::optional<BarrierResult> result = barrier_->step();
    if (result.has_value()) barrier_.reset();
    return result;
}

namespace {

// A scoped handle names its barrier by number: once that one ended (taken here, or drained by
// the scope), the handle has nothing left to take.
detail::Barrier& scoped_barrier(const std::shared_ptr<detail::Barrier>& barrier,
                                std::uint64_t number, const char* call) {
    if (barrier == nullptr || !barrier->running() || barrier->number() != number) {
        throw Error(std::string(call) + ": this barrier's result was already taken");
    }
    return *barrier;
}

}  // namespace

BarrierResult ScopedBarrier::wait() {
    return scoped_barrier(barrier_, number_, "ScopedBarrier::wait").finish();
}

std::optional<BarrierResult> ScopedBarrier::poll() {
    return scoped_barrier(barrier_, number_, "ScopedBarrier::poll").step();
}

std::shared_ptr<detail::Barrier> MultiChannel::start_barrier(const char* call,
                                                             std::uint32_t scope) {
    if (opened_ != nullptr) {
        throw Error(std::string(call) + " (rank " + std::to_string(rank_) +
                    "): peers added by add_peer have no barrier (a barrier needs a fixed world, or "
                    "members through etcd: PreparedMultiChannel::join)");
    }
    barrier_->start(call, scope);
    return barrier_;
}

PendingBarrier MultiChannel::post_barrier() {
    return PendingBarrier(start_barrier("MultiChannel::post_barrier", 0));
}

BarrierResult MultiChannel::barrier() {
    return start_barrier("MultiChannel::barrier", 0)->finish();
}

std::uint32_t MultiChannel::barrier_rounds() const {
    return barrier_->rounds();
}

ScopedBarrier MultiScope::post_barrier() {
    std::shared_ptr<detail::Barrier> barrier =
        channel_.start_barrier("MultiScope::post_barrier", id_);
    const std::uint64_t number = barrier->number();
    return ScopedBarrier(std::move(barrier), number);
}

}  // namespace rdmachan
