// The software device's inside: object tables, the progress thread and its connections.
// Everything here is guarded by `mutex` except the doorbell flags, which the data path sets
// without a lock.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include <sys/epoll.h>
#include <sys/uio.h>

#include "transport/soft/aligned_buffer.hpp"
#include "transport/soft/completion_ring.hpp"
#include "transport/soft/completion_writer.hpp"
#include "transport/soft/held_completions.hpp"
#include "transport/soft/connection.hpp"
#include "transport/soft/connection_input.hpp"
#include "transport/soft/device.hpp"
#include "transport/soft/device_statistics.hpp"
#include "transport/soft/gid.hpp"
#include "transport/soft/held_acknowledgements.hpp"
#include "transport/soft/indirect_keys.hpp"
#include "transport/soft/peer_links.hpp"
#include "transport/soft/peer_table.hpp"
#include "transport/soft/progress_loop.hpp"
#include "transport/soft/published_table.hpp"
#include "transport/soft/shared_arena.hpp"
#include "transport/soft/reusing_ring.hpp"
#include "transport/soft/same_host.hpp"
#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

using Clock = std::chrono::steady_clock;

struct MemoryRegionState {
    std::uint32_t protection_domain = 0;
    std::uint64_t addr = 0;
    std::uint64_t length = 0;
    std::uint32_t access = 0;
};

struct CompletionQueueContext {
    // The entries, then the 64-byte doorbell block (its records, then the producer index:
    // completion_ring.hpp), in one allocation from the arena when it can be.
    std::unique_ptr<AlignedBuffer> buffer;
    mlx5::CompletionQueueRing ring;
    std::atomic<bool> overrun{false};
    // Set (never cleared) when an RC QP whose receives a peer may complete (zero-hop receives)
    // publishes this CQ as its receive CQ: from then on this device writes its CQEs under the
    // receive lock. Until then it has no other writer, and takes no lock (a locked instruction
    // right after a zero-hop write's store into the peer's memory waits for that store).
    bool peer_writable = false;
    // Created for CQE compression (held_completions.hpp): the ring's compressed_cqes.
    bool compressed = false;
    // Readable once an armed CQ gets a CQE it was armed for (completion_ring.hpp): the soft
    // completion channel. Closed with the context.
    int event_descriptor = -1;
    // The UAR page's CQ doorbell an arm writes (mlx5::CompletionQueueRing::uar, register at 0x20):
    // memory nobody reads, as BlueFlame's; the arm word the device takes is the doorbell record's.
    alignas(64) std::uint8_t uar[64] = {};
    CompletionQueueContext() = default;
    CompletionQueueContext(const CompletionQueueContext&) = delete;
    CompletionQueueContext& operator=(const CompletionQueueContext&) = delete;
    ~CompletionQueueContext();
    CompletionRingView view() const { return CompletionRingView::of(ring, event_descriptor); }
};

struct SharedReceiveQueueContext {
    // The WQEs, and the 64-byte doorbell block (the record, then the consumption word), from the
    // arena when it has room: same-host DC initiators then consume WQEs too (zero_hop_receive.cpp).
    std::unique_ptr<AlignedBuffer> buffer;
    std::unique_ptr<AlignedBuffer> doorbell;
    mlx5::SharedReceiveQueueRing ring;
    std::uint32_t protection_domain = 0;
    // Published through a DCT (PublishedTable::publish_queue_pair): peers consume its WQEs under
    // the receive lock, so the device does too. Under the device mutex.
    bool peer_consumable = false;
    // The consumption word (kReceiveConsumedWord of the doorbell block): the WQE consumed next
    // (following the links) in its high 16 bits, the WQEs consumed (compared with the 16-bit
    // doorbell counter) in its low 16. One word, so a consumer dying between two stores cannot
    // leave half a consumption, and the receive journal tells a consumed WQE by it changing.
    std::uint32_t consumption() const {
        return __atomic_load_n(ring.doorbell_record + kReceiveConsumedWord, __ATOMIC_ACQUIRE);
    }
    std::uint32_t next_index() const { return consumption() >> 16; }
    std::uint16_t consumed() const { return static_cast<std::uint16_t>(consumption()); }
    void set_consumption(std::uint32_t next_index, std::uint16_t consumed) {
        __atomic_store_n(ring.doorbell_record + kReceiveConsumedWord, next_index << 16 | consumed, __ATOMIC_RELEASE);
    }
};

