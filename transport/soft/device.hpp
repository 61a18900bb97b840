// The software mlx5 device: the stand-in for a ConnectX wherever no RDMA NIC exists. It
// allocates the real mlx5 ring layouts (send and receive queues, SRQs, CQs, doorbell records),
// executes the WQE bytes the mlx5 data path writes, and writes CQEs as the hardware does.
// Devices talk to each other over TCP, so peers can be processes on one host or on several.
// See transport/soft/README.md for what it enforces and how it differs from a ConnectX.
//
// Ownership: every object holds its parent (device, protection domain) alive, so children
// can never outlive parents. Control-plane calls may come from any thread; the data path
// (writing WQEs, ring_send_doorbell, polling CQEs) takes no lock.
#pragma once

#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>

#include "transport/mlx5/rings.hpp"

namespace rdmachan::soft {

class DeviceCore;
struct QueuePairContext;

// A control-plane failure: the message names the call, the object and the value.
class SoftDeviceError : public std::runtime_error {
public:
    using std::runtime_error::runtime_error;
};

enum AccessFlag : std::uint32_t {
    kLocalWrite = 1u << 0,
    kRemoteWrite = 1u << 1,
    kRemoteRead = 1u << 2,
    kRemoteAtomic = 1u << 3,
};

enum class QueuePairState : std::uint8_t { reset, init, ready_to_receive, ready_to_send, error };
const char* to_string(QueuePairState state);

struct DeviceOptions {
    std::string address = "127.0.0.1";  // IPv4 address the device listens on
    std::uint16_t port = 0;              // 0: any free port
};

class Device;

class ProtectionDomain {
public:
    ~ProtectionDomain();
    ProtectionDomain(const ProtectionDomain&) = delete;
    ProtectionDomain& operator=(const ProtectionDomain&) = delete;
    std::uint32_t handle() const { return handle_; }
    const std::shared_ptr<Device>& device() const { return device_; }

private:
    friend class Device;
    ProtectionDomain(std::shared_ptr<Device> device, std::uint32_t handle) : device_(std::move(device)), handle_(handle) {}
    std::shared_ptr<Device> device_;
    std::uint32_t handle_;
};

class MemoryRegion {
public:
    // Deregisters now. Throws SoftDeviceError naming the key and the process when a live peer
    // still holds the region in a zero-hop write after the deadline (stopped between its check
    // and its write); the region then stays registered and the call may be repeated (as
    // ibv_dereg_mr's EBUSY). Never returns while a peer may still write the region. Memory from
    // allocate_memory goes back to the arena only when this object goes.
    void deregister();
    // Deregisters if deregister() did not; it cannot fail, so a peer still holding the region
    // after the deadline is logged as an error (published_table.hpp).
    ~MemoryRegion();
    MemoryRegion(const MemoryRegion&) = delete;
    MemoryRegion& operator=(const MemoryRegion&) = delete;
    std::uint64_t addr() const { return addr_; }
    std::size_t length() const { return length_; }
    std::uint32_t lkey() const { return key_; }
    std::uint32_t rkey() const { return key_; }

private:
    friend class Device;
    MemoryRegion(std::shared_ptr<ProtectionDomain> domain, std::uint64_t addr, std::size_t length, std::uint32_t key,
                 std::uint64_t arena_offset)
        : domain_(std::move(domain)), addr_(addr), length_(length), key_(key), arena_offset_(arena_offset) {}
    // Gives an arena region's memory back to the arena, once no peer can write it any more.
    void release_memory();
    // Withdraws the key and waits for peers' zero-hop writes: 0, or the pid of a live holder at
    // the deadline (then the region is published again when restore_when_busy).
    std::uint32_t withdraw(bool restore_when_busy);
    std::shared_ptr<ProtectionDomain> domain_;
    std::uint64_t addr_;
    std::size_t length_;
    std::uint32_t key_;
    std::uint64_t arena_offset_;  // where the memory lies in the device's arena, plus 1; 0: the caller's memory
    bool deregistered_ = false;
};

// An indirect memory key (mlx5dv_create_mkey with MLX5DV_MKEY_INIT_ATTR_FLAGS_INDIRECT): free
// until a UMR WQE on a send queue of its protection domain gives it a layout
// (indirect_keys.cpp). lkey = rkey = index << 8, tag 0, as libmlx5 creates it.
class IndirectKey {
public:
    ~IndirectKey();
    IndirectKey(const IndirectKey&) = delete;
    IndirectKey& operator=(const IndirectKey&) = delete;
    std::uint32_t lkey() const { return key_; }
    std::uint32_t rkey() const { return key_; }
    // The entries it holds: what was asked for, rounded up to a multiple of 4.
    std::uint32_t max_entries() const { return max_entries_; }

private:
    friend class Device;
    IndirectKey(std::shared_ptr<ProtectionDomain> domain, std::uint32_t key, std::uint32_t max_entries)
        : domain_(std::move(domain)), key_(key), max_entries_(max_entries) {}
    std::shared_ptr<ProtectionDomain> domain_;
    std::uint32_t key_;
    std::uint32_t max_entries_;
};

// The most entries an indirect key of the software device may be created for.
inline constexpr std::uint32_t kMaxIndirectEntries = 4096;

class CompletionQueue {
public:
    ~CompletionQueue();
    CompletionQueue(const CompletionQueue&) = delete;
    CompletionQueue& operator=(const CompletionQueue&) = delete;
    const mlx5::CompletionQueueRing& ring() const { return ring_; }
    std::uint32_t cqn() const { return ring_.cqn; }
    // True once the device had to drop a CQE because the consumer fell a whole ring behind.
    bool overrun() const;
    // Completion events, as a completion channel gives them: the descriptor (an eventfd) becomes
    // readable when the CQ, armed, gets a CQE it was armed for. The consumer arms it with the
    // mlx5 data path's arm (the doorbell record's arm word, then the CQ doorbell on ring().uar)
    // and then calls ring_arm_doorbell(): the moment the NIC would see the register write. One
    // arm raises at most one event, at once if a CQE it wakes for is already past the arm's
    // consumer index. Lock-free; same-host peers that write CQEs into this CQ raise it too.
    int event_descriptor() const { return event_descriptor_; }
    void ring_arm_doorbell();
    // Takes the event if one was raised (the descriptor is then no longer readable, until the
    // next): ibv_get_cq_event and ibv_ack_cq_events in one. Never blocks.
    bool take_event();

private:
    friend class Device;
    CompletionQueue(std::shared_ptr<Device> device, const mlx5::CompletionQueueRing& ring, int event_descriptor)
        : device_(std::move(device)), ring_(ring), event_descriptor_(event_descriptor) {}
    std::shared_ptr<Device> device_;
    mlx5::CompletionQueueRing ring_;
    int event_descriptor_;  // owned by the device's context of this CQ
};

class SharedReceiveQueue {
public:
    ~SharedReceiveQueue();
    SharedReceiveQueue(const SharedReceiveQueue&) = delete;
    SharedReceiveQueue& operator=(const SharedReceiveQueue&) = delete;
    const mlx5::SharedReceiveQueueRing& ring() const { return ring_; }
    std::uint32_t srqn() const { return ring_.srqn; }
    // The free list as the creator leaves it: head 0, tail = the last WQE (never posted).
    std::uint32_t initial_tail() const { return ring_.wqe_count - 1; }

private:
    friend class Device;
    SharedReceiveQueue(std::shared_ptr<ProtectionDomain> domain, const mlx5::SharedReceiveQueueRing& ring)
        : domain_(std::move(domain)), ring_(ring) {}
    std::shared_ptr<ProtectionDomain> domain_;
    mlx5::SharedReceiveQueueRing ring_;
};

struct QueuePairCapabilities {
    std::uint32_t max_send_wr = 64;
    std::uint32_t max_recv_wr = 64;
    std::uint32_t max_send_sge = 1;
    std::uint32_t max_recv_sge = 1;
    std::uint32_t max_inline_data = 0;
};

struct QueuePairInit {
    std::shared_ptr<CompletionQueue> send_cq;
    std::shared_ptr<CompletionQueue> recv_cq;
    std::shared_ptr<SharedReceiveQueue> srq;  // optional: receives come from the SRQ
    QueuePairCapabilities capabilities;
    std::uint32_t user_index = 0;  // written into every CQE's srqn_uidx (CQE version 1)
    // RC only: small received sends, and small answers to signaled reads and atomics, go into
    // the CQE (scatter-to-CQE, as mlx5dv_create_qp allows it), the rest into the buffers.
    bool scatter_to_cqe = false;
};

// Where a remote queue pair lives: the device's GID (IPv4-mapped, names the host) and LID (the
// device's TCP port), and the QP number.
struct RemoteQueuePair {
    std::array<std::uint8_t, 16> gid{};
    std::uint16_t lid = 0;
    std::uint32_t qpn = 0;
};

struct ReadyToReceiveAttributes {
    RemoteQueuePair remote;
    std::uint32_t rq_psn = 0;
    std::uint32_t path_mtu_bytes = 1024;
    std::uint8_t max_dest_rd_atomic = 1;
    std::uint8_t min_rnr_timer = 12;  // verbs encoding (12 = 0.64 ms)
};

struct ReadyToSendAttributes {
    std::uint32_t sq_psn = 0;
    std::uint8_t timeout = 14;     // 4.096 us * 2^timeout per try; 0 = wait forever
    std::uint8_t retry_cnt = 7;
    std::uint8_t rnr_retry = 7;    // 7 = retry forever
    std::uint8_t max_rd_atomic = 1;
};

class QueuePair {
public:
    ~QueuePair();
    QueuePair(const QueuePair&) = delete;
    QueuePair& operator=(const QueuePair&) = delete;

