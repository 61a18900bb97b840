// The requester: what the device does with the WQEs of its send queues. It decodes the bytes the
// data path wrote (wqe_layout.hpp offsets, apart from the encoder), checks the local segments
// against the translation tables, carries each operation to its responder (a request frame over
// the peer's connection or this device's loopback queue, or, to a same-host peer that published
// its table, zero-hop: the bytes moved and the responder's CQE written by this thread), keeps the
// requests in flight with their retries (RNR, ACK timeout), and completes them in order with the
// CQE a ConnectX writes. Errors move the QP to ERR and flush what follows.
//
// It runs on the progress thread, and on the thread that rings a doorbell (zero-hop WQEs, and
// requests written to an RC peer's socket) when that thread takes the device mutex without
// waiting. Its parts: requester.cpp (execution, answers, completion, timers), dc_requester.cpp (a
// DCI's address vectors), doorbell_requests.cpp (requests sent from the doorbell thread),
// zero_hop.cpp and zero_hop_receive.cpp (zero-hop), indirect_keys.cpp (UMR WQEs). Under the
// device mutex.
#pragma once

#include <sys/uio.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "transport/soft/answers.hpp"
#include "transport/soft/device_objects.hpp"
#include "transport/soft/indirect_keys.hpp"
#include "transport/soft/peer_table.hpp"
#include "transport/soft/responder.hpp"
#include "transport/soft/same_host.hpp"
#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

struct Connection;
class CompletionWriter;
class Device;
struct DeviceStatistics;
class MemoryTranslation;
class PeerLinks;
class ProgressLoop;
class PublishedTable;
class SharedArena;

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

// How the requester may carry requests; read from the environment when the device opens.
struct RequesterSettings {
    TransportMode transport_mode = TransportMode::automatic;
    // Payloads from this size up move by cross-memory attach on the same-host path; below it one
    // copy into the frame costs less than the responder's process_vm_readv/writev. Forced to the
    // same-host path (RDMACHAN_SOFT_TRANSPORT=shm), every payload does, so tests run on it.
    std::uint64_t by_reference_threshold = 4096;
    // RDMACHAN_SOFT_ZERO_HOP=0 turns zero-hop operations off (the request path carries them):
    // for measuring one against the other.
    bool zero_hop_enabled = true;
    // RDMACHAN_SOFT_DOORBELL_REQUESTS=0 leaves every request to the progress thread, for the
    // same reason.
    bool doorbell_requests_enabled = true;
};

// What the requester asks of the rest of the device.
class RequesterEvents {
public:
    // Wake the progress thread at `deadline` (a request sent while it slept has its ACK timeout).
    virtual void arm_wake_timer(Clock::time_point deadline) = 0;

protected:
    ~RequesterEvents() = default;
};

// The device's parts the requester works with, under the names the device gives them.
struct RequesterParts {
    Device& owner;
    std::mutex& mutex;
    ProgressLoop& loop;
    PeerLinks& links;
    LoopbackFrames& loopback;
    Answers& answers;
    CompletionWriter& completions;
    std::map<std::uint32_t, std::unique_ptr<QueuePairContext>>& queue_pairs;
    MemoryTranslation& translation;
    PublishedTable& published_table;
    SharedArena& arena;
    DeviceStatistics& statistics;
    const std::array<std::uint8_t, 16>& gid;
    const std::uint16_t& lid;
    const RequesterSettings& settings;
    RequesterEvents& events;
};

class Requester final : public ResponderFailures, private RequesterParts {
public:
    explicit Requester(const RequesterParts& parts) : RequesterParts(parts) {}
    ~Requester();

    // The doorbell thread (QueuePair::ring_send_doorbell): executes the QP's new WQEs here while
    // they are zero-hop operations (zero_hop.cpp). False when something is left for the progress
    // thread (the caller then notifies it), including when the device mutex is busy: the doorbell
    // thread never waits for it.
    bool execute_from_doorbell(QueuePairContext& queue_pair);
    // Then: executes the QP's new WQEs here and writes their request frames to the peer's socket
    // (doorbell_requests.cpp). False when something is left for the progress thread, as above.
    bool send_from_doorbell(QueuePairContext& queue_pair);

    // The progress thread's turn: the send queues whose doorbells rang.
    void execute_pending_doorbells();
    // An answer to one of this device's requests.
    void handle_response(const wire::Response& response, const std::uint8_t* payload, std::uint32_t payload_length);
    // Retries and timeouts that are due; when the next one is (the zero time point: none).
    void service_timers();
    Clock::time_point next_timer();