// One request the initiator sent and has not seen answered.
struct InFlight {
    // A slot of the ring of requests in flight comes with room for a few local targets: the
    // doorbell thread decodes reads into its next slot (and may leave them to the progress
    // thread), so a slot's first use must not allocate there.
    InFlight() { local_targets.reserve(4); }
    std::uint32_t psn = 0;
    std::uint16_t wqe_counter = 0;  // the WQE's first WQEBB index
    std::uint8_t opcode = 0;
    bool signaled = false;
    std::vector<std::uint8_t> frame;  // kept for RNR retries
    // Where read data or an atomic result lands (validated when the WQE was executed).
    std::vector<std::pair<std::uint8_t*, std::uint32_t>> local_targets;
    // Each data segment's address is where its bytes go (no indirect key in between): the poller
    // of a scatter-to-CQE completion copies to the addresses the WQE names.
    bool targets_as_posted = true;
    std::uint32_t length = 0;
    // Same host: the frame carries where the payload is (or, for a read, goes) in this process;
    // the responder moves it with cross-memory attach, so a read's response carries no data.
    bool by_reference = false;
};

enum class Transport : std::uint8_t { reliable_connected, dc_initiator, dc_target };

// The initiator side of a DC request, as a DCT tells its initiators apart.
struct DcPeer {
    std::array<std::uint8_t, 16> gid{};
    std::uint16_t lid = 0;
    std::uint32_t qpn = 0;
    auto operator<=>(const DcPeer&) const = default;
};

struct QueuePairContext {
    std::uint32_t qpn = 0;
    Transport transport = Transport::reliable_connected;
    std::uint32_t protection_domain = 0;
    std::uint32_t user_index = 0;
    CompletionQueueContext* send_cq = nullptr;
    CompletionQueueContext* recv_cq = nullptr;
    SharedReceiveQueueContext* srq = nullptr;
    // Created with scatter-to-CQE (inline_scatter.cpp): a small received send, and a small
    // read's or atomic's answer, go into the CQE instead of the buffers.
    bool scatter_to_cqe = false;
    // Receive queue, then send queue (as libmlx5 lays it out); for an RC QP then the 64-byte
    // doorbell block, in one allocation from the arena when it can be.
    std::unique_ptr<AlignedBuffer> buffer;
    std::unique_ptr<AlignedBuffer> doorbell;  // a DCI's doorbell block (dc.cpp); else null
    mlx5::SendQueueRing send_ring;
    mlx5::ReceiveQueueRing receive_ring;
    std::unique_ptr<AlignedBuffer> blueflame;

    QueuePairState state = QueuePairState::reset;
    std::uint32_t access = 0;
    ReadyToReceiveAttributes receive_attributes;
    ReadyToSendAttributes send_attributes;

    std::uint32_t executed = 0;        // WQEBB index the device reads next (16-bit on the wire)
    // Receive WQEs consumed: a word of the doorbell block, which a same-host peer's zero-hop
    // receive also advances, under the receive lock (completion_ring.hpp).
    std::uint32_t receive_consumed() const {
        return __atomic_load_n(receive_ring.doorbell_record + kReceiveConsumedWord, __ATOMIC_ACQUIRE);
    }
    void set_receive_consumed(std::uint32_t consumed) {
        __atomic_store_n(receive_ring.doorbell_record + kReceiveConsumedWord, consumed, __ATOMIC_RELEASE);
    }
    std::uint32_t next_psn = 0;        // initiator
    std::uint32_t expected_psn = 0;    // responder
    ReusingRing<InFlight> in_flight;  // keeps its slots' frames: the doorbell thread allocates nothing
    Clock::time_point retry_at{};      // RNR: when to resend from in_flight.front()
    bool waiting_rnr = false;
    std::uint32_t rnr_retries_left = 0;
    Clock::time_point progress_deadline{};  // when the oldest in-flight request is sent again
    std::uint32_t transport_retries_left = 0;  // resends left before transport retry exceeded
    std::atomic<bool> doorbell_pending{false};
    // Whether the remote QP's device published its table to us (a zero-hop write may be
    // possible): lets the doorbell thread skip the device mutex for every other QP.
    std::atomic<bool> zero_hop_remote{false};
    // A UMR WQE waits for the requests before it to be answered (it completes in order); the
    // last answer rings the doorbell again.
    bool umr_waits_for_answers = false;
    // A zero-hop send or write with immediate was refused for a passing reason (no receive
    // posted, the target's receive lock busy, its CQ full) and took the request path: the WQEs
    // after it wait until the requests in flight are answered, then go zero-hop again. Sent on at
    // once, each would find a request in flight (zero-hop needs none) and take the request path
    // too, and the QP would stay there as long as the application kept a request outstanding
    // (rdmachan-bench's 8 B send bandwidth: 1-3 MB/s in 3 of 14 sweeps, against 11-12). The last
    // answer rings the doorbell again.
    bool zero_hop_waits_for_answers = false;

