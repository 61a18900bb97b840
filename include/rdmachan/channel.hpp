// Channel: one reliable-connected queue pair to one peer.
//
//   rdmachan::PreparedChannel prepared = rdmachan::ChannelBuilder().max_send_wr(128).build();
//   send_to_peer(prepared.endpoint());                  // any out-of-band exchange
//   rdmachan::Channel channel = std::move(prepared).handshake(endpoint_from_peer);
//   auto region = channel.register_memory(buffer, size, rdmachan::Access::remote_all);
//   rdmachan::WorkResult result = channel.write(region.slice(0, 4096), remote.slice(0, 4096));
//
// Three levels for every operation: blocking calls (`write`), scoped polling
// (`channel.scope([&](rdmachan::Scope& s) { auto w = s.post_write(...); ... })`) and unpolled
// handles (`channel.post_write(...)` returning PendingWork).
//
// Threading: a Channel (and its scopes and handles) is used by one thread at a time, destroying
// them included (a PendingWork keeps the channel's engine alive without an atomic count);
// different channels may be used from different threads. Memory handed to an operation must stay valid and
// unchanged until the operation's completion has been seen (or the handle is destroyed).
#pragma once

#include <nlohmann/json.hpp>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/endpoint.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/handshake.hpp"
#include "rdmachan/memory.hpp"
#include "rdmachan/peer_counters.hpp"
#include "rdmachan/work_batch.hpp"

