// MultiChannel, its builder and prepared form, multi-peer results and scopes: the engine
// (src/engine.hpp) with one queue pair per rank.
#include "rdmachan/multi_channel.hpp"

#include <cstring>
#include <exception>
#include <utility>

#include "rdmachan/handshake.hpp"
#include "src/engine.hpp"
#include "src/multi_barrier.hpp"
#include "src/multi_channel_bootstrap.hpp"
#include "src/operations.hpp"
#include "src/peer_pairing.hpp"
#include "src/peer_regions.hpp"
#include "src/settings_environment.hpp"

namespace rdmachan {

// ---- results --------------------------------------------------------------------------------

bool MultiResult::ok() const {
    for (const PeerResult& entry : results_) {
        if (!entry.result.ok()) return false;
    }
    return true;
}

std::vector<std::uint32_t> MultiResult::failed_peers() const {
    std::vector<std::uint32_t> peers;
    for (const PeerResult& entry : results_) {
        if (!entry.result.ok()) peers.push_back(entry.peer);
    }
    return peers;
}

std::string MultiResult::message() const {
    std::string text;
    for (const PeerResult& entry : results_) {
        if (entry.result.ok()) continue;
        if (!text.empty()) text += "\n";
        text += "rank " + std::to_string(entry.peer) + ": " + entry.result.error().message();
    }
    return text;
}

namespace {

// Every share's result: those poll() took already, the rest through `wait_for`.
template <typename WaitFor>
MultiResult take_all(std::vector<std::pair<std::uint32_t, PendingWork>>& work, std::vector<PeerResult>& taken,
                     WaitFor wait_for) {
    std::vector<PeerResult> results;
    results.reserve(work.size());
    for (std::size_t share = 0; share < work.size(); ++share) {
        auto& [peer, handle] = work[share];
        const bool polled = share < taken.size() && !handle.pending();
        results.push_back(polled ? std::move(taken[share]) : PeerResult{peer, wait_for(handle)});
    }
    work.clear();
    taken.clear();
    return MultiResult(std::move(results));
}

}  // namespace

MultiResult PendingMultiWork::wait() {
    return take_all(work_, taken_, [](PendingWork& handle) { return handle.wait(); });
}

MultiResult PendingMultiWork::flush() {
    return take_all(work_, taken_, [](PendingWork& handle) { return handle.flush(); });
}

std::optional<MultiResult> PendingMultiWork::poll() {
    if (work_.empty()) return std::nullopt;
    if (taken_.empty()) taken_.resize(work_.size());
    bool complete = true;
    for (std::size_t share = 0; share < work_.size(); ++share) {
        auto& [peer, work] = work_[share];
        if (!work.pending()) continue;
        if (std::optional<WorkResult> result = work.poll()) {
            taken_[share] = {peer, std::move(*result)};
        } else {
            complete = false;
        }
    }
    if (!complete) return std::nullopt;
    work_.clear();
    return MultiResult(std::exchange(taken_, {}));
}

std::vector<std::uint32_t> PendingMultiWork::peers() const {
    std::vector<std::uint32_t> peers;
    peers.reserve(work_.size());
    for (const auto& [peer, work] : work_) peers.push_back(peer);
    return peers;
}

MultiResult ScopedMultiWork::wait() {
    std::vector<PeerResult> results;
    results.reserve(work_.size());
    for (auto& [peer, work] : work_) results.push_back({peer, work.wait()});
    return MultiResult(std::move(results));
}

// ---- builder and prepared form --------------------------------------------------------------

MultiChannelBuilder::MultiChannelBuilder() : settings_(detail::settings_from_environment()) {}

MultiChannelBuilder& MultiChannelBuilder::rank(std::uint32_t value) {
    rank_ = value;
    return *this;
}

MultiChannelBuilder& MultiChannelBuilder::world_size(std::uint32_t value) {
    if (value == 0 || value > 4096) {
        throw Error("MultiChannelBuilder::world_size: " + std::to_string(value) + " is out of range [1, 4096]");
    }
    world_size_ = value;
    return *this;
}

std::string_view to_string(MultiChannelMode mode) {
    return mode == MultiChannelMode::dynamically_connected ? "dc" : "rc";
}

MultiChannelBuilder& MultiChannelBuilder::mode(MultiChannelMode value) {
    mode_ = value;
    return *this;
}

MultiChannelBuilder& MultiChannelBuilder::dc_initiators(std::uint32_t value) {
    if (value == 0 || value > 64) {
        throw Error("MultiChannelBuilder::dc_initiators: " + std::to_string(value) + " is out of range [1, 64]");
    }
    dc_initiators_ = value;
    return *this;
}

MultiChannelBuilder& MultiChannelBuilder::dc_key(std::uint64_t value) {
    dc_key_ = value;
    return *this;
}

MultiChannelBuilder& MultiChannelBuilder::bootstrap(Bootstrap value) {
    bootstrap_ = value;
    return *this;
}

PreparedMultiChannel MultiChannelBuilder::build() const {
    // Under PMIx, rank and world size come from the launcher (src/multi_channel_bootstrap.cpp).
    detail::BootstrapIdentity identity = detail::bootstrap_identity(bootstrap_, rank_, world_size_, settings_.deadline);
    if (!identity.world_size.has_value()) throw Error("MultiChannelBuilder::build: world_size is not set");

    // Under etcd the rank is the member id join() claims: the builder's, or the lowest free one.
    const bool claimed_at_join = identity.choice.bootstrap == Bootstrap::etcd;
    if (!identity.rank.has_value() && !claimed_at_join) throw Error("MultiChannelBuilder::build: rank is not set");
    const std::uint32_t rank = identity.rank.value_or(0);
    if (rank >= *identity.world_size) {
        throw Error("MultiChannelBuilder::build: rank " + std::to_string(rank) + " is not below world_size " +
                    std::to_string(*identity.world_size));
    }
    try {
        detail::DcSettings dc;
        dc.enabled = mode_ == MultiChannelMode::dynamically_connected;
        dc.initiators = dc_initiators_;
        dc.key = dc_key_;
        PreparedMultiChannel prepared(detail::make_engine(settings_, *identity.world_size, dc), rank);
        prepared.bootstrap_ = std::move(identity.choice);
        if (claimed_at_join) prepared.requested_id_ = identity.rank;
        prepared.pmix_ = std::move(identity.pmix);
        return prepared;
    } catch (const Error& error) {
        throw Error("MultiChannelBuilder::build (rank " + std::to_string(rank) + "): " + error.what());
    }
}

PreparedMultiChannel::PreparedMultiChannel(std::shared_ptr<detail::Engine> engine, std::uint32_t rank)
    : engine_(std::move(engine)), rank_(rank) {
    // A restarted process that reuses a rank gets a new session: the rendezvous can tell them apart.
    session_ = random_session_id();
    // The barrier's memory is published with the endpoint, so every peer can write into it.
    barrier_memory_ = engine_->allocate_memory(detail::Barrier::memory_bytes(engine_->peer_count()), Access::remote_all);
    std::memset(barrier_memory_.data(), 0, barrier_memory_.length());
    const RemoteMemoryRegion remote = barrier_memory_.remote();
    published_[kBarrierRegionName] = RemoteRegion{remote.addr, remote.length, remote.rkey};
}

MultiChannel PreparedMultiChannel::make_channel(std::uint32_t rank) {
    std::shared_ptr<detail::Engine> engine = engine_;
    MultiChannel channels(std::move(engine_), rank);
    channels.barrier_ = std::make_shared<detail::Barrier>(std::move(engine), rank, std::move(barrier_memory_));
    return channels;
}
PreparedMultiChannel::PreparedMultiChannel(PreparedMultiChannel&&) noexcept = default;
PreparedMultiChannel& PreparedMultiChannel::operator=(PreparedMultiChannel&&) noexcept = default;
PreparedMultiChannel::~PreparedMultiChannel() = default;

std::uint32_t PreparedMultiChannel::world_size() const { return engine_->peer_count(); }

std::vector<ChannelEndpoint> PreparedMultiChannel::endpoints() const {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::endpoints: this prepared multi-channel was already used");
    return engine_->pairing().per_peer_endpoints(*engine_, "PreparedMultiChannel::endpoints");
}

MemoryRegion PreparedMultiChannel::register_memory(void* data, std::size_t length, Access access) {
    return engine_->register_memory(data, length, access);
}

MemoryRegion PreparedMultiChannel::allocate_memory(std::size_t length, Access access) {
    return engine_->allocate_memory(length, access);
}

MultiChannel PreparedMultiChannel::handshake(const std::vector<std::vector<ChannelEndpoint>>& table) && {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::handshake: this prepared multi-channel was already used");
    const std::uint32_t world = engine_->peer_count();
    if (table.size() != world) {
        throw Error("PreparedMultiChannel::handshake (rank " + std::to_string(rank_) + "): the endpoint table has " +
                    std::to_string(table.size()) + " ranks, the world has " + std::to_string(world));
    }
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        if (table[peer].size() != world) {
            throw Error("PreparedMultiChannel::handshake (rank " + std::to_string(rank_) + "): rank " +
                        std::to_string(peer) + " published " + std::to_string(table[peer].size()) +
                        " endpoints, the world has " + std::to_string(world));
        }
    }
    // Queue pair `peer` of this rank talks to queue pair `rank_` of that peer.
    for (std::uint32_t peer = 0; peer < world; ++peer) engine_->connect(peer, table[peer][rank_]);
    return make_channel(rank_);
}