    // DC initiator: whether the current target (receive_attributes.remote) has seen this DCI's
    // first request since it switched to it, so the next request carries the connect mark.
    bool dc_connected = false;
    // DC target: its key, how many requests a wrong key refused, and the PSN expected next
    // from each initiator connected to it.
    std::uint64_t dc_access_key = 0;
    std::uint32_t dc_key_violations = 0;
    std::map<DcPeer, std::uint32_t> dc_expected_psn;
};

// Where a zero-hop request goes: a same-host peer's table, through the connection to it, or this
// device's own table (a QP connected to this device; no connection).
struct ZeroHopTarget {
    PeerTable* table = nullptr;  // null: the request takes the request path
    Connection* connection = nullptr;
};

// Whether a published region holds [addr, addr + length) in that protection domain with every
// right in `access` (the responder's key check, made by a zero-hop initiator).
bool zero_hop_region_admits(const PublishedRegionView& region, std::uint32_t protection_domain, std::uint32_t access,
                            std::uint64_t addr, std::uint64_t length);

// The device's inside. Its links to other devices (peer_links.hpp) hand it the frames they read;
// its progress thread (progress_loop.hpp) runs its turns.
class DeviceCore final : private LinkEvents, private ProgressWork {
public:
    DeviceCore(Device& owner, const DeviceOptions& options);
    ~DeviceCore();

    // Called by the data path through QueuePair::ring_send_doorbell.
    void notify_doorbell(std::atomic<bool>& queue_pair_flag) { loop_.notify_doorbell(queue_pair_flag); }
    // Called by the data path through QueuePair::ring_send_doorbell first: executes the QP's
    // new WQEs on the calling thread while they are zero-hop writes (zero_hop.cpp). False when
    // something is left for the progress thread (the caller then notifies it), including when
    // the device mutex is busy: the doorbell thread never waits for it.
    bool execute_from_doorbell(QueuePairContext& queue_pair);
    // Its body: true when every new WQE was executed here (execute_from_doorbell counts the rest).
    bool execute_all_from_doorbell(QueuePairContext& queue_pair);
    // Then: executes the QP's new WQEs on the calling thread and writes their request frames to
    // the peer's socket (doorbell_requests.cpp). False when something is left for the progress
    // thread, as above.
    bool send_from_doorbell(QueuePairContext& queue_pair);
    // Lends the calling thread to the device (caller_progress.cpp): while frames come over its
    // connections, reads and handles them here, so that a thread waiting for one needs no
    // wake-up of the progress thread. Never waits for the mutex. Returns the sockets handled.
    int progress_from_caller();
    void stop_progress_from_caller();

    std::mutex mutex;
    // Memory this device allocates for its users and for its RC rings, which same-host peers map
    // too (shared_arena.hpp). Declared before the objects whose rings it holds: it outlives them.
    SharedArena arena;
    std::array<std::uint8_t, 16> gid{};
    std::uint16_t lid = 0;
    std::uint32_t ipv4 = 0;  // network order
    std::map<std::uint32_t, MemoryRegionState> memory_regions;  // by key
    std::map<std::uint32_t, IndirectKeyState> indirect_keys;    // by key (indirect_keys.cpp)
    std::map<std::uint32_t, std::unique_ptr<CompletionQueueContext>> completion_queues;
    std::map<std::uint32_t, std::unique_ptr<SharedReceiveQueueContext>> shared_receive_queues;
    std::map<std::uint32_t, std::unique_ptr<QueuePairContext>> queue_pairs;
    std::uint32_t next_handle = 1;
    // Index 1 is never used: key 0x100 (index 1, tag 0) is MLX5_INVALID_LKEY, which ends a
    // receive WQE's scatter list, so a ConnectX never hands it out.
    std::uint32_t next_key_index = 2;

