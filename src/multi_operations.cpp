// MultiChannel's multi-peer operations and scopes: each peer's share goes under one doorbell
// (one batch per peer, split only where a peer's shares exceed its send budget).
#include <exception>

#include "rdmachan/multi_channel.hpp"
#include "src/engine.hpp"
#include "src/multi_barrier.hpp"
#include "src/operations.hpp"

namespace rdmachan {
namespace {

Operation operation_of(WorkBatch::Kind kind, std::optional<std::uint32_t> immediate) {
    switch (kind) {
        case WorkBatch::Kind::send: return detail::send_operation(immediate);
        case WorkBatch::Kind::write: return detail::write_operation(immediate);
        case WorkBatch::Kind::read: return Operation::rdma_read;
    }
    return Operation::batch;
}

WorkBatch::Entry entry_of(const PeerTransfer& share, WorkBatch::Kind kind, std::optional<std::uint32_t> immediate) {
    WorkBatch::Entry entry;
    entry.kind = kind;
    entry.local_addr = share.local.addr();
    entry.local_length = share.local.length();
    entry.lkey = share.local.lkey();
    entry.remote_addr = share.remote.addr;
    entry.rkey = share.remote.rkey;
    if (kind != WorkBatch::Kind::read) entry.immediate = immediate;
    return entry;
}

}  // namespace

PendingMultiWork MultiChannel::post_shares(const char* call, std::span<const PeerTransfer> shares, WorkBatch::Kind kind,
                                           std::optional<std::uint32_t> immediate) {
    // Everything is checked before the first request is posted.
    for (std::size_t index = 0; index < shares.size(); ++index) {
        const PeerTransfer& share = shares[index];
        check_peer(call, share.peer);
        if (kind != WorkBatch::Kind::send && share.local.length() > share.remote.length) {
            throw Error(std::string(call) + ": share " + std::to_string(index) + " (rank " + std::to_string(share.peer) +
                        "): " + std::to_string(share.local.length()) + " local bytes against a remote region of " +
                        std::to_string(share.remote.length));
        }
    }
    const std::uint32_t budget = engine_->settings().max_send_wr;
    std::vector<std::pair<std::uint32_t, PendingWork>> work;
    for (std::size_t first = 0; first < shares.size(); ++first) {
        const std::uint32_t peer = shares[first].peer;
        bool seen = false;
        for (std::size_t earlier = 0; earlier < first && !seen; ++earlier) seen = shares[earlier].peer == peer;
        if (seen) continue;  // this peer's shares went out with its first one
        scratch_.clear();
        for (std::size_t index = first; index < shares.size(); ++index) {
            if (shares[index].peer != peer) continue;
            scratch_.push_back(entry_of(shares[index], kind, immediate));
            if (scratch_.size() == budget) {
                work.emplace_back(peer, PendingWork(engine_.get(), engine_->post_batch(peer, scratch_.data(), budget, operation_of(kind, immediate)),
                                                    operation_of(kind, immediate)));
                scratch_.clear();
            }
        }
        if (!scratch_.empty()) {
            const auto count = static_cast<std::uint32_t>(scratch_.size());
            work.emplace_back(peer, PendingWork(engine_.get(), engine_->post_batch(peer, scratch_.data(), count, operation_of(kind, immediate)),
                                                operation_of(kind, immediate)));
        }
    }
    return PendingMultiWork(std::move(work));
}

PendingMultiWork MultiChannel::post_scatter_send(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate) {
    return post_shares("MultiChannel::scatter_send", shares, WorkBatch::Kind::send, immediate);
}

PendingMultiWork MultiChannel::post_scatter_write(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate) {
    return post_shares("MultiChannel::scatter_write", shares, WorkBatch::Kind::write, immediate);
}

PendingMultiWork MultiChannel::post_gather_read(std::span<const PeerTransfer> shares) {
    return post_shares("MultiChannel::gather_read", shares, WorkBatch::Kind::read, std::nullopt);
}

PendingMultiWork MultiChannel::post_gather_receive(std::span<const PeerTransfer> shares) {
    for (const PeerTransfer& share : shares) check_peer("MultiChannel::gather_receive", share.peer);
    std::vector<std::pair<std::uint32_t, PendingWork>> work;
    work.reserve(shares.size());
    for (const PeerTransfer& share : shares) {
        work.emplace_back(share.peer, PendingWork(engine_.get(), engine_->post_receive(share.peer, share.local), Operation::receive));
    }
    return PendingMultiWork(std::move(work));
}

PendingMultiWork MultiChannel::post_multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local,
                                                   std::optional<std::uint32_t> immediate) {
    for (std::uint32_t peer : peers) check_peer("MultiChannel::multicast_send", peer);
    std::vector<std::pair<std::uint32_t, PendingWork>> work;
    work.reserve(peers.size());
    for (std::uint32_t peer : peers) {
        work.emplace_back(peer, PendingWork(engine_.get(), detail::post_send_operation(*engine_, peer, local, immediate),
                                            detail::send_operation(immediate)));
    }
    return PendingMultiWork(std::move(work));
}

