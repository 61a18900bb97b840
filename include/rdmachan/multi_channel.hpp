// MultiChannel: one logical channel per peer, all sharing one protection domain and one pair of
// completion queues. Peers are ranks 0..world_size-1; the own rank is a peer too (a loopback
// queue pair), so all-to-all code needs no special case.
//
//   rdmachan::PreparedMultiChannel prepared = rdmachan::MultiChannelBuilder().rank(r).world_size(n).build();
//   publish(prepared.endpoints());                       // any out-of-band exchange, or connect()
//   rdmachan::MultiChannel channels = std::move(prepared).handshake(table_from_everyone);
//   auto region = channels.register_memory(buffer, size);
//   channels.scatter_write({{1, region.slice(0, 4096), remote_of_1}, {2, region.slice(4096, 4096), remote_of_2}});
//
// Every operation exists per peer (`write(peer, ...)`) and across peers (scatter_send,
// scatter_write, gather_receive, gather_read, multicast_send, barrier), at three levels: blocking,
// scoped (`channels.scope([&](rdmachan::MultiScope& s) { auto w = s.post_scatter_write(...); })`)
// and unpolled handles. A scatter posts each peer's share under one doorbell per peer.
//
// Threading and buffers: as for Channel (one thread at a time; buffers valid until completion).
// A peer whose queue pair failed fails only the operations that involve it. With peer
// replacement (RendezvousSettings::replacement) a new process can take a dead peer's rank:
// poll_peer_events() says so, reconnect(peer) connects it.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "rdmachan/bootstrap.hpp"
#include "rdmachan/channel.hpp"
#include "rdmachan/endpoint.hpp"
#include "rdmachan/membership.hpp"
#include "rdmachan/rendezvous.hpp"