namespace rdmachan {

namespace detail {
class Engine;
}

// What a peer needs to connect to this channel's queue pair.
struct ChannelEndpoint {
    std::array<std::uint8_t, 16> gid{};
    std::uint16_t lid = 0;
    std::uint32_t qpn = 0;
    std::uint32_t psn = 0;
    std::uint32_t mtu = 1024;  // bytes
    std::string device;        // e.g. "soft:127.0.0.1:4711", for messages
};

void to_json(nlohmann::json& json, const ChannelEndpoint& endpoint);
void from_json(const nlohmann::json& json, ChannelEndpoint& endpoint);  // throws rdmachan::Error naming the field

// How a wait for a completion lets time pass once a poll found nothing.
//   spin:     polls `spin_polls` times, yields the core for `yield_polls` more, then sleeps
//             `sleep` between polls until the deadline.
//   adaptive: polls `spin_polls` times, then arms the channel and sleeps on its completion event
//             (native_handle) until a completion comes or the deadline passes.
//   event:    arms and sleeps on the event as soon as a poll finds nothing.
// Where the device gives no completion events (Channel::native_handle() is -1), adaptive and
// event waits behave as spin.
enum class WaitMode : std::uint8_t { spin, adaptive, event };
const char* to_string(WaitMode mode);

// CQE compression (ConnectX): consecutive completions of the same kind arrive as one title CQE
// and arrays of 8-byte mini CQEs, fewer bytes for the NIC to write per completion. The value
// names what a receive's mini CQE carries besides its byte count (mlx5dv's
// cqe_comp_res_format): the RX hash result, the checksum, or the checksum and stride index.
// None of it reaches a completion; it matters only in that a device may support some formats
// and not others. A device without compression, or without the format, refuses it by name
// when the channel is built.
enum class CqeCompression : std::uint8_t { off, hash, checksum, checksum_stride_index };
const char* to_string(CqeCompression compression);

struct ChannelSettings {
    // auto (RDMACHAN_DEVICE, else an mlx5 device, another verbs device, the software device)
    // | soft | a verbs device name such as mlx5_0 or rxe0
    std::string device = "auto";
    std::uint32_t cq_entries = 256;
    std::uint32_t max_send_wr = 128;
    std::uint32_t max_recv_wr = 128;
    std::uint32_t max_send_sge = 1;
    std::uint32_t max_recv_sge = 1;
    std::uint32_t max_inline_data = 64;
    std::uint32_t mtu = 4096;          // the lower of both sides' is used
    std::uint8_t ack_timeout = 17;     // 4.096 us * 2^ack_timeout per try
    std::uint8_t retry_count = 7;      // 7 retries, then the QP fails (soft-RoCE: 6, as it never stops at 7)
    std::uint8_t rnr_retry = 7;        // 7 = retry forever
    std::uint8_t min_rnr_timer = 12;   // verbs encoding: 12 = 0.64 ms
    std::uint8_t max_rd_atomic = 1;
    std::optional<std::uint32_t> psn;  // random when not set
    std::uint8_t port = 1;
    std::optional<std::uint8_t> gid_index;  // the port's best GID when not set (RoCE v2 IPv4 first)
    Access access = Access::remote_all;
    std::chrono::milliseconds deadline{10000};  // every wait, and each scope's drain
    // How a wait for a completion behaves: spin `spin_polls` polls, then yield the core for the
    // next `yield_polls`, then sleep `sleep` between polls (so many processes share few cores).
    std::uint32_t spin_polls = 64;
    std::uint32_t yield_polls = 192;
    std::chrono::microseconds sleep{50};
    WaitMode wait = WaitMode::adaptive;
    // Completion formats that save the NIC writes (both off by default; a device that cannot
    // give them refuses them by name when the channel is built). A builder made without settings
    // takes cqe_compression from RDMACHAN_CQE_COMPRESSION (off, hash, checksum,
    // checksum_stride_index) when it is set.
    CqeCompression cqe_compression = CqeCompression::off;
    // Scatter-to-CQE on the RC queue pairs: a received message of up to 32 bytes, and an RDMA
    // read's or an atomic's response of up to 32, arrive inside the CQE and are copied to the
    // buffers when the completion is polled, saving a DMA write. DC modes refuse it. A builder
    // made without settings takes it from RDMACHAN_SCATTER_TO_CQE (0 or 1) when it is set.
    bool scatter_to_cqe = false;
};

struct WorkCompletion {
    std::uint32_t bytes = 0;
    std::optional<std::uint32_t> immediate;
};

// The outcome of one operation: a completion, or the error that names what failed.
class WorkResult {
public:
    // A success, as success(completion) makes it; public so that it can be built in place
    // (std::optional<WorkResult>(std::in_place, completion): PendingWork::poll's result).
    explicit WorkResult(WorkCompletion completion) : completion_(completion) {}
    static WorkResult success(WorkCompletion completion) { return WorkResult(completion); }
    static WorkResult failure(WorkError error) { return WorkResult(std::move(error)); }
    bool ok() const { return !error_.has_value(); }
    explicit operator bool() const { return ok(); }
    const WorkCompletion& completion() const { return completion_; }
    const WorkError& error() const { return *error_; }

private:
    explicit WorkResult(WorkError error) : error_(std::move(error)) {}
    WorkCompletion completion_;
    std::optional<WorkError> error_;
};

// One posted operation whose completion has not been taken yet. Its destructor waits for the
// completion under the channel's deadline; if that passes, the QP is moved to ERR so the NIC
// lets go of the buffers.
class PendingWork {
public:
    PendingWork() = default;
    PendingWork(PendingWork&& other) noexcept;
    PendingWork& operator=(PendingWork&& other) noexcept;
    ~PendingWork();