// ---- multi-channel --------------------------------------------------------------------------

MultiChannel::MultiChannel(std::shared_ptr<detail::Engine> engine, std::uint32_t rank)
    : engine_(std::move(engine)), rank_(rank) {
    scratch_.reserve(engine_->settings().max_send_wr);
}
MultiChannel::MultiChannel(MultiChannel&&) noexcept = default;
MultiChannel& MultiChannel::operator=(MultiChannel&&) noexcept = default;
MultiChannel::~MultiChannel() = default;

std::uint32_t MultiChannel::world_size() const { return engine_->peer_count(); }
MultiChannelMode MultiChannel::mode() const {
    return engine_->pairing().mode();
}
std::uint32_t MultiChannel::queue_pair_count() const { return engine_->queue_pair_count(); }
std::uint32_t MultiChannel::peers_contacted() const { return engine_->contacted_peer_count(); }

MemoryRegion MultiChannel::register_memory(void* data, std::size_t length, Access access) {
    return engine_->register_memory(data, length, access);
}

MemoryRegion MultiChannel::allocate_memory(std::size_t length, Access access) {
    return engine_->allocate_memory(length, access);
}

MemoryRegion MultiChannel::register_layout(const MemoryLayout& layout, Access access) {
    return engine_->register_layout(layout, access);
}