namespace rdmachan {

namespace detail {
class PmixSession;
class PeerWatch;
class PeerRegions;
class Barrier;
class Membership;
}

// How a MultiChannel reaches its peers. Reliable connected: one RC queue pair per peer
// (N-1 queue pairs per process, plus loopback). Dynamically connected (mlx5 DC): a pool of DC
// initiators shared by all peers plus one DC target with a shared receive queue (W+1 queue
// pairs per process, whatever the number of peers). The API is the same in both.
enum class MultiChannelMode { reliable_connected, dynamically_connected };
std::string_view to_string(MultiChannelMode mode);

// DC mode: a send (or send with immediate) carries at most this many bytes, the size of the
// receive buffers the DC target's shared receive queue holds. A larger send is refused before
// it is posted; RDMA writes and reads have no such limit.
inline constexpr std::uint32_t kDcMaxSendBytes = 16384;

// A remote region of one peer.
struct PeerRemoteMemoryRegion {
    std::uint32_t peer = 0;
    RemoteMemoryRegion region;
    // A piece of it, bounds-checked like RemoteMemoryRegion::slice.
    PeerRemoteMemoryRegion slice(std::uint64_t offset, std::uint64_t length) const {
        return {peer, region.slice(offset, length)};
    }
};

// One peer's share of a scatter or gather.
struct PeerTransfer {
    std::uint32_t peer = 0;
    LocalSlice local;
    RemoteMemoryRegion remote;  // unused by sends and receives
};

struct PeerResult {
    std::uint32_t peer = 0;
    WorkResult result = WorkResult::success({});
};

// The outcome of a multi-peer operation: one result per peer involved.
class MultiResult {
public:
    MultiResult() = default;
    explicit MultiResult(std::vector<PeerResult> results) : results_(std::move(results)) {}
    bool ok() const;
    explicit operator bool() const { return ok(); }
    const std::vector<PeerResult>& results() const { return results_; }
    std::vector<std::uint32_t> failed_peers() const;
    // "" when ok; else one line per failed peer, each naming the peer and what failed.
    std::string message() const;

private:
    std::vector<PeerResult> results_;
};

// Unpolled handles of a multi-peer operation (one per peer involved).
class PendingMultiWork {
public:
    PendingMultiWork() = default;
    explicit PendingMultiWork(std::vector<std::pair<std::uint32_t, PendingWork>> work) : work_(std::move(work)) {}
    MultiResult wait();  // waits for every peer's share (each under the deadline)
    // Each share's PendingWork::flush(): its completion, or its peer's queue pair failed.
    MultiResult flush();
    // Every share's result if all have completed (polls each one not yet taken once); nothing
    // otherwise. The shares that completed are kept until the last one has, so polling again,
    // or wait(), goes on from there. Once only, like wait().
    std::optional<MultiResult> poll();
    std::size_t size() const { return work_.size(); }
    // The peer of each share, in the order of the results.
    std::vector<std::uint32_t> peers() const;

private:
    friend class MultiScope;
    std::vector<std::pair<std::uint32_t, PendingWork>> work_;
    std::vector<PeerResult> taken_;  // by share, once poll() has looked: the results taken so far
};

// Scoped handles of a multi-peer operation.
class ScopedMultiWork {
public:
    ScopedMultiWork() = default;
    explicit ScopedMultiWork(std::vector<std::pair<std::uint32_t, ScopedWork>> work) : work_(std::move(work)) {}
    MultiResult wait();
    std::size_t size() const { return work_.size(); }

private:
    std::vector<std::pair<std::uint32_t, ScopedWork>> work_;
};

// Barriers (MultiChannel::barrier, post_barrier, MultiScope::post_barrier): every rank of the
// world calls it, and none returns before all have called it. Dissemination over RDMA writes:
// ceil(log2 N) rounds; in round k each rank writes the barrier's number (8 bytes) into a word of
// rank + 2^k's barrier memory and waits until its own word k, written by rank - 2^k, holds at
// least that number. N = 1 has no rounds. Barrier numbers only grow, so round k of barrier b+1
// cannot be mistaken for round k of barrier b.
//
// Receive queues: a barrier uses none. Its messages are RDMA writes without immediate data, which
// consume no receive at the target, in RC (where a peer's receives are the application's, posted
// on that peer's queue pair) and in DC (where they would be matched to the application's
// receives). So the application's receives never see the barrier, and the barrier never needs
// theirs. Its memory (8 bytes per round, plus a word of its own and one per peer for reading
// peers' progress after a timeout) is allocated and registered by build(), and published in the
// endpoint under the reserved name kBarrierRegionName: PreparedMultiChannel::publish_region
// refuses names starting with "rdmachan.". It is learned only in the Endpoint handshakes
// (handshake(std::vector<Endpoint>), connect): after handshake(ChannelEndpoint table) a barrier
// is an rdmachan::Error.
//
// Waiting: the incoming words are polled in memory (no completion announces an RDMA write
// without immediate), so a barrier spins, yields and sleeps as ChannelSettings's spin_polls,
// yield_polls and sleep say, in every WaitMode. Deadline: the channel's, from post_barrier.
// When it passes, the barrier reads every peer's barrier number (one RDMA read each, all waited
// for within a tenth of the deadline; a peer that does not answer in that time has its queue pair
// failed and flushed, as PendingWork past its deadline) and fails naming the ranks that did not
// arrive or did not answer; a peer whose write failed is named with the transport's error at once.
// After a failed barrier the ranks' barrier numbers no longer agree: the world cannot meet in a
// barrier again (a replaced peer starts from barrier 0 too).
// One barrier at a time per multi-channel; each rank's barriers are numbered in call order.
// A barrier that returned says every rank arrived, not that every rank has learnt it: a rank's
// last word may be in a peer's memory before the peer's device acknowledged it, so a process
// that exits the moment its barrier returns can fail a peer whose barrier is still taking that
// write's completion. End a job with leave(), or with a last exchange the peers wait for.
//
// Members that come and go (join(), etcd): a barrier is among the members ready when it starts,
// and none returns before each of them entered a barrier with it. A member writes one word to
// every other member (N - 1 writes) and waits for one from each; a member's first barrier after
// it joined is each other member's next one. While it waits it advances the membership protocol
// (events are kept for poll_peer_events): a member that leaves or fails meanwhile is not waited
// for; one that stays and never comes is named at the deadline.
inline constexpr const char* kBarrierRegionName = "rdmachan.barrier";

// Why a barrier failed, by rank.
struct BarrierFailure {
    std::uint32_t peer = 0;
    std::string reason;
};

class BarrierResult {
public:
    BarrierResult() = default;
    explicit BarrierResult(std::vector<BarrierFailure> failures) : failures_(std::move(failures)) {}
    bool ok() const { return failures_.empty(); }
    explicit operator bool() const { return ok(); }
    const std::vector<BarrierFailure>& failures() const { return failures_; }
    std::vector<std::uint32_t> failed_peers() const;
    // "" when ok; else one line per failed rank: "rank 3: did not arrive at barrier 7 ...".
    std::string message() const;

private:
    std::vector<BarrierFailure> failures_;
};

// An unpolled barrier. poll() never waits: it takes the words that arrived and posts the next
// rounds' writes, so the barrier advances only while someone polls (or waits). Its destructor
// waits for it, under the deadline, as PendingWork's does.
class PendingBarrier {
public:
    PendingBarrier() = default;
    PendingBarrier(PendingBarrier&& other) noexcept;
    PendingBarrier& operator=(PendingBarrier&& other) noexcept;
    ~PendingBarrier();
    // Until every rank has arrived, or the deadline (from post_barrier). Once only.
    BarrierResult wait();
    // The result once every rank has arrived (or it failed); nothing otherwise. Once it gave a
    // result, the handle is done.
    std::optional<BarrierResult> poll();
    bool pending() const { return barrier_ != nullptr; }

private:
    friend class MultiChannel;
    friend class MultiScope;
    explicit PendingBarrier(std::shared_ptr<detail::Barrier> barrier) : barrier_(std::move(barrier)) {}
    std::shared_ptr<detail::Barrier> barrier_;
};

// A barrier posted in a scope: when the scope ends before it was waited for, the scope waits for
// it (manual_scope counts it as unpolled).
class ScopedBarrier {
public:
    ScopedBarrier() = default;
    BarrierResult wait();  // once only; a second call throws rdmachan::Error
    std::optional<BarrierResult> poll();

private:
    friend class MultiScope;
    ScopedBarrier(std::shared_ptr<detail::Barrier> barrier, std::uint64_t number) : barrier_(std::move(barrier)), number_(number) {}
    std::shared_ptr<detail::Barrier> barrier_;
    std::uint64_t number_ = 0;
};

class MultiChannel;

namespace detail {
// For tests of peer replacement under PMIx: the rounds the watch of the launcher's data store has
// finished (PeerWatch::finished_rounds; 0 without a watch).
std::uint64_t peer_watch_rounds(const MultiChannel& channel);
}

// What MultiChannel::poll_peer_events reports about a peer (see there).
struct PeerEvent {
    enum class Kind {
        failed,                  // its operations fail: its queue pair failed, or its process left the rendezvous
        replacement_available,   // a new process took its rank; MultiChannel::reconnect(peer) connects it
        replacement_connected,   // the replacement is connected on both sides: its operations work again
        // Membership through etcd (membership.hpp):
        joined,       // a member is connected on both sides: its operations work
        left,         // it announced its leave; its operations were flushed and now fail
        reconnected,  // its pair was connected again after a failure (reconnect): operations work again
        // A value under the service's prefix that was not taken: `reason` names its key and
        // why (garbled, hostile, another mode, an id beyond the capacity). `peer` is the id the
        // key names, or kNoPeer.
        refused,
    };
    static constexpr std::uint32_t kNoPeer = ~0u;
    Kind kind = Kind::failed;
    std::uint32_t peer = 0;
    std::uint64_t session = 0;  // failed, left: the session that went; otherwise the new one's
    std::string reason;         // failed, refused: what showed it
};
std::string_view to_string(PeerEvent::Kind kind);

class MultiScope {
public:
    ScopedWork post_send(std::uint32_t peer, const LocalSlice& local, std::optional<std::uint32_t> immediate = std::nullopt);
    ScopedWork post_receive(std::uint32_t peer, const LocalSlice& local);
    ScopedWork post_write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote,
                          std::optional<std::uint32_t> immediate = std::nullopt);
    ScopedWork post_read(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote);
    ScopedMultiWork post_scatter_send(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate = std::nullopt);
    ScopedMultiWork post_scatter_write(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate = std::nullopt);
    ScopedMultiWork post_gather_receive(std::span<const PeerTransfer> shares);
    ScopedMultiWork post_gather_read(std::span<const PeerTransfer> shares);
    ScopedMultiWork post_multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local,
                                        std::optional<std::uint32_t> immediate = std::nullopt);
    ScopedBarrier post_barrier();