    // Control-plane hooks that need the progress machinery (mutex held by the caller).
    void move_to_error(QueuePairContext& queue_pair, const char* why);
    // An RC QP moved to RTS: its progress thread opens the connection to the remote device now
    // (in the background: it never waits for the connect) rather than at the first request, so
    // the hello, the same-host probe and the mapping of the peer's table happen while the
    // application is still connecting, not in its first transfer. The cost: a process holds a
    // connection to every device its RC QPs reach, used or not (one per device, not per QP).
    // A QP connected to this device needs none: it is marked zero-hop at once.
    void open_path_soon(QueuePairContext& queue_pair);
    void wake() { loop_.wake(); }
    // Sends the ACKs still held, then closes every connection gracefully (PeerLinks::close_gracefully).
    void close_connections_gracefully();
    // For tests, with `mutex` held: the bytes received and not yet read (SIOCINQ) on the
    // connections peers opened, which carry their requests, so that a test can let the device
    // read requests only once all have arrived.
    std::size_t unread_request_bytes() const { return links_.unread_bytes(false); }
    // The same on the connections this device opened, which carry the answers to its requests.
    std::size_t unread_response_bytes() const { return links_.unread_bytes(true); }

    // What the device counted (device_statistics.hpp).
    DeviceStatistics statistics;
    static void count_one(std::atomic<std::uint64_t>& counter) { DeviceStatistics::count_one(counter); }
    // What this device publishes, as a target, for its same-host peers' zero-hop writes: its
    // memory regions and RC queue pairs (written under `mutex`).
    PublishedTable published_table;

private:
    // ProgressWork: the progress thread's turn, before and after it waits.
    Clock::time_point before_wait(bool& busy) override;
    void after_wait(const epoll_event* events, int count) override;
    void execute_pending_doorbells();
    void execute_send_queue(QueuePairContext& queue_pair);
    // Executes the WQE at `index`; true to go on with the next. On the doorbell thread
    // (`left_for_progress` given) only a zero-hop write executes: any other WQE is left as it is,
    // with no side effect, and *left_for_progress set.
    // With doorbell_sends_requests_ set (send_from_doorbell), every WQE that decodes without a
    // local error executes there and sends its request.
    bool execute_one(QueuePairContext& queue_pair, std::uint32_t index, bool* left_for_progress = nullptr);
    // The zero-hop write (zero_hop.cpp): the responder's checks against the target's published
    // table, the bytes moved with process_vm_writev. False, with nothing moved, whenever it
    // cannot be done so: the request path then carries the write and produces any NAK.
    bool zero_hop_write(QueuePairContext& queue_pair, const wire::Request& request, std::span<const std::uint8_t> payload,
                        const wire::Segment* segments, std::uint32_t segment_count);
    // The zero-hop read: the same checks (remote read access), the bytes copied into the local
    // targets (memcpy from the target's arena into ours, else process_vm_readv). False, with
    // nothing moved, whenever it cannot be done so.
    bool zero_hop_read(QueuePairContext& queue_pair, const wire::Request& request, const MemorySegments& targets,
                       std::uint64_t length);
    // The zero-hop atomic: a compare-and-swap or fetch-and-add on a word of the target's arena,
    // by the CPU's own atomic instruction on the shared mapping (so it is atomic with respect to
    // the target device's atomics, which use the same instructions on the same memory), after
    // the responder's checks; the original value written into the local targets, which must be
    // in this device's arena. False, with nothing done, whenever it cannot be done so.
    bool zero_hop_atomic(QueuePairContext& queue_pair, const wire::Request& request, const MemorySegments& targets);
    // The zero-hop receive (zero_hop_receive.cpp): a send or an RDMA write with immediate to a
    // same-host peer, whose receive WQE this thread consumes and whose CQE it writes. False, with
    // no receive consumed, whenever it cannot be done so: the request path then carries it.
    bool zero_hop_receive(QueuePairContext& queue_pair, const wire::Request& request, std::span<const std::uint8_t> payload,
                          const wire::Segment* segments, std::uint32_t segment_count);
    // The same from a DCI to a same-host DCT: the WQE is its SRQ's next, taken under the receive
    // lock. `local`: the message's bytes, in memory that cannot go away.
    bool zero_hop_shared_receive(QueuePairContext& queue_pair, const wire::Request& request, const iovec* local,
                                 std::size_t local_count, std::uint64_t length);
    // The target of a zero-hop request of this QP, with the target QP's entry (ready, connected
    // to this QP, with `remote_access` when not 0), or no table. A DCI's target is the DCT its
    // current WQE names: in RTR, with the access key `dc_key` the WQE carries.
    ZeroHopTarget zero_hop_target(QueuePairContext& queue_pair, std::uint32_t remote_access, PublishedQueuePairView& target,
                                  std::uint64_t dc_key = 0);
    // Whether the target QP's entry is ready to receive from this QP.
    bool zero_hop_ready(const PublishedQueuePairView& target, const QueuePairContext& queue_pair) const;
    // The responder's checks for a zero-hop request of `length` bytes needing `remote_access`:
    // the target, with `use` holding the key's region, or no table with nothing held (the request
    // path then carries the request and produces any NAK).
    ZeroHopTarget zero_hop_admit(QueuePairContext& queue_pair, const wire::Request& request, std::uint64_t length,
                               std::uint32_t remote_access, PeerTable::RegionUse& use);
    void log_zero_hop_failure(Connection& connection, const QueuePairContext& queue_pair, const char* what, int error);
    // Whether every local piece lies in this device's arena: memory that cannot be unmapped under
    // the copying thread, so a zero-hop move may touch it with plain loads and stores.
    bool in_own_arena(const iovec* pieces, std::size_t count) const;
    // True when process_vm_readv/writev on this process itself is allowed (probed once, logged
    // once when refused); under `mutex`.
    bool self_cross_memory_attach();
    // A zero-hop move into (write) or out of (read) memory of `target`'s process by cross-memory
    // attach: a peer's through its pidfd brackets, this process's own (loopback) directly.
    // 0 or the errno; logs a peer's failure once per connection.
    int move_zero_hop(const ZeroHopTarget& target, const QueuePairContext& queue_pair, bool write, const iovec* local,
                      std::size_t local_count, const iovec& remote, std::uint64_t length);
    // The connection to that device when it published its table to us, else nullptr.
    Connection* zero_hop_connection(const std::array<std::uint8_t, 16>& gid, std::uint16_t lid);
    // LinkEvents: what the links read and what became of them.
    void handle_frame(Connection& connection, wire::FrameType type, const std::uint8_t* body,
                      const std::uint8_t* payload, std::uint32_t payload_length) override;
    void connection_closed(Connection& connection, const char* why) override;
    bool read_turn_begins(Connection& connection) override;
    void read_turn_ended(Connection& connection, bool began) override;
    wire::Hello opening_hello() const override { return make_hello(0); }
    void handle_request(Connection& connection, const wire::Request& request, const std::uint8_t* payload,
                        std::uint32_t payload_length);
    void handle_dc_request(Connection& connection, QueuePairContext& target, const wire::Request& request,
                           const std::uint8_t* payload, std::uint32_t payload_length);
    // Performs an admitted request on the responder QP or DCT; `expected_psn` advances when the
    // request is accepted (answered with ACK or NAK, not RNR).
    void perform_request(Connection& connection, QueuePairContext& queue_pair, const wire::Request& request,
                         const std::uint8_t* payload, std::uint32_t payload_length, std::uint32_t& expected_psn);
    // DC initiator: reads a WQE's address vector into the request and the DCI's current target.
    // Returns false when the WQE must wait (another target still has requests in flight).
    enum class AddressOutcome { ready, wait, malformed };
    AddressOutcome take_dc_address(QueuePairContext& queue_pair, const std::uint8_t* address_vector, wire::Request& request);
    void handle_response(const wire::Response& response, const std::uint8_t* payload, std::uint32_t payload_length);
    // Test hook: hold_responder_completions() (device.hpp); nothing when it is off.
    static void hold_before_responder_completion();
    void respond(Connection& connection, const wire::Response& response, const void* payload = nullptr,
                 std::uint32_t payload_length = 0);
    // The acknowledgement of a plain RDMA write, which an RC responder may coalesce with the
    // next ones (IB spec 9.7.5.1.1: an ACK acknowledges every earlier request of its QP): while
    // the links read the frames of one turn (PeerLinks::read_connection), it is held on the connection and
    // replaced by the next one for the same QP; any other answer on the connection, and the end
    // of the turn, send it first. Elsewhere it is sent at once.
    void respond_coalescing(Connection& connection, const wire::Response& response);
    void send_held_acknowledgement(Connection& connection);
    // The end of a turn of reads from `connection`: its held ACK goes now, or, while a caller of
    // progress() reads (caller_progress.cpp), is deferred (held_acknowledgements_) to the next
    // send_held_acknowledgements, so the caller first sees what the frames wrote and can answer.
    void end_acknowledgement_turn(Connection& connection);
    void send_held_acknowledgements();
    // `inline_data`: a read's or atomic's answer that goes into the CQE (scatter-to-CQE).
    void complete_requester(QueuePairContext& queue_pair, const InFlight& request, std::uint8_t syndrome,
                            const std::uint8_t* inline_data = nullptr);
    // Completes the plain RDMA writes in flight before `psn`, which an ACK of `psn` acknowledges.
    void complete_acknowledged_before(QueuePairContext& queue_pair, std::uint32_t psn);
    void fail_queue_pair(QueuePairContext& queue_pair, std::uint8_t syndrome, const char* why);
    void flush_queue_pair(QueuePairContext& queue_pair);
    void service_timers();
    Clock::time_point next_timer();
    // Requester: the ACK timer restarts with every response and when a QP starts sending; a
    // timeout sends everything in flight again, retry_cnt times, then fails the QP.
    void restart_ack_timer(QueuePairContext& queue_pair);
    void resend_in_flight(QueuePairContext& queue_pair, bool retransmission);
    bool send_request(QueuePairContext& queue_pair, const std::vector<std::uint8_t>& frame);