    std::uint32_t qpn() const { return send_ring_.qpn; }
    const mlx5::SendQueueRing& send_ring() const { return send_ring_; }
    const mlx5::ReceiveQueueRing& receive_ring() const { return receive_ring_; }
    std::uint32_t max_send_sge() const { return capabilities_.max_send_sge; }
    std::uint32_t max_inline_data() const { return capabilities_.max_inline_data; }

    void modify_to_init(std::uint8_t port_num, std::uint32_t access_flags);
    void modify_to_ready_to_receive(const ReadyToReceiveAttributes& attributes);
    void modify_to_ready_to_send(const ReadyToSendAttributes& attributes);
    void modify_to_error();
    void modify_to_reset();
    QueuePairState state() const;

    // The soft equivalent of the NIC seeing the doorbell register write: call it right after
    // the data path rang the doorbell. Lock-free; wakes the device only if it sleeps.
    void ring_send_doorbell();

private:
    friend class Device;
    QueuePair(std::shared_ptr<ProtectionDomain> domain, QueuePairInit init, const mlx5::SendQueueRing& send_ring,
              const mlx5::ReceiveQueueRing& receive_ring, const QueuePairCapabilities& capabilities)
        : domain_(std::move(domain)),
          init_(std::move(init)),
          send_ring_(send_ring),
          receive_ring_(receive_ring),
          capabilities_(capabilities) {}
    std::shared_ptr<ProtectionDomain> domain_;
    DeviceCore* core_ = nullptr;
    std::atomic<bool>* doorbell_pending_ = nullptr;  // owned by the device's QP context
    QueuePairContext* context_ = nullptr;            // lives as long as this object
    QueuePairInit init_;  // keeps the CQs and SRQ alive as long as the QP
    mlx5::SendQueueRing send_ring_;
    mlx5::ReceiveQueueRing receive_ring_;
    QueuePairCapabilities capabilities_;
};

// A DC initiator (DCI): a queue pair with a send queue only, whose every WQE carries the
// address vector of the DC target it goes to (mlx5-facts.md §1-2). One DCI talks to many
// DCTs one after another; it keeps its WQEs in order.
struct DcInitiatorInit {
    std::shared_ptr<CompletionQueue> send_cq;
    QueuePairCapabilities capabilities;  // the receive fields are ignored: a DCI has no receive queue
    std::uint32_t user_index = 0;
};

class DcInitiator {
public:
    ~DcInitiator();
    DcInitiator(const DcInitiator&) = delete;
    DcInitiator& operator=(const DcInitiator&) = delete;