private:
    friend class MultiChannel;
    MultiScope(MultiChannel& channel, std::uint32_t id) : channel_(channel), id_(id) {}
    ScopedWork adopt(PendingWork work);
    ScopedMultiWork adopt(PendingMultiWork work);
    MultiChannel& channel_;
    std::uint32_t id_;
};

class MultiChannel {
public:
    MultiChannel(MultiChannel&&) noexcept;
    MultiChannel& operator=(MultiChannel&&) noexcept;
    ~MultiChannel();

    std::uint32_t rank() const { return rank_; }
    std::uint32_t world_size() const;
    MultiChannelMode mode() const;
    // Queue pairs this process created for the multi-channel: one per peer (loopback included)
    // in RC mode; the DC initiators plus the DC target in DC mode; plus, once a layout was
    // registered, the queue pair that configures layouts (register_layout).
    std::uint32_t queue_pair_count() const;
    // Peers this process holds per-peer state for. RC: every peer, from the build on. DC: the
    // peers it has posted to, received from, or changed (a failure, a replacement); a peer of the
    // fixed world is addressed from the handshake's table when first used, so set-up cost and
    // memory grow with the peers actually used (docs/SCALE.md).
    std::uint32_t peers_contacted() const;
    MemoryRegion register_memory(void* data, std::size_t length, Access access = Access::remote_all);
    // Memory the library allocates and registers (see Channel::allocate_memory).
    MemoryRegion allocate_memory(std::size_t length, Access access = Access::remote_all);
    // A memory layout as one zero-based region, usable with every peer (see
    // Channel::register_layout), in RC and DC mode. In DC mode a layout cannot be a receive's
    // target (receives are copied out of the engine's buffers by the CPU).
    MemoryRegion register_layout(const MemoryLayout& layout, Access access = Access::remote_all);