    // The QP completes what is in flight with `syndrome` and goes to ERR.
    void fail_queue_pair(QueuePairContext& queue_pair, std::uint8_t syndrome, const char* why);
    // The QP goes to ERR: every outstanding send WQE and posted receive is flushed.
    void move_to_error(QueuePairContext& queue_pair, const char* why) override;

private:
    void execute_send_queue(QueuePairContext& queue_pair);
    // Executes the WQE at `index`; true to go on with the next. On the doorbell thread
    // (`left_for_progress` given) only a zero-hop operation executes: any other WQE is left as it
    // is, with no side effect, and *left_for_progress set. With doorbell_sends_requests_ set
    // (send_from_doorbell), every WQE that decodes without a local error executes there and
    // sends its request.
    bool execute_one(QueuePairContext& queue_pair, std::uint32_t index, bool* left_for_progress = nullptr);
    // Its body for the doorbell thread: true when every new WQE was executed here.
    bool execute_all_from_doorbell(QueuePairContext& queue_pair);
    // A UMR WQE (LOCAL_INV or a key configuration) at `index`; false when the QP stops here
    // (an error, or earlier requests still in flight: it runs when they are answered).
    bool execute_umr(QueuePairContext& queue_pair, std::uint32_t index, const std::uint8_t* control);
    // DC initiator: reads a WQE's address vector into the request and the DCI's current target.
    // `wait`: the WQE must wait (another target still has requests in flight).
    enum class AddressOutcome { ready, wait, malformed };
    AddressOutcome take_dc_address(QueuePairContext& queue_pair, const std::uint8_t* address_vector, wire::Request& request);
    // `inline_data`: a read's or atomic's answer that goes into the CQE (scatter-to-CQE).
    void complete_requester(QueuePairContext& queue_pair, const InFlight& request, std::uint8_t syndrome,
                            const std::uint8_t* inline_data = nullptr);
    // Completes the plain RDMA writes in flight before `psn`, which an ACK of `psn` acknowledges.
    void complete_acknowledged_before(QueuePairContext& queue_pair, std::uint32_t psn);
    void flush_queue_pair(QueuePairContext& queue_pair);
    // The ACK timer restarts with every response and when a QP starts sending; a timeout sends
    // everything in flight again, retry_cnt times, then fails the QP.
    void restart_ack_timer(QueuePairContext& queue_pair);
    void resend_in_flight(QueuePairContext& queue_pair, bool retransmission);
    bool send_request(QueuePairContext& queue_pair, const std::vector<std::uint8_t>& frame);
    // The open connection to that device when its payloads may go by reference, else nullptr.
    const Connection* same_host_connection(const std::array<std::uint8_t, 16>& gid, std::uint16_t lid) const;
    void wake();
    static void count_one(std::atomic<std::uint64_t>& counter);

    // Zero-hop (zero_hop.cpp, zero_hop_receive.cpp). The write: the responder's checks against
    // the target's published table, the bytes moved with process_vm_writev. False, with nothing
    // moved, whenever it cannot be done so: the request path then carries the write and produces
    // any NAK.
    bool zero_hop_write(QueuePairContext& queue_pair, const wire::Request& request, std::span<const std::uint8_t> payload,
                        const wire::Segment* segments, std::uint32_t segment_count);
    // The read: the same checks (remote read access), the bytes copied into the local targets
    // (memcpy from the target's arena into ours, else process_vm_readv).
    bool zero_hop_read(QueuePairContext& queue_pair, const wire::Request& request, const MemorySegments& targets,
                       std::uint64_t length);
    // The atomic: a compare-and-swap or fetch-and-add on a word of the target's arena, by the
    // CPU's own atomic instruction on the shared mapping (so it is atomic with respect to the
    // target device's atomics, which use the same instructions on the same memory), after the
    // responder's checks; the original value written into the local targets, which must be in
    // this device's arena.
    bool zero_hop_atomic(QueuePairContext& queue_pair, const wire::Request& request, const MemorySegments& targets);
    // The receive: a send or an RDMA write with immediate to a same-host peer, whose receive WQE
    // this thread consumes and whose CQE it writes. False, with no receive consumed, whenever it
    // cannot be done so.
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
    // the target, with `use` holding the key's region, or no table with nothing held.
    ZeroHopTarget zero_hop_admit(QueuePairContext& queue_pair, const wire::Request& request, std::uint64_t length,
                                 std::uint32_t remote_access, PeerTable::RegionUse& use);
    void log_zero_hop_failure(Connection& connection, const QueuePairContext& queue_pair, const char* what, int error);
    // Whether every local piece lies in this device's arena: memory that cannot be unmapped under
    // the copying thread, so a zero-hop move may touch it with plain loads and stores.
    bool in_own_arena(const iovec* pieces, std::size_t count) const;
    // True when process_vm_readv/writev on this process itself is allowed (probed once, logged
    // once when refused).
    bool self_cross_memory_attach();
    // A zero-hop move into (write) or out of (read) memory of `target`'s process by cross-memory
    // attach: a peer's through its pidfd brackets, this process's own (loopback) directly.
    // 0 or the errno; logs a peer's failure once per connection.
    int move_zero_hop(const ZeroHopTarget& target, const QueuePairContext& queue_pair, bool write, const iovec* local,
                      std::size_t local_count, const iovec& remote, std::uint64_t length);
    // The connection to that device when it published its table to us, else nullptr.
    Connection* zero_hop_connection(const std::array<std::uint8_t, 16>& gid, std::uint16_t lid);

    // This device's own table read as a peer reads it: zero-hop requests of a QP connected to
    // this device (made on first use; destroyed before the table it maps, which the device
    // declares before this requester).
    std::unique_ptr<PeerTable> self_table_;
    // Whether this process may move bytes within itself by cross-memory attach (loopback zero-hop
    // writes and reads of memory outside the arena): probed on first use (self_cross_memory_attach).
    enum class SelfAttach : std::uint8_t { unknown, allowed, refused };
    SelfAttach self_attach_ = SelfAttach::unknown;
    bool doorbell_sends_requests_ = false;  // send_from_doorbell is executing WQEs (mutex held)
    // execute_one's decoding buffers, kept so that decoding allocates nothing once warm (the
    // doorbell thread is the data path). Members under the mutex, which every caller of
    // execute_one holds, rather than thread_local: in a shared library each thread_local access is
    // a call to __tls_get_addr.
    std::vector<std::uint8_t> decode_payload_;
    MemorySegments decode_pieces_;
};

}  // namespace rdmachan::soft