    std::uint32_t qpn() const { return send_ring_.qpn; }
    const mlx5::SendQueueRing& send_ring() const { return send_ring_; }
    std::uint32_t max_send_sge() const { return capabilities_.max_send_sge; }
    std::uint32_t max_inline_data() const { return capabilities_.max_inline_data; }

    void modify_to_init(std::uint8_t port_num, std::uint32_t access_flags);
    // A DCI's RTR names no remote: every WQE carries its destination.
    void modify_to_ready_to_receive(std::uint32_t path_mtu_bytes = 1024);
    void modify_to_ready_to_send(const ReadyToSendAttributes& attributes);
    void modify_to_error();
    // Back to RESET, as on hardware: nothing outstanding, producer and consumer at WQEBB 0.
    // CQEs already written stay in the CQ; purging them is the consumer's job.
    void modify_to_reset();
    QueuePairState state() const;

    void ring_send_doorbell();

private:
    friend class Device;
    DcInitiator(std::shared_ptr<ProtectionDomain> domain, DcInitiatorInit init, const mlx5::SendQueueRing& send_ring)
        : domain_(std::move(domain)), init_(std::move(init)), send_ring_(send_ring), capabilities_(init_.capabilities) {}
    std::shared_ptr<ProtectionDomain> domain_;
    DeviceCore* core_ = nullptr;
    std::atomic<bool>* doorbell_pending_ = nullptr;
    QueuePairContext* context_ = nullptr;  // owned by the device core, which outlives this DCI
    DcInitiatorInit init_;
    mlx5::SendQueueRing send_ring_;
    QueuePairCapabilities capabilities_;
};

// A DC target (DCT): receives from any DCI that names its number and its access key. Receives
// go through its SRQ and complete on its receive CQ.
struct DcTargetInit {
    std::shared_ptr<SharedReceiveQueue> srq;
    std::shared_ptr<CompletionQueue> recv_cq;
    std::shared_ptr<CompletionQueue> send_cq;  // optional; a DCT never sends (UCX passes one anyway)
    std::uint32_t access_flags = 0;
    std::uint64_t dc_access_key = 0;
    std::uint32_t user_index = 0;
};

struct DcTargetReadyAttributes {
    std::uint32_t path_mtu_bytes = 1024;
    std::uint8_t min_rnr_timer = 12;  // verbs encoding
};

class DcTarget {
public:
    ~DcTarget();
    DcTarget(const DcTarget&) = delete;
    DcTarget& operator=(const DcTarget&) = delete;