    // Per peer, blocking.
    WorkResult send(std::uint32_t peer, const LocalSlice& local, std::optional<std::uint32_t> immediate = std::nullopt);
    WorkResult receive(std::uint32_t peer, const LocalSlice& local);
    WorkResult write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote,
                     std::optional<std::uint32_t> immediate = std::nullopt);
    WorkResult read(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote);
    WorkResult fetch_and_add(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add);
    WorkResult compare_and_swap(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                std::uint64_t compare, std::uint64_t swap);
    WorkResult execute(std::uint32_t peer, const WorkBatch& batch);

    // Per peer, unpolled.
    PendingWork post_send(std::uint32_t peer, const LocalSlice& local, std::optional<std::uint32_t> immediate = std::nullopt);
    PendingWork post_receive(std::uint32_t peer, const LocalSlice& local);
    PendingWork post_write(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote,
                           std::optional<std::uint32_t> immediate = std::nullopt);
    PendingWork post_read(std::uint32_t peer, const LocalSlice& local, const RemoteMemoryRegion& remote);
    PendingWork post_fetch_and_add(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                   std::uint64_t add);
    PendingWork post_compare_and_swap(std::uint32_t peer, const LocalSlice& result, const RemoteMemoryRegion& remote,
                                      std::uint64_t compare, std::uint64_t swap);
    PendingWork post_batch(std::uint32_t peer, const WorkBatch& batch);

    // Across peers. Peers out of range are rejected (rdmachan::Error naming the peer) before
    // anything is posted. A peer may appear several times; its shares go under one doorbell.
    MultiResult scatter_send(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate = std::nullopt);
    MultiResult scatter_write(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate = std::nullopt);
    MultiResult gather_receive(std::span<const PeerTransfer> shares);
    MultiResult gather_read(std::span<const PeerTransfer> shares);
    MultiResult multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local,
                               std::optional<std::uint32_t> immediate = std::nullopt);
    PendingMultiWork post_scatter_send(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate = std::nullopt);
    PendingMultiWork post_scatter_write(std::span<const PeerTransfer> shares, std::optional<std::uint32_t> immediate = std::nullopt);
    PendingMultiWork post_gather_receive(std::span<const PeerTransfer> shares);
    PendingMultiWork post_gather_read(std::span<const PeerTransfer> shares);
    PendingMultiWork post_multicast_send(std::span<const std::uint32_t> peers, const LocalSlice& local,
                                         std::optional<std::uint32_t> immediate = std::nullopt);

    // Every rank of the world meets (see "Barriers" above): blocking, unpolled, and scoped
    // (MultiScope::post_barrier). rdmachan::Error when a barrier is already in progress, or the
    // peers' barrier memory is unknown (handshake from a ChannelEndpoint table).
    BarrierResult barrier();
    PendingBarrier post_barrier();
    // Messages (RDMA writes) this rank sends per barrier: ceil(log2 world_size()).
    std::uint32_t barrier_rounds() const;

    // Scoped polling, as Channel::scope / manual_scope.
    void scope(const std::function<void(MultiScope&)>& body);
    void manual_scope(const std::function<void(MultiScope&)>& body);

    bool healthy(std::uint32_t peer) const;
    std::vector<std::uint32_t> healthy_peers() const;
    PeerCounters counters(std::uint32_t peer) const;
    std::string peer_name(std::uint32_t peer) const;
    std::string device_name() const;
    // As Channel::progress.
    bool progress();
    // As Channel::native_handle and Channel::arm: one descriptor for every peer's completions.
    int native_handle();
    bool arm();
    // A region the peer published under `name` (PreparedMultiChannel::publish_region), as
    // learned in the handshake; rdmachan::Error naming the peer and the name if there is none.
    PeerRemoteMemoryRegion remote_region(std::uint32_t peer, const std::string& name) const;

    // Membership through etcd (join(); membership.hpp). leave(): says this member is going
    // (members/<id>/leaving), waits until every member it is paired with has flushed its
    // operations towards it and said so, or the channel's deadline, then revokes its lease (its
    // keys go) and disconnects every peer; its peers see `left`, not `failed`. The channel's
    // operations fail from then on. rdmachan::Error when the channel was not joined through etcd
    // or has left. members(): the ids whose pairs are ready now, this member's own included.
    LeaveResult leave();
    std::vector<std::uint32_t> members() const;

    // Peers that come and go, on a multi-channel from PreparedMultiChannel::open(); the caller
    // carries the endpoints between the processes (serialize_endpoint / parse_endpoint).
    //   1. Each side calls offer_peer(other) and hands the result to the other.
    //   2. Each side calls add_peer(what the other offered it).
    //   3. Operations between them work once both have returned from add_peer: the caller learns
    //      that through its own messages. (In RC, a request that reaches a side not yet added is
    //      retried by the NIC for its retry time, then fails the pair.)
    // offer_peer: this process's endpoint for `peer` (port, DC target, published regions) and, in
    // RC, a fresh queue pair for it as the one RC entry (the entry's peer is `peer`); whatever the
    // slot held before is flushed. add_peer: connects `theirs.rank` (RC: to its queue pair for
    // this rank, the entry whose peer is this rank; DC: its target); its regions become
    // remote_region()'s. remove_peer: flushes the peer's operations and disconnects it; its slot
    // fails operations again until it is added anew. Each throws rdmachan::Error naming the peer
    // and the field when the endpoint does not fit (another mode or device, no entry for this
    // rank, a rank out of range or this one's), and on a multi-channel not from open().
    Endpoint offer_peer(std::uint32_t peer);
    void add_peer(const Endpoint& theirs);
    void remove_peer(std::uint32_t peer);

    // Peer replacement (connect() with RendezvousSettings::replacement; handshake/README.md).
    // Polled, not a callback: a MultiChannel is used by one thread at a time, and a callback
    // from the library's side would run beside that thread's posts and polls; polling keeps the
    // application in charge of when a peer's queue pair is replaced. Without replacement only
    // `failed` is reported (from the queue pairs). Never blocks, except under etcd membership:
    // there it also advances the protocol, whose writes to the store (a few per member that
    // joins, leaves or reconnects; none while nothing changes) each wait for etcd's answer.
    // Under etcd, `failed` for this member's own id says its membership broke (its lease was
    // lost: it rejoins as a new session, every pair reported failed; or a watch stopped).
    std::vector<PeerEvent> poll_peer_events();
    // Under etcd membership: connects the pair with `peer` again after its queue pair failed
    // while both members live (a remote access error moves an RC queue pair to ERR for good):
    // a new queue pair offered through the store, which the peer connects as it polls; until
    // `reconnected` its operations fail naming why. What was posted before the failure has
    // reported its error; nothing is replayed. In DC the peer's target is set up again at once.
    // Otherwise: connects the replacement of `peer` announced by replacement_available: RC a new queue pair
    // towards it, DC its new target number and key, its published regions as remote_region()
    // gives them; tells the rendezvous, so the replacement can connect its side. Until
    // replacement_connected the peer's operations fail, naming why. Operations on other peers
    // are untouched. rdmachan::Error naming the peer when replacement is disabled, no
    // replacement is pending, or the pending endpoint is the session that failed (stale).
    void reconnect(std::uint32_t peer);
    // The session of the process this multi-channel talks to as `peer` (learned at connect or
    // from its replacement).
    std::uint64_t peer_session(std::uint32_t peer) const;
    // Under the PMIx bootstrap with replacement: starts one process running `command`
    // (command[0] is the program) through the launcher (PMIx_Spawn) to take `peer`'s rank; it
    // connects with connect(PeerReplacement::replace_failed_rank). Returns its PMIx namespace.
    // One rank calls it, when the application decides the peer is gone. Under the TCP
    // rendezvous the application starts the replacement itself: rdmachan::Error saying so, as
    // for replacement disabled, `peer` out of range or this rank.
    std::string spawn_replacement(std::uint32_t peer, const std::vector<std::string>& command);