    // Waits for the completion (at most the deadline) and returns it. Once only.
    WorkResult wait();
    WorkResult wait(std::chrono::milliseconds deadline);
    // The completion if it is there already (polls once); nothing otherwise.
    std::optional<WorkResult> poll();
    // Ends it without waiting, for shutting down with work outstanding: the completion if it is
    // there, else its peer's queue pair is moved to ERR and flushed (that peer's other
    // operations fail too), so the device holds none of the memory, and the result is the
    // flush's. Once only, like wait().
    WorkResult flush();
    bool pending() const { return engine_ != nullptr; }
    Operation operation() const { return operation_; }

private:
    friend class Channel;
    friend class Scope;
    friend class MultiChannel;
    friend class MultiScope;
    std::uint64_t release_ticket();  // the scope takes over the completion
    // Holds the engine by a counted plain pointer (src/engine.hpp, Engine::add_handle): a
    // shared_ptr cost an atomic increment and decrement per operation. Defined in the library.
    inline PendingWork(detail::Engine* engine, std::uint64_t ticket, Operation operation) noexcept;
    detail::Engine* engine_ = nullptr;
    std::uint64_t ticket_ = 0;
    Operation operation_ = Operation::send;
};

class Channel;

// One operation posted in a scope: a small value (copy it freely) naming the operation's
// completion, which the channel caches by work-request id until it is taken.
class ScopedWork {
public:
    ScopedWork() = default;
    // Waits for the completion (at most the channel's deadline) and takes it. Once only; a
    // second call throws rdmachan::Error.
    WorkResult wait();
    // Takes the completion if it is there (polls once); nothing otherwise.
    std::optional<WorkResult> poll();

private:
    friend class Scope;
    friend class MultiScope;
    ScopedWork(std::shared_ptr<detail::Engine> core, std::uint64_t ticket) : core_(std::move(core)), ticket_(ticket) {}
    std::shared_ptr<detail::Engine> core_;
    std::uint64_t ticket_ = 0;
};

// Work posted inside Channel::scope. Its handles may be waited for in any order; whatever is
// still pending when the scope ends is drained then, also when the scope's function throws.
class Scope {
public:
    ScopedWork post_send(const LocalSlice& local, std::optional<std::uint32_t> immediate = std::nullopt);
    ScopedWork post_receive(const LocalSlice& local);
    ScopedWork post_write(const LocalSlice& local, const RemoteMemoryRegion& remote,
                          std::optional<std::uint32_t> immediate = std::nullopt);
    ScopedWork post_read(const LocalSlice& local, const RemoteMemoryRegion& remote);
    ScopedWork post_fetch_and_add(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add);
    ScopedWork post_compare_and_swap(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t compare,
                                     std::uint64_t swap);
    ScopedWork post_batch(const WorkBatch& batch);

private:
    friend class Channel;
    Scope(Channel& channel, std::uint32_t id) : channel_(channel), id_(id) {}
    ScopedWork adopt(PendingWork work);
    Channel& channel_;
    std::uint32_t id_;
};

class Channel {
public:
    Channel(Channel&&) noexcept;
    Channel& operator=(Channel&&) noexcept;
    ~Channel();

    MemoryRegion register_memory(void* data, std::size_t length, Access access = Access::remote_all);
    // `length` zeroed bytes that the library allocates and registers: the region owns them, and
    // they are freed when its last copy goes (data() is where they lie). Use it for buffers
    // peers write: on the software device it is memory that peers on the same host map, so
    // their RDMA writes into it are a memcpy with no system call (transport/soft/README.md,
    // "Allocated memory"); on a NIC it is whole pages registered as register_memory does.
    MemoryRegion allocate_memory(std::size_t length, Access access = Access::remote_all);
    // A memory layout as one zero-based region (memory.hpp MemoryLayout): the local side of any
    // operation through slice()/all(), the peer's through remote(). Needs mlx5 UMR (a ConnectX
    // or the software device); throws rdmachan::Error naming the device or the field, or the
    // device's refusal (a slice's region lacking a right `access` grants). The first layout
    // creates a queue pair of the channel's own, connected to itself, that carries the UMR work
    // requests, so a refused one never touches the peer's.
    MemoryRegion register_layout(const MemoryLayout& layout, Access access = Access::remote_all);

