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
#include "transport/soft/requester.hpp"
#include "transport/soft/responder.hpp"
#include "transport/soft/reusing_ring.hpp"
#include "transport/soft/same_host.hpp"
#include "transport/soft/wire.hpp"

namespace rdmachan::soft {

// The device's inside. Its links to other devices (peer_links.hpp) hand it the frames they read;
// its progress thread (progress_loop.hpp) runs its turns.
class DeviceCore final : private LinkEvents, private ProgressWork, private RequesterEvents {
public:
    DeviceCore(Device& owner, const DeviceOptions& options);
    ~DeviceCore();

    // Called by the data path through QueuePair::ring_send_doorbell.
    void notify_doorbell(std::atomic<bool>& queue_pair_flag) { loop_.notify_doorbell(queue_pair_flag); }
    // Called by the data path through QueuePair::ring_send_doorbell first, then: the requester
    // executes what it can on the calling thread (Requester::execute_from_doorbell and
    // send_from_doorbell); false when something is left for the progress thread.
    bool execute_from_doorbell(QueuePairContext& queue_pair) { return requester_.execute_from_doorbell(queue_pair); }
    bool send_from_doorbell(QueuePairContext& queue_pair) { return requester_.send_from_doorbell(queue_pair); }
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
    void move_to_error(QueuePairContext& queue_pair, const char* why) { requester_.move_to_error(queue_pair, why); }
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
    // LinkEvents: what the links read and what became of them.
    void handle_frame(Connection& connection, wire::FrameType type, const std::uint8_t* body,
                      const std::uint8_t* payload, std::uint32_t payload_length) override;
    void connection_closed(Connection& connection, const char* why) override;
    bool read_turn_begins(Connection& connection) override;
    void read_turn_ended(Connection& connection, bool began) override;
    wire::Hello opening_hello() const override { return make_hello(0); }
    wire::Hello make_hello(std::uint8_t flags) const;
    void handle_hello(Connection& connection, const wire::Hello& hello);
    std::string peer_name(const Connection& connection) const;

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
    // A random word peers read with process_vm_readv to prove cross-memory attach reaches us.
    alignas(8) std::uint64_t probe_word_ = 0;
    LoopbackFrames loopback_;  // frames this device sends to itself
    std::vector<std::pair<Gid, std::uint16_t>> paths_to_open_;  // open_path_soon's devices (gid, lid)
    // The responder holds the receive lock between an answer and its CQE (perform_request); the
    // CQE writers do not take it again. Under the mutex, as every CQE write.
    bool receive_lock_held_ = false;
    // Every CQE this device writes (completion_writer.hpp).
    CompletionWriter completions_;
    // The responder's answers, plain write ACKs coalesced (answers.hpp).
    Answers answers_;
    // How requests may travel (requester.hpp), read from the environment when the device opens.
    RequesterSettings settings_;
    // What the device does with the WQEs of its send queues (requester.hpp).
    Requester requester_;
    // What the device does with requests for its QPs and DCTs (responder.hpp).
    Responder responder_;
    // Wakes the progress thread at the ACK deadline of a request the doorbell thread sent while
    // it slept; armed for that time point (none: the zero time point). Both under `mutex`.
    static constexpr std::uint64_t kAckTimerTag = ~0ull - 2;
    int ack_timer_fd_ = -1;
    Clock::time_point ack_timer_armed_for_{};
    void open_ack_timer();
    void close_ack_timer();
    void arm_ack_timer(Clock::time_point deadline);
    void arm_wake_timer(Clock::time_point deadline) override { arm_ack_timer(deadline); }
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