private:
    friend class PreparedMultiChannel;
    friend class MultiScope;
    friend std::uint64_t detail::peer_watch_rounds(const MultiChannel& channel);
    struct PeerLife {
        std::uint64_t session = 0;         // the connected process
        bool failure_reported = false;
        // A replacement not yet reconnected; behind a pointer because an Endpoint kept in place
        // would cost every peer its size, at thousands of peers (docs/SCALE.md).
        std::unique_ptr<Endpoint> pending;
        std::optional<std::uint64_t> connecting;  // reconnected, waiting for `ready`
        bool offered = false;  // open(): offer_peer gave it a queue pair it has not been added with
    };
    std::shared_ptr<detail::PeerWatch> watch_;  // with replacement enabled: the rendezvous's or PMIx's
    std::shared_ptr<detail::Membership> membership_;  // joined through etcd
    std::unique_ptr<Endpoint> opened_;  // from open(): this process's endpoint, without RC entries
    // By peer, made when something first happens to it (8 bytes per peer until then: at
    // thousands of DC peers most are never touched, docs/SCALE.md); a peer with none has the
    // session the handshake learned, from session_of_.
    std::vector<std::unique_ptr<PeerLife>> lives_;
    std::function<std::uint64_t(std::uint32_t)> session_of_;
    PeerLife& life(std::uint32_t peer);
    MultiChannel(std::shared_ptr<detail::Engine> engine, std::uint32_t rank);
    void check_peer(const char* call, std::uint32_t peer) const;
    PendingMultiWork post_shares(const char* call, std::span<const PeerTransfer> shares, WorkBatch::Kind kind,
                                 std::optional<std::uint32_t> immediate);
    void run_scope(const std::function<void(MultiScope&)>& body, bool strict);
    std::shared_ptr<detail::Engine> engine_;
    std::uint32_t rank_ = 0;
    std::vector<WorkBatch::Entry> scratch_;
    std::unique_ptr<detail::PeerRegions> remote_regions_;  // what each peer published
    // The barrier's state and memory; shared with its handles, which may outlive a move.
    std::shared_ptr<detail::Barrier> barrier_;
    std::shared_ptr<detail::Barrier> start_barrier(const char* call, std::uint32_t scope);
};