void MultiChannel::check_peer(const char* call, std::uint32_t peer) const {
    if (peer >= engine_->peer_count()) {
        throw Error(std::string(call) + ": peer " + std::to_string(peer) + " is out of range (world size " +
                    std::to_string(engine_->peer_count()) + ")");
    }
}

bool MultiChannel::healthy(std::uint32_t peer) const {
    check_peer("MultiChannel::healthy", peer);
    return engine_->healthy(peer);
}

std::vector<std::uint32_t> MultiChannel::healthy_peers() const {
    std::vector<std::uint32_t> peers;
    for (std::uint32_t peer = 0; peer < engine_->peer_count(); ++peer) {
        if (engine_->healthy(peer)) peers.push_back(peer);
    }
    return peers;
}

PeerCounters MultiChannel::counters(std::uint32_t peer) const {
    check_peer("MultiChannel::counters", peer);
    return engine_->counters(peer);
}

std::string MultiChannel::peer_name(std::uint32_t peer) const {
    check_peer("MultiChannel::peer_name", peer);
    return engine_->peer_name(peer);
}

std::string MultiChannel::device_name() const { return engine_->device_name(); }
bool MultiChannel::progress() { return engine_->progress(); }
int MultiChannel::native_handle() { return engine_->event_descriptor(); }
bool MultiChannel::arm() { return engine_->arm(); }