MultiResult MultiChannel::scatter_send(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate) {
    return post_scatter_send(shares, immediate).wait();
}
MultiResult MultiChannel::scatter_write(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate) {
    return post_scatter_write(shares, immediate).wait();
}
MultiResult MultiChannel::gather_receive(std::span<const PeerTransfer> shares) { return post_gather_receive(shares).wait(); }
MultiResult MultiChannel::gather_read(std::span<const PeerTransfer> shares) { return post_gather_read(shares).wait(); }
MultiResult MultiChannel::multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local,
                                         std::optional<std::uint32_t> immediate) {
    return post_multicast_send(peers, local, immediate).wait();
}

// ---- scopes ---------------------------------------------------------------------------------

ScopedWork MultiScope::adopt(PendingWork work) {
    const std::uint64_t ticket = work.release_ticket();
    channel_.engine_->adopt(ticket, id_);
    return ScopedWork(channel_.engine_, ticket);
}

ScopedMultiWork MultiScope::adopt(PendingMultiWork work) {
    std::vector<std::pair<std::uint32_t, ScopedWork>> scoped;
    scoped.reserve(work.work_.size());
    for (auto& [peer, pending] : work.work_) scoped.emplace_back(peer, adopt(std::move(pending)));
    work.work_.clear();
    return ScopedMultiWork(std::move(scoped));
}

ScopedWork MultiScope::post_send(std::uint32_t peer, const LocalSlice& local, std::optional<std::uint32_t> immediate) {
    return adopt(channel_.post_send(peer, local, immediate));
}
ScopedWork MultiScope::post_receive(std::uint32_t peer, const LocalSlice& local) { return adopt(channel_.post_receive(peer, local)); }
ScopedWork MultiScope::post_write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote,
                                  std::optional<std::uint32_t> immediate) {
    return adopt(channel_.post_write(peer, local, remote, immediate));
}
ScopedWork MultiScope::post_read(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote) {
    return adopt(channel_.post_read(peer, local, remote));
}
ScopedMultiWork MultiScope::post_scatter_send(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate) {
    return adopt(channel_.post_scatter_send(shares, immediate));
}
ScopedMultiWork MultiScope::post_scatter_write(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate) {
    return adopt(channel_.post_scatter_write(shares, immediate));
}
ScopedMultiWork MultiScope::post_gather_receive(std::span<const PeerTransfer> shares) {
    return adopt(channel_.post_gather_receive(shares));
}
ScopedMultiWork MultiScope::post_gather_read(std::span<const PeerTransfer> shares) { return adopt(channel_.post_gather_read(shares)); }
ScopedMultiWork MultiScope::post_multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local,
                                                std::optional<std::uint32_t> immediate) {
    return adopt(channel_.post_multicast_send(peers, local, immediate));
}

void MultiChannel::scope(const std::function<void(MultiScope&)>& body) { run_scope(body, false); }
void MultiChannel::manual_scope(const std::function<void(MultiScope&)>& body) { run_scope(body, true); }

void MultiChannel::run_scope(const std::function<void(MultiScope&)>& body, bool strict) {
    MultiScope scope(*this, engine_->open_scope());
    std::exception_ptr thrown;
    try {
        body(scope);
    } catch (...) {
        thrown = std::current_exception();
    }
    // A barrier posted in the scope and not waited for advances only while polled: the scope
    // finishes it before draining the rest.
    std::uint32_t barriers_left = 0;
    std::optional<BarrierResult> barrier_result;
    if (barrier_ != nullptr && barrier_->running() && barrier_->scope() == scope.id_) {
        barriers_left = 1;
        barrier_result = barrier_->finish();
    }
    const detail::Engine::DrainReport report = engine_->close_scope(scope.id_);
    if (thrown) std::rethrow_exception(thrown);
    if (report.failure.has_value()) {
        throw Error("scope drain: " + report.failure->message() + "; that peer's QP was moved to ERR and flushed");
    }
    if (barrier_result.has_value() && !barrier_result->ok()) throw Error("scope drain: barrier: " + barrier_result->message());
    if (strict && report.unpolled + barriers_left != 0) {
        throw Error("manual_scope (rank " + std::to_string(rank_) + "): " + std::to_string(report.unpolled + barriers_left) +
                    " operation(s) were left unpolled (drained at the end of the scope)");
    }
}

}  // namespace rdmachan