class PreparedMultiChannel {
public:
    PreparedMultiChannel(PreparedMultiChannel&&) noexcept;
    PreparedMultiChannel& operator=(PreparedMultiChannel&&) noexcept;
    ~PreparedMultiChannel();

    std::uint32_t rank() const { return rank_; }
    std::uint32_t world_size() const;
    // endpoints()[peer]: this rank's queue pair for that peer. Publish all of them.
    std::vector<ChannelEndpoint> endpoints() const;
    MemoryRegion register_memory(void* data, std::size_t length, Access access = Access::remote_all);
    // Memory the library allocates and registers (see Channel::allocate_memory).
    MemoryRegion allocate_memory(std::size_t length, Access access = Access::remote_all);
    // table[r] = endpoints() of rank r (table[rank()] is this rank's own). Connects the queue
    // pair for each peer p to table[p][rank()].
    MultiChannel handshake(const std::vector<std::vector<ChannelEndpoint>>& table) &&;

    // The same in the versioned endpoint schema (endpoint.hpp): this rank's port identity, one
    // RC entry per peer, a session id, and the regions published so far.
    void publish_region(const std::string& name, const MemoryRegion& region);
    Endpoint endpoint() const;
    // table[r] = endpoint() of rank r. Each entry is checked (rank, world, RC entries, MTU)
    // and errors name the rank. In RC mode only the entry of table[r].rc that names this rank
    // is used, so table[r] may carry just that one, as rendezvous() returns it (protocol 2).
    MultiChannel handshake(const std::vector<Endpoint>& table) &&;
    // One call: exchange endpoints through the rendezvous (settings.rank and world_size must be
    // this multi-channel's), connect every queue pair, then meet in the rendezvous barrier so
    // no rank uses a peer before that peer is connected too.
    // Under the PMIx bootstrap (automatic detection), this call still uses the TCP rendezvous;
    // when PMIx was chosen explicitly (MultiChannelBuilder::bootstrap, RDMACHAN_BOOTSTRAP) it is
    // an error naming that choice.
    MultiChannel connect(RendezvousSettings settings) &&;
    // One call through the PMIx bootstrap (bootstrap.hpp, chosen at build()): publish, fence,
    // read each peer's endpoint, connect, then a second fence as the barrier. One deadline for
    // all of it: the channel settings' deadline, from this call. Multi-channels of one process
    // connect in the same order on every rank. Under the TCP bootstrap: an error saying to call
    // connect(RendezvousSettings).
    MultiChannel connect() &&;
    // The same with peer replacement (handshake/README.md, "Peer replacement under PMIx"):
    // `enabled` on the job's first processes, which then watch the launcher's data store for
    // replacements; `replace_failed_rank` in a process MultiChannel::spawn_replacement started,
    // which announces itself there and connects once every other rank reconnected it. Every rank
    // of the job must enable it. rdmachan::Error when the choice does not match how this process
    // was started (RDMACHAN_PMIX_REPLACES set or not).
    MultiChannel connect(PeerReplacement replacement) &&;
    // Joins the service whose members are kept in etcd (membership.hpp): claims a member id (the
    // builder's rank, else the lowest free one below world_size), puts this process's endpoint
    // under a lease, and connects every member already there (waiting up to join_wait for their
    // side). Under any other bootstrap than etcd: an rdmachan::Error naming the one chosen. Errors
    // name the store's address and the key: etcd unreachable (within the channel's deadline),
    // the id held by another process, every id taken.
    MultiChannel join(MembershipSettings settings = {}) &&;
    // A multi-channel with no peer connected yet, for an application that finds its peers itself
    // (a store or messages of its own): peers are connected and disconnected while it runs with
    // MultiChannel::offer_peer, add_peer and remove_peer. Needs the builder's rank. Its slots
    // are the world size's; an operation on a slot never added fails naming why. barrier() is an
    // error on it (a barrier needs a fixed world, or members through etcd).
    MultiChannel open() &&;
    // The bootstrap build() chose (tcp, pmix or etcd) and why.
    const BootstrapChoice& bootstrap() const { return bootstrap_; }

private:
    friend class MultiChannelBuilder;
    PreparedMultiChannel(std::shared_ptr<detail::Engine> engine, std::uint32_t rank);
    // connect(RendezvousSettings) in DC mode: the table decoded on demand, its DC directory read
    // in place (src/multi_channel_endpoint.cpp).
    MultiChannel handshake_view(const std::shared_ptr<const RendezvousTableView>& view) &&;
    BootstrapChoice bootstrap_;
    std::optional<std::uint32_t> requested_id_;  // etcd: the member id to claim (the builder's rank)
    std::shared_ptr<detail::PmixSession> pmix_;  // set under the PMIx bootstrap
    std::shared_ptr<detail::Engine> engine_;
    std::uint32_t rank_ = 0;
    std::uint64_t session_ = 0;
    std::map<std::string, RemoteRegion> published_;
    MemoryRegion barrier_memory_;  // published as kBarrierRegionName
    MultiChannel make_channel(std::uint32_t rank);
};