    void modify_to_init(std::uint8_t port_num);
    void modify_to_ready_to_receive(const DcTargetReadyAttributes& attributes);
    QueuePairState state() const;
    // The DCT number: throws SoftDeviceError before RTR, as the number exists only from then on.
    std::uint32_t dctn() const;
    // Requests refused for a wrong DC key (the dctc's dc_access_key_violation_count).
    std::uint32_t key_violations() const;

private:
    friend class Device;
    DcTarget(std::shared_ptr<ProtectionDomain> domain, DcTargetInit init, std::uint32_t handle)
        : domain_(std::move(domain)), init_(std::move(init)), handle_(handle) {}
    std::shared_ptr<ProtectionDomain> domain_;
    DeviceCore* core_ = nullptr;
    DcTargetInit init_;
    std::uint32_t handle_;  // the device's internal name for it; published as the dctn at RTR
};

class Device : public std::enable_shared_from_this<Device> {
public:
    static std::shared_ptr<Device> open(const DeviceOptions& options = {});
    ~Device();
    Device(const Device&) = delete;
    Device& operator=(const Device&) = delete;

    std::array<std::uint8_t, 16> gid() const;  // ::ffff:a.b.c.d of the listening address
    std::uint16_t lid() const;                 // the listening TCP port
    std::string name() const;                  // "soft:a.b.c.d:port"