PendingWork MultiChannel::post_send(std::uint32_t peer, const LocalSlice& local, std::optional<std::uint32_t> immediate) {
    check_peer("MultiChannel::post_send", peer);
    return PendingWork(engine_.get(), detail::post_send_operation(*engine_, peer, local, immediate), detail::send_operation(immediate));
}

PendingWork MultiChannel::post_receive(std::uint32_t peer, const LocalSlice& local) {
    check_peer("MultiChannel::post_receive", peer);
    return PendingWork(engine_.get(), engine_->post_receive(peer, local), Operation::receive);
}

PendingWork MultiChannel::post_write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote,
                                     std::optional<std::uint32_t> immediate) {
    check_peer("MultiChannel::post_write", peer);
    return PendingWork(engine_.get(), detail::post_write_operation(*engine_, peer, "MultiChannel::post_write", local, remote, immediate),
                       detail::write_operation(immediate));
}

PendingWork MultiChannel::post_read(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote) {
    check_peer("MultiChannel::post_read", peer);
    return PendingWork(engine_.get(), detail::post_read_operation(*engine_, peer, "MultiChannel::post_read", local, remote),
                       Operation::rdma_read);
}

PendingWork MultiChannel::post_fetch_and_add(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                             std::uint64_t add) {
    check_peer("MultiChannel::post_fetch_and_add", peer);
    return PendingWork(engine_.get(),
                       detail::post_fetch_and_add_operation(*engine_, peer, "MultiChannel::post_fetch_and_add", result, remote, add),
                       Operation::atomic_fetch_and_add);
}

PendingWork MultiChannel::post_compare_and_swap(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                                std::uint64_t compare, std::uint64_t swap) {
    check_peer("MultiChannel::post_compare_and_swap", peer);
    return PendingWork(engine_.get(),
                       detail::post_compare_and_swap_operation(*engine_, peer, "MultiChannel::post_compare_and_swap", result,
                                                               remote, compare, swap),
                       Operation::atomic_compare_and_swap);
}

PendingWork MultiChannel::post_batch(std::uint32_t peer, const WorkBatch& batch) {
    check_peer("MultiChannel::post_batch", peer);
    return PendingWork(engine_.get(), detail::post_batch_operation(*engine_, peer, "MultiChannel::post_batch", batch),
                       Operation::batch);
}

WorkResult MultiChannel::send(std::uint32_t peer, const LocalSlice& local, std::optional<std::uint32_t> immediate) {
    return post_send(peer, local, immediate).wait();
}
WorkResult MultiChannel::receive(std::uint32_t peer, const LocalSlice& local) { return post_receive(peer, local).wait(); }
WorkResult MultiChannel::write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote,
                               std::optional<std::uint32_t> immediate) {
    return post_write(peer, local, remote, immediate).wait();
}
WorkResult MultiChannel::read(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote) {
    return post_read(peer, local, remote).wait();
}
WorkResult MultiChannel::fetch_and_add(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                       std::uint64_t add) {
    return post_fetch_and_add(peer, result, remote, add).wait();
}
WorkResult MultiChannel::compare_and_swap(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                          std::uint64_t compare, std::uint64_t swap) {
    return post_compare_and_swap(peer, result, remote, compare, swap).wait();
}
WorkResult MultiChannel::execute(std::uint32_t peer, const WorkBatch& batch) { return post_batch(peer, batch).wait(); }

}  // namespace rdmachan