class MultiChannelBuilder {
public:
    // As ChannelBuilder(): the defaults and the environment's settings.
    MultiChannelBuilder();
    // The per-peer queue-pair settings, as ChannelBuilder checks them.
    explicit MultiChannelBuilder(const ChannelBuilder& channel) : settings_(channel.settings()) {}
    // Under the PMIx bootstrap both come from PMIx and need not be set; set, they must agree.
    MultiChannelBuilder& rank(std::uint32_t value);
    MultiChannelBuilder& world_size(std::uint32_t value);
    // Default automatic; see bootstrap.hpp for the choice and RDMACHAN_BOOTSTRAP.
    MultiChannelBuilder& bootstrap(Bootstrap value);
    // Default reliable_connected.
    MultiChannelBuilder& mode(MultiChannelMode value);
    // DC mode: the number of DC initiators in the pool, [1, 64], default 4.
    MultiChannelBuilder& dc_initiators(std::uint32_t value);
    // DC mode: the access key this process's DC target checks. Default: random per process,
    // published in its endpoint (initiators use each target's own key); set it to pin one.
    MultiChannelBuilder& dc_key(std::uint64_t value);
    const ChannelSettings& settings() const { return settings_; }
    MultiChannelMode mode() const { return mode_; }
    PreparedMultiChannel build() const;

private:
    ChannelSettings settings_;
    std::optional<std::uint32_t> rank_;
    std::optional<std::uint32_t> world_size_;
    MultiChannelMode mode_ = MultiChannelMode::reliable_connected;
    std::uint32_t dc_initiators_ = 4;
    std::optional<std::uint64_t> dc_key_;
    Bootstrap bootstrap_ = Bootstrap::automatic;
};

}  // namespace rdmachan