    std::shared_ptr<ProtectionDomain> allocate_protection_domain();
    std::shared_ptr<MemoryRegion> register_memory(const std::shared_ptr<ProtectionDomain>& domain, void* addr,
                                                  std::size_t length, std::uint32_t access_flags);
    // `length` zeroed bytes of the device's arena (shared_arena.hpp), registered: memory its
    // same-host peers map, so that their zero-hop writes into it are a memcpy. addr() is where
    // it lies in this process. The memory is the region's: it goes back to the arena once the
    // region is deregistered. nullptr when the arena cannot serve it (no memfd, the reservation
    // is full): the caller then registers memory of its own.
    std::shared_ptr<MemoryRegion> allocate_memory(const std::shared_ptr<ProtectionDomain>& domain, std::size_t length,
                                                  std::uint32_t access_flags);
    // Why the arena refused an allocation (allocate_memory returned nullptr): for a log line.
    std::string arena_refusal() const;
    std::shared_ptr<IndirectKey> create_indirect_key(const std::shared_ptr<ProtectionDomain>& domain,
                                                     std::uint32_t max_entries);
    // `compressed`: the device writes compressed CQE sessions into it (held_completions.hpp) and
    // its ring says so (mlx5::CompletionQueueRing::compressed_cqes), as a CQ created through
    // mlx5dv with MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE.
    std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t entries, std::uint32_t cqe_size = 64,
                                                             bool compressed = false);
    std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(const std::shared_ptr<ProtectionDomain>& domain,
                                                                    std::uint32_t max_wr, std::uint32_t max_sge);
    std::shared_ptr<QueuePair> create_queue_pair(const std::shared_ptr<ProtectionDomain>& domain, QueuePairInit init);
    std::shared_ptr<DcInitiator> create_dc_initiator(const std::shared_ptr<ProtectionDomain>& domain, DcInitiatorInit init);
    std::shared_ptr<DcTarget> create_dc_target(const std::shared_ptr<ProtectionDomain>& domain, DcTargetInit init);
    // The 48-byte base address vector of an address handle naming this device, as
    // mlx5dv_ah.av gives it on hardware: GRH present, rgid = this device's GID, rlid = its LID.
    // make_dc_address_vector adds the DCT number and key.
    std::array<std::uint8_t, 48> address_vector() const;
    // Requests this device, as responder, moved by cross-memory attach (the same-host path):
    // lets tests and tools see which path the payloads took.
    std::uint64_t transfers_by_reference() const;
    // Connections to other devices this device began (when an RC QP reached RTS, in the
    // background, or for a request), those that failed before their hello was answered, and
    // the hellos answered (the path to that device settled): lets tests see when and how a
    // device connects.
    std::uint64_t connects_started() const;
    std::uint64_t connects_failed() const;
    std::uint64_t answered_hellos() const;
    // RDMA writes this device, as initiator, executed zero-hop from the doorbell thread or its
    // progress thread (same host; transport/soft/README.md, "Zero-hop writes").
    std::uint64_t zero_hop_writes() const;
    // Of those, the ones that were a memcpy into the target's arena, with no system call (the
    // target's region came from allocate_memory, and so did the source, or it was inline).
    std::uint64_t zero_hop_arena_writes() const;
    // RDMA reads executed zero-hop, and of those the ones that were memcpys (from the target's
    // arena into this device's).
    std::uint64_t zero_hop_reads() const;
    std::uint64_t zero_hop_arena_reads() const;
    // Compare-and-swap and fetch-and-add executed zero-hop (on the target's arena, by this
    // device's thread).
    std::uint64_t zero_hop_atomics() const;
    // Doorbells of a QP whose remote is zero-hop that the ringing thread left to the progress
    // thread (the device's mutex was taken, or a WQE could not go zero-hop): their CQEs come later.
    std::uint64_t doorbells_left_to_progress() const;
    // Sends and RDMA writes with immediate executed zero-hop, their receive consumed and their
    // CQE written by this device (zero_hop_receive.cpp).
    std::uint64_t zero_hop_receives() const;
    // WQEs this device executed on the thread that rang the doorbell, their requests written to
    // the peer's socket from there (transport/soft/README.md, "Requests from the doorbell thread").
    std::uint64_t requests_from_doorbell() const;
    // ACKs of plain RDMA writes this device, as responder, did not send because the ACK of a
    // later write of the same QP, read from the same socket, acknowledged them too
    // (transport/soft/README.md, "Coalesced acknowledgements").
    std::uint64_t acknowledgements_coalesced() const;
    // Compressed CQE sessions this device wrote, and the CQEs they stood for
    // (transport/soft/held_completions.hpp).
    std::uint64_t compressed_sessions() const;
    std::uint64_t compressed_cqes() const;
    // Lends the calling thread to the device: while frames come over its TCP connections, reads
    // and handles what arrived (transport/soft/README.md, "Progress from the caller's thread").
    // Never blocks; returns how many connections it handled (0 also when another thread is at it).
    int progress();
    // The caller stops calling progress() (it is about to sleep): the progress thread watches the
    // connections again at once instead of when the caller's hold runs out.
    void stop_progress();
    // progress() calls that handled something.
    std::uint64_t caller_progress_turns() const;
    // The pid of a peer whose zero-hop write holds this device's region `key` right now (between
    // its checks and the end of its move), or 0: what a deregistration would wait for.
    std::uint32_t zero_hop_holder(std::uint32_t key) const;
    // The pid holding this device's receive lock now (0: free), and how many times the device
    // took it over from a process that exited holding it (published_table.hpp).
    std::uint32_t receive_lock_holder() const;
    std::uint64_t receive_lock_takeovers() const;