    // Blocking: post, wait, return the completion or the error.
    WorkResult send(const LocalSlice& local, std::optional<std::uint32_t> immediate = std::nullopt);
    WorkResult receive(const LocalSlice& local);
    WorkResult write(const LocalSlice& local, const RemoteMemoryRegion& remote,
                     std::optional<std::uint32_t> immediate = std::nullopt);
    WorkResult read(const LocalSlice& local, const RemoteMemoryRegion& remote);
    WorkResult fetch_and_add(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add);
    WorkResult compare_and_swap(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t compare,
                                std::uint64_t swap);

    // Unpolled: the caller owns the handle (and the buffers' lifetime until its completion).
    PendingWork post_send(const LocalSlice& local, std::optional<std::uint32_t> immediate = std::nullopt);
    PendingWork post_receive(const LocalSlice& local);
    PendingWork post_write(const LocalSlice& local, const RemoteMemoryRegion& remote,
                           std::optional<std::uint32_t> immediate = std::nullopt);
    PendingWork post_read(const LocalSlice& local, const RemoteMemoryRegion& remote);
    PendingWork post_fetch_and_add(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add);
    PendingWork post_compare_and_swap(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t compare,
                                      std::uint64_t swap);

    // Batches: one doorbell for all, one completion for the batch (see work_batch.hpp). A batch
    // may hold at most max_send_wr operations (rdmachan::Error otherwise, before anything is
    // posted).
    PendingWork post_batch(const WorkBatch& batch);
    WorkResult execute(const WorkBatch& batch);

    // Scoped polling. Everything still pending when `body` returns or throws is drained under the
    // deadline; if the deadline passes, the QP is moved to ERR and flushed, and rdmachan::Error
    // says so (after `body`'s own exception, if any, which is rethrown instead).
    void scope(const std::function<void(Scope&)>& body);
    // Like scope, but work left unpolled is an error (reported after draining it).
    void manual_scope(const std::function<void(Scope&)>& body);

    const ChannelEndpoint& local_endpoint() const;
    const ChannelEndpoint& remote_endpoint() const;
    std::string peer() const;  // how errors name the peer
    bool healthy() const;      // false once the QP is in ERR
    PeerCounters counters() const;
    std::string device_name() const;
    // For a thread that waits for memory a peer writes (a one-sided write's target), between its
    // looks at that memory: on the software device, reads and handles what came over TCP on this
    // thread, so the frame needs no wake-up of the device's own thread (its waits for
    // completions do this already); a NIC needs nothing, and it returns false at once. Never
    // blocks; true if it handled something.
    bool progress();
    // Completion events, for an event loop: a descriptor that becomes readable when a completion
    // may be waiting (epoll, poll, Boost.Asio's posix::stream_descriptor). Readable only after
    // arm(): arm() returns false when completions are already waiting (poll or wait for your
    // work first; nothing was armed), true when the descriptor will become readable at the
    // channel's next completion. Then poll your work, and arm again before the next sleep. -1
    // where the device gives no events (a CQ whose completion channel could not be made). What a
    // wake costs:
    //   software device: one eventfd write by the thread that writes the CQE (the device's, or a
    //     same-host peer's on the zero-hop path); the arm is a few stores, and one read per CQ
    //     that raised an event;
    //   ConnectX (mlx5 direct path): the NIC's interrupt and the completion channel; the arm is
    //     the data path's doorbell-record store and UAR write (no system call), and taking an
    //     event is one read (ibv_get_cq_event), acknowledged in batches;
    //   other verbs devices: the same, but the arm is an ibv_req_notify_cq system call per CQ.
    int native_handle();
    bool arm();

    // A region the peer published under `name` (only after PreparedChannel::connect);
    // rdmachan::Error naming it if the peer published none.
    RemoteMemoryRegion remote_region(const std::string& name) const;

private:
    friend class PreparedChannel;
    friend class Scope;
    explicit Channel(std::shared_ptr<detail::Engine> core);
    void run_scope(const std::function<void(Scope&)>& body, bool strict);
    std::shared_ptr<detail::Engine> core_;
    std::map<std::string, RemoteRegion> remote_regions_;
};

class PreparedChannel {
public:
    PreparedChannel(PreparedChannel&&) noexcept;
    PreparedChannel& operator=(PreparedChannel&&) noexcept;
    ~PreparedChannel();

