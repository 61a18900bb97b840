// What the channel core needs from a device, whatever executes it: the software mlx5 device, a
// ConnectX driven through the mlx5 direct data path, or any verbs NIC through libibverbs.
// Providers implement it (transport/provider); the channel core never names a provider.
//
// Cost rule for the data path: one indirect call per posted batch and per poll; nothing here
// allocates, locks or throws once a queue pair exists. Control-plane calls throw
// rdmachan::Error naming the call, the object and the value.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "transport/mlx5/completion.hpp"
#include "transport/mlx5/work_request.hpp"

namespace rdmachan::transport {

using Gid = std::array<std::uint8_t, 16>;

// Registration and queue-pair access rights, the same bits as rdmachan::Access.
enum AccessBit : std::uint32_t {
    kAccessLocalWrite = 1u << 0,
    kAccessRemoteWrite = 1u << 1,
    kAccessRemoteRead = 1u << 2,
    kAccessRemoteAtomic = 1u << 3,
};

enum class DeviceKind : std::uint8_t { soft, mlx5, verbs };
const char* to_string(DeviceKind kind) noexcept;

// The local port as a peer must address it.
struct PortIdentity {
    Gid gid{};
    std::uint16_t lid = 0;          // 0 on RoCE
    std::uint32_t active_mtu = 0;   // bytes
    std::uint8_t port = 1;
    std::uint8_t gid_index = 0;
    bool ethernet = true;           // RoCE (global routing always) or InfiniBand
};

// CQE compression and the mini-CQE format of a receive's compressed completions, the values of
// rdmachan::CqeCompression (mlx5dv's cqe_comp_res_format: hash, checksum, checksum and stride
// index).
enum class CqeCompression : std::uint8_t { off, hash, checksum, checksum_stride_index };
const char* to_string(CqeCompression compression) noexcept;

struct QueuePairSettings {
    std::uint32_t max_send_wr = 128;
    std::uint32_t max_recv_wr = 128;
    std::uint32_t max_send_sge = 1;
    std::uint32_t max_recv_sge = 1;
    std::uint32_t max_inline_data = 0;
    std::uint8_t port = 1;
    std::uint32_t access = kAccessLocalWrite | kAccessRemoteWrite | kAccessRemoteRead | kAccessRemoteAtomic;
    // Small received messages and read or atomic responses inside the CQE (mlx5 scatter-to-CQE).
    // A device that cannot give it refuses the queue pair, naming the setting.
    bool scatter_to_cqe = false;
};

// INIT -> RTR -> RTS towards one remote queue pair.
struct ConnectSettings {
    Gid remote_gid{};
    std::uint16_t remote_lid = 0;
    std::uint32_t remote_qpn = 0;
    std::uint32_t remote_psn = 0;  // the first PSN the peer sends with: our receive PSN
    std::uint32_t local_psn = 0;
    std::uint32_t path_mtu = 1024;  // bytes, already negotiated
    std::uint8_t ack_timeout = 17;
    std::uint8_t retry_count = 7;
    std::uint8_t rnr_retry = 7;
    std::uint8_t min_rnr_timer = 12;
    std::uint8_t max_rd_atomic = 1;
    std::uint8_t max_dest_rd_atomic = 1;
    std::uint8_t source_gid_index = 0;  // PortIdentity::gid_index of the local port
};

// A registration: owner keeps it alive; dropping the last owner deregisters.
struct Registration {
    std::shared_ptr<void> owner;
    std::uint32_t lkey = 0;
    std::uint32_t rkey = 0;
    std::uint8_t* data = nullptr;  // allocate_memory: where the memory lies (owner owns it too)
    // Ends the registration now rather than when owner goes (its keys stop working; allocated
    // memory stays until owner goes). Throws rdmachan::Error when the device refuses (the
    // registration then stays: ibv_dereg_mr's EBUSY); again after a refusal, it may succeed.
    // Control path; valid while owner lives.
    std::function<void()> deregister;
};

// An indirect memory key (mlx5 UMR): created free; a configure_memory_key request on
// a queue pair of its protection domain gives it a layout. owner keeps it alive.
struct IndirectKeyRegistration {
    std::shared_ptr<void> owner;
    std::uint32_t lkey = 0;
    std::uint32_t rkey = 0;
    std::uint32_t max_entries = 0;  // what it holds: the request rounded up to a multiple of 4
};

class CompletionQueue {
public:
    virtual ~CompletionQueue() = default;
    // Fills up to `capacity` completions; wr_id is what the work request carried.
    virtual std::uint32_t poll(mlx5::Completion* completions, std::uint32_t capacity) noexcept = 0;
    virtual std::uint32_t depth() const noexcept = 0;
    // Completion events: a descriptor that becomes readable when the CQ, armed, gets a CQE; -1
    // where the device gives none (post_defaults.cpp).
    virtual int event_descriptor() const noexcept;
    // Arms the CQ for one event, at the next CQE. False, and nothing to wait for, when a
    // completion is already waiting to be polled (or the CQ has no events).
    virtual bool arm() noexcept;
    // Takes the event the CQ raised, if any: the descriptor then waits for the next arm's.
    virtual void take_event() noexcept;
};

class QueuePair {
public:
    virtual ~QueuePair() = default;
    virtual std::uint32_t qpn() const noexcept = 0;
    // Posts requests in order under one doorbell, stopping at the first one refused; *posted
    // says how many were accepted (they will complete even if a later one was refused).
    virtual mlx5::PostResult post_send(const mlx5::SendWorkRequest* requests, std::uint32_t count,
                                       std::uint32_t* posted) noexcept = 0;
    // One request: post_send of one (ok exactly when it was posted). The channel core's single
    // operations call this; a provider may specialise it (the ring family compiles its post for
    // a count of one).
    virtual mlx5::PostResult post_one(const mlx5::SendWorkRequest& request) noexcept;  // post_defaults.cpp
    virtual mlx5::PostResult post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                          std::uint32_t* posted) noexcept = 0;
    // The send queue's capacity in work requests as the device granted it.
    virtual std::uint32_t max_send_wr() const noexcept = 0;
    virtual std::uint32_t max_recv_wr() const noexcept = 0;
    virtual void connect(const ConnectSettings& settings) = 0;
    // Moves the QP to ERR: the device flushes everything it holds with completions.
    virtual void move_to_error() = 0;
};

