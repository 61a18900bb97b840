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
#include "transport/soft/answers.hpp"
#include "transport/soft/completion_ring.hpp"
#include "transport/soft/completion_writer.hpp"
#include "transport/soft/held_completions.hpp"
#include "transport/soft/connection.hpp"
#include "transport/soft/connection_input.hpp"
#include "transport/soft/device.hpp"
#include "transport/soft/device_objects.hpp"
#include "transport/soft/device_statistics.hpp"
#include "transport/soft/gid.hpp"
#include "transport/soft/indirect_keys.hpp"
#include "transport/soft/memory_translation.hpp"
#include "transport/soft/peer_links.hpp"
#include "transport/soft/peer_table.hpp"
#include "transport/soft/progress_loop.hpp"
#include "transport/soft/published_table.hpp"
#include "transport/soft/shared_arena.hpp"
#include "transport/soft/responder.hpp"
#include "transport/soft/reusing_ring.hpp"
#include "transport/soft/same_host.hpp"
#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

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
class DeviceCore final : private LinkEvents, private ProgressWork, private ResponderFailures {
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
    // The regions and indirect keys, and the translation every access goes through.
    MemoryTranslation translation;
    std::map<std::uint32_t, std::unique_ptr<CompletionQueueContext>> completion_queues;
    std::map<std::uint32_t, std::unique_ptr<SharedReceiveQueueContext>> shared_receive_queues;
    std::map<std::uint32_t, std::unique_ptr<QueuePairContext>> queue_pairs;
    std::uint32_t next_handle = 1;

    // Control-plane hooks that need the progress machinery (mutex held by the caller).
    void move_to_error(QueuePairContext& queue_pair, const char* why) override;
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
    // DC initiator: reads a WQE's address vector into the request and the DCI's current target.
    // Returns false when the WQE must wait (another target still has requests in flight).
    enum class AddressOutcome { ready, wait, malformed };
    AddressOutcome take_dc_address(QueuePairContext& queue_pair, const std::uint8_t* address_vector, wire::Request& request);
    void handle_response(const wire::Response& response, const std::uint8_t* payload, std::uint32_t payload_length);
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

    // A UMR WQE (LOCAL_INV or a key configuration) at `index`; false when the QP stops here
    // (an error, or earlier requests still in flight: it runs when they are answered).
    bool execute_umr(QueuePairContext& queue_pair, std::uint32_t index, const std::uint8_t* control);

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
    LoopbackFrames loopback_;  // frames this device sends to itself
    std::vector<std::pair<Gid, std::uint16_t>> paths_to_open_;  // open_path_soon's devices (gid, lid)
    // Requests sent from the doorbell thread (doorbell_requests.cpp): RDMACHAN_SOFT_DOORBELL_REQUESTS=0
    // turns them off (the progress thread sends every request), for measuring one against the other.
    bool doorbell_requests_enabled_ = true;
    bool doorbell_sends_requests_ = false;  // send_from_doorbell is executing WQEs (mutex held)
    // The responder holds the receive lock between an answer and its CQE (perform_request); the
    // CQE writers do not take it again. Under the mutex, as every CQE write.
    bool receive_lock_held_ = false;
    // Every CQE this device writes (completion_writer.hpp).
    CompletionWriter completions_;
    // The responder's answers, plain write ACKs coalesced (answers.hpp).
    Answers answers_;
    // What the device does with requests for its QPs and DCTs (responder.hpp).
    Responder responder_;
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