    const ChannelEndpoint& endpoint() const;
    MemoryRegion register_memory(void* data, std::size_t length, Access access = Access::remote_all);
    // Memory the library allocates and registers (see Channel::allocate_memory).
    MemoryRegion allocate_memory(std::size_t length, Access access = Access::remote_all);
    // Connects to the peer's endpoint (INIT → RTR → RTS). Loopback: pass endpoint() itself.
    Channel handshake(const ChannelEndpoint& remote) &&;

    // The out-of-band exchange shipped with the library: one side listens, the other connects
    // (PairwiseSettings), both prove the job token, and the versioned endpoints cross over TCP.
    // Regions published with publish_region travel along; read them with
    // Channel::remote_region. The listener is rank 0, the connector rank 1. connect() returns
    // on neither side before both queue pairs are in RTR (the exchange waits for it), so the
    // channel can be used at once. Unlike handshake(), which connects this side only: over
    // an exchange of its own, the application must not send before the peer has connected.
    void publish_region(const std::string& name, const MemoryRegion& region);
    Endpoint versioned_endpoint(std::uint32_t rank) const;
    Channel connect(const PairwiseSettings& settings) &&;

private:
    friend class ChannelBuilder;
    explicit PreparedChannel(std::shared_ptr<detail::Engine> core);
    std::shared_ptr<detail::Engine> core_;
    std::uint64_t session_ = 0;
    std::map<std::string, RemoteRegion> published_;
};

// Named settings with defaults; each setter checks its range and throws rdmachan::Error naming
// the setting and the value.
class ChannelBuilder {
public:
    // The defaults, with the settings a deployment may set in the environment
    // (RDMACHAN_CQE_COMPRESSION, RDMACHAN_SCATTER_TO_CQE); throws Error naming the variable for a
    // value that names nothing.
    ChannelBuilder();
    explicit ChannelBuilder(ChannelSettings settings);

    ChannelBuilder& device(std::string name);
    ChannelBuilder& cq_entries(std::uint32_t value);
    ChannelBuilder& max_send_wr(std::uint32_t value);
    ChannelBuilder& max_recv_wr(std::uint32_t value);
    ChannelBuilder& max_send_sge(std::uint32_t value);
    ChannelBuilder& max_recv_sge(std::uint32_t value);
    ChannelBuilder& max_inline_data(std::uint32_t value);
    ChannelBuilder& mtu(std::uint32_t bytes);
    ChannelBuilder& ack_timeout(std::uint8_t value);
    ChannelBuilder& retry_count(std::uint8_t value);
    ChannelBuilder& rnr_retry(std::uint8_t value);
    ChannelBuilder& min_rnr_timer(std::uint8_t value);
    ChannelBuilder& max_rd_atomic(std::uint8_t value);
    ChannelBuilder& psn(std::uint32_t value);
    ChannelBuilder& port(std::uint8_t value);
    ChannelBuilder& gid_index(std::uint8_t value);
    ChannelBuilder& access(Access value);
    ChannelBuilder& deadline(std::chrono::milliseconds value);
    // Waiting: polls spent spinning, then yielding, then the sleep between polls (0 to 10 ms).
    ChannelBuilder& backoff(std::uint32_t spin_polls, std::uint32_t yield_polls, std::chrono::microseconds sleep);
    ChannelBuilder& wait_mode(WaitMode mode);
    ChannelBuilder& cqe_compression(CqeCompression value);
    ChannelBuilder& scatter_to_cqe(bool value);

    const ChannelSettings& settings() const { return settings_; }
    PreparedChannel build() const;

private:
    ChannelSettings settings_;
};

}  // namespace rdmachan