// DC (mlx5 dynamically connected). A shared receive queue feeds a DC target's receives.
class SharedReceiveQueue {
public:
    virtual ~SharedReceiveQueue() = default;
    virtual mlx5::PostResult post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                          std::uint32_t* posted) noexcept = 0;
};

// A DC target: created in RESET, made ready (INIT -> RTR) once; its number exists only then.
class DcTarget {
public:
    virtual ~DcTarget() = default;
    // On the local `port`: the one the initiators use (ChannelSettings::port).
    virtual void make_ready(std::uint8_t port, std::uint32_t path_mtu, std::uint8_t min_rnr_timer) = 0;
    virtual std::uint32_t number() const = 0;  // throws rdmachan::Error before make_ready
};

class ProtectionDomain {
public:
    virtual ~ProtectionDomain() = default;
    // access: AccessBit values. Throws rdmachan::Error naming the address, length and access.
    virtual Registration register_memory(void* data, std::size_t length, std::uint32_t access) = 0;
    // `length` zeroed bytes of memory the registration owns (freed after its deregistration).
    // The default maps anonymous pages and registers them (memory_defaults.cpp); the software
    // device hands out memory its same-host peers map (transport/soft/shared_arena.hpp).
    virtual Registration allocate_memory(std::size_t length, std::uint32_t access);
    virtual std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth) = 0;
    // The same with CQE compression asked for. The default creates the plain CQ when compression
    // is off and otherwise refuses, naming the setting (completion_format_defaults.cpp); devices
    // that compress override it.
    virtual std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth, CqeCompression compression);
    // The QP is in INIT when returned, so receives may be posted before it connects. The send
    // and receive queues may be one completion queue.
    virtual std::shared_ptr<QueuePair> create_queue_pair(const QueuePairSettings& settings,
                                                         std::shared_ptr<CompletionQueue> send_queue,
                                                         std::shared_ptr<CompletionQueue> receive_queue) = 0;

    // DC. Devices without DC throw rdmachan::Error saying so (the defaults).
    // A DC initiator is a queue pair without receive queue whose requests carry
    // dc_address_vector; connect() takes it INIT -> RTR -> RTS (the remote fields are unused),
    // also again after recover_initiator().
    virtual std::shared_ptr<QueuePair> create_dc_initiator(const QueuePairSettings& settings,
                                                           std::shared_ptr<CompletionQueue> send_queue);
    // Back to RESET with the send queue at producer index 0; the caller has taken every
    // completion of the initiator before, and connects it again after.
    virtual void recover_dc_initiator(QueuePair& initiator);
    virtual std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(std::uint32_t max_wr,
                                                                            std::shared_ptr<CompletionQueue> receive_queue);
    virtual std::shared_ptr<DcTarget> create_dc_target(std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                                       std::shared_ptr<CompletionQueue> receive_queue,
                                                       std::uint64_t access_key, std::uint32_t access);
    // Memory layouts: an indirect key for up to max_entries entries. Devices without UMR throw
    // rdmachan::Error naming the device (the default names none: providers override it).
    virtual IndirectKeyRegistration create_indirect_key(std::uint32_t max_entries);
    // The 48-byte address vector naming a peer's DC target, DCT number and key filled in.
    virtual std::array<std::uint8_t, 48> dc_address_vector(const PortIdentity& local, const Gid& gid, std::uint16_t lid, std::uint32_t dctn,
                                                           std::uint64_t key);
};

class Device {
public:
    virtual ~Device() = default;
    virtual DeviceKind kind() const noexcept = 0;
    virtual std::string name() const = 0;  // "soft:127.0.0.1:4711", "mlx5_0", "rxe0"
    // gid_index: the caller's choice, or the device's best GID for this port when not given.
    virtual PortIdentity port_identity(std::uint8_t port, std::optional<std::uint8_t> gid_index) const = 0;
    virtual std::shared_ptr<ProtectionDomain> allocate_protection_domain() = 0;
    // A thread that waits lends itself to the device: the software device reads and handles what
    // came over its TCP connections (so no thread of its own needs waking); a NIC needs nothing.
    // Never blocks. True if it did something.
    virtual bool progress() noexcept { return false; }
    // The caller will not call progress() for a while (it is about to sleep): the device's own
    // thread takes over at once rather than when the caller's hold runs out.
    virtual void stop_progress() noexcept {}
};

// request: "auto" | "soft" | a verbs device name. "auto" also reads RDMACHAN_DEVICE, then picks
// an mlx5 device, another verbs device, or the software device, and logs which and why.
// A device is opened once per process and shared by everything that asks for it.
std::shared_ptr<Device> open_device(std::string_view request);

}  // namespace rdmachan::transport