    // The open connection to that device when its payloads may go by reference, else nullptr.
    const Connection* same_host_connection(const std::array<std::uint8_t, 16>& gid, std::uint16_t lid) const;
    wire::Hello make_hello(std::uint8_t flags) const;
    void handle_hello(Connection& connection, const wire::Hello& hello);
    std::string peer_name(const Connection& connection) const;

    // Memory checks, as the NIC makes them against its memory translation tables.
    const MemoryRegionState* find_region(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr,
                                         std::uint64_t length, std::uint32_t needed_access) const;
    // The host memory `length` bytes at `addr` through `key` are: one piece of a region, or the
    // pieces an indirect key's layout maps them to (zero-based). False when the key, a piece's
    // region, the bounds or the access do not allow it (indirect_keys.cpp).
    bool translate_memory(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr,
                          std::uint64_t length, std::uint32_t needed_access, MemorySegments& segments) const;
    // Whether what translate_memory appended from `first` on is the posted address itself (one
    // piece at `addr`), not an indirect key's pieces: only then may scatter-to-CQE stand for it.
    static bool translated_as_posted(const MemorySegments& segments, std::size_t first, std::uint64_t addr,
                                     std::uint64_t length) {
        return length == 0 || (segments.size() == first + 1 &&
                               segments[first].first == reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(addr)));
    }
    // A UMR WQE (LOCAL_INV or a key configuration) at `index`; false when the QP stops here
    // (an error, or earlier requests still in flight: it runs when they are answered).
    bool execute_umr(QueuePairContext& queue_pair, std::uint32_t index, const std::uint8_t* control);

    // Receive WQEs: the next one of the RQ or SRQ, or nothing (receiver not ready).
    struct ReceiveBuffer {
        std::uint16_t wqe_counter = 0;
        std::vector<std::pair<std::uint8_t*, std::uint32_t>> segments;
        bool segments_as_posted = true;  // as InFlight::targets_as_posted
        bool valid = false;
        bool protection_error = false;
        std::uint64_t capacity = 0;
    };
    bool peek_receive(QueuePairContext& queue_pair, ReceiveBuffer& buffer);
    void consume_receive(QueuePairContext& queue_pair);

    Device& owner_;
    // The progress thread; its epoll set watches the listening socket, the connections' set
    // (while attached), the ACK timer and a lock holder's pidfd.
    ProgressLoop loop_;
    // The connections, in an epoll set of their own (caller_progress.cpp). The progress thread
    // watches the set through its own while attached; while callers of progress() poll it
    // themselves it is detached, so an arriving frame wakes no thread. Under `mutex`.
    PeerLinks links_;
    bool connections_attached_ = true;
    static constexpr std::uint64_t kConnectionsTag = ~0ull - 4;
    // Until when the callers hold the connections (steady clock ticks): each progress() call
    // that polls extends it; past it, the progress thread attaches the set again.
    std::atomic<std::int64_t> connections_held_until_{0};
    bool caller_progress_enabled_ = true;
    void open_connections_set();
    void attach_connections(bool attached, const char* why);
    Clock::time_point connections_held_until() const {
        return Clock::time_point(Clock::duration(connections_held_until_.load(std::memory_order_relaxed)));
    }
    // Puts the set back into the progress thread's once the callers' hold is over; returns when
    // to look again if the callers still hold it, else the zero time point.
    Clock::time_point settle_connections_holder();
    void remove_closed_connections();
    // This device's own table read as a peer reads it: zero-hop requests of a QP connected to
    // this device (made on first use, under `mutex`; destroyed before the table it maps).
    std::unique_ptr<PeerTable> self_table_;
    // Whether this process may move bytes within itself by cross-memory attach (loopback zero-hop
    // writes and reads of memory outside the arena): probed on first use (self_cross_memory_attach).
    enum class SelfAttach : std::uint8_t { unknown, allowed, refused };
    SelfAttach self_attach_ = SelfAttach::unknown;
    TransportMode transport_mode_ = TransportMode::automatic;
    // Payloads from this size up move by cross-memory attach on the same-host path; below it one
    // copy into the frame costs less than the responder's process_vm_readv/writev. Forced to the
    // same-host path (RDMACHAN_SOFT_TRANSPORT=shm), every payload does, so tests run on it.
    std::uint64_t by_reference_threshold_ = 4096;
    // RDMACHAN_SOFT_ZERO_HOP=0 turns zero-hop writes off (the request path carries every write):
    // for measuring one against the other.
    bool zero_hop_enabled_ = true;
    // A random word peers read with process_vm_readv to prove cross-memory attach reaches us.
    alignas(8) std::uint64_t probe_word_ = 0;
    std::deque<std::vector<std::uint8_t>> loopback_;  // frames this device sends to itself
    std::vector<std::pair<Gid, std::uint16_t>> paths_to_open_;  // open_path_soon's devices (gid, lid)
    // Requests sent from the doorbell thread (doorbell_requests.cpp): RDMACHAN_SOFT_DOORBELL_REQUESTS=0
    // turns them off (the progress thread sends every request), for measuring one against the other.
    bool doorbell_requests_enabled_ = true;
    bool doorbell_sends_requests_ = false;  // send_from_doorbell is executing WQEs (mutex held)
    // The responder holds the receive lock between an answer and its CQE (perform_request); the
    // CQE writers do not take it again. Under the mutex, as every CQE write.
    bool receive_lock_held_ = false;
    // The plain write ACKs held back for coalescing (held_acknowledgements.hpp).
    HeldAcknowledgements held_acknowledgements_;
    // Every CQE this device writes (completion_writer.hpp).
    CompletionWriter completions_;
    // execute_one's decoding buffers, kept so that decoding allocates nothing once warm (the
    // doorbell thread is the data path). Members under `mutex`, which every caller of execute_one
    // holds, rather than thread_local: in a shared library each thread_local access is a call to
    // __tls_get_addr.
    std::vector<std::uint8_t> decode_payload_;
    MemorySegments decode_pieces_;
    // Wakes the progress thread at the ACK deadline of a request the doorbell thread sent while
    // it slept; armed for that time point (none: the zero time point). Both under `mutex`.
    static constexpr std::uint64_t kAckTimerTag = ~0ull - 2;
    int ack_timer_fd_ = -1;
    Clock::time_point ack_timer_armed_for_{};
    void open_ack_timer();
    void close_ack_timer();
    void arm_ack_timer(Clock::time_point deadline);
    void ack_timer_fired();
    // A same-host peer whose connection closed while it held this device's receive lock: its
    // pidfd, watched by epoll, says when it has exited, so the lock is taken over and its journal
    // finished then (published_table.hpp), not only when this device next needs the lock. Only
    // one process holds the lock at a time, so one watch is enough. Under `mutex`.
    static constexpr std::uint64_t kLockHolderTag = ~0ull - 3;
    int lock_holder_watch_ = -1;
    std::uint32_t lock_holder_pid_ = 0;
    void watch_lock_holder(const PeerProcess& peer);
    void lock_holder_exited();
};

}  // namespace rdmachan::soft