    DeviceCore& core() { return *core_; }

private:
    Device() = default;
    // Registers [addr, addr + length); `call` names the public call in errors.
    std::shared_ptr<MemoryRegion> register_range(const char* call, const std::shared_ptr<ProtectionDomain>& domain, void* addr,
                                                 std::size_t length, std::uint32_t access_flags, std::uint64_t arena_offset);
    std::unique_ptr<DeviceCore> core_;
};

// Fault injection for tests: while on, every software device of this process drops all
// frames to and from other devices (its own loopback traffic and the hello exchange that opens
// a connection still flow), as a network
// partition would: nothing is closed, requests simply go unanswered until the transport
// timeout and retries give up, exactly as a ConnectX reports a peer it cannot reach.
void simulate_partition(bool partitioned) noexcept;
bool partition_simulated() noexcept;

// Fault injection for tests: holds every zero-hop write of this process this long between its
// checks against the target's table and its move, so that a test can deregister the key or kill
// the target in between (0: no delay, the default).
void delay_zero_hop_writes(std::chrono::microseconds delay) noexcept;

// Fault injection for tests: where a zero-hop receive of this process stops, under the target's
// receive lock, so that a test can kill the process there (published_table.hpp: the journal).
// With `reached_descriptor`, one byte 'h' is written to it when a receive stops there.
enum class ZeroHopReceiveStep : std::uint8_t {
    none,
    journal_written,     // before the receive is consumed
    receive_consumed,    // before its CQE is written
    completion_visible,  // the CQE's owner byte published, the CQ's producer index not yet moved
};
void hold_zero_hop_receives(ZeroHopReceiveStep step, std::chrono::microseconds delay, int reached_descriptor = -1) noexcept;

// Fault injection for tests: every request this process's device performs that consumes a
// receive (send, write with immediate) stops this long after its answer left and before its CQE
// is written, so that a test can kill the responder there (responder.cpp says why the answer
// comes first). With `reached_descriptor`, one byte 'h' is written to it when one stops there.
void hold_responder_completions(std::chrono::microseconds delay, int reached_descriptor = -1) noexcept;

// For a process that learned out of band (shared memory, a socket) that peers' RDMA writes into
// its memory are complete: makes them happen-before what follows for ThreadSanitizer, which
// cannot see causality that runs through another process and the network. The device thread
// releases after every request it performs (note_remote_access); this acquires. Hardware needs
// nothing like it (its writes are DMA, not a thread), and data-path completions already carry
// the ordering; tests that meet through a side channel call it before reading.
void acquire_remote_writes() noexcept;
void note_remote_access() noexcept;

}  // namespace rdmachan::soft
