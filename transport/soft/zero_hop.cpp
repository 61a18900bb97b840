// Zero-hop RDMA writes on the same-host path (issue 17): the initiator's doorbell thread executes
// an RDMA write itself. It decodes the WQE with the device's decoder (execute_one), makes the
// responder's checks (perform_request's, for a write) against the table the target published
// (published_table.hpp), moves the bytes with process_vm_writev, and writes its own CQE. No
// thread of either process is woken and no frame is sent.
//
// Only when that is exactly what the request path would have done:
//   - the QP is an RC QP in RTS with nothing on the request path (no request in flight, no RNR
//     wait, no UMR waiting for answers): the write cannot overtake anything, so RC ordering and
//     completion order hold, and fences (which wait for earlier reads and atomics) are met;
//   - the remote QP is in RTR or RTS, connected to this QP, with remote write access, and the
//     key is a region of its PD that holds the range with remote write access.
// Anything else, a check that fails included, goes the request path unchanged: the responder
// then refuses it with the NAK and the error CQE it always gave, and memory stays untouched.
// Zero-hop writes use no PSN (nothing is sent), so the two sides' PSNs stay in step.
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "src/flight_recorder.hpp"
#include "src/logger.hpp"
#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {

using namespace rdmachan::mlx5;

namespace {

// delay_zero_hop_writes(): microseconds between a zero-hop write's checks and its move.
std::atomic<std::int64_t> test_delay{0};

// The largest write that goes zero-hop (see zero_hop_write).
constexpr std::uint64_t kZeroHopMaxBytes = 256 * 1024;

// Copies the pieces to `destination` back to back, the last byte last: a reader polling the last
// byte of the range (perftest's ib_write_lat does, and so does rdmachan-bench) then finds every
// other byte in place once it sees it, as a NIC's in-order DMA gives in practice. memcpy alone
// may store the bytes in any order.
void copy_in_order(std::uint8_t* destination, const iovec* local, std::size_t local_count, std::uint64_t length) {
    const std::uint8_t* last = nullptr;
    std::uint64_t copied = 0;
    for (std::size_t i = 0; i < local_count; ++i) {
        std::size_t bytes = local[i].iov_len;
        const auto* source = static_cast<const std::uint8_t*>(local[i].iov_base);
        if (bytes != 0 && copied + bytes == length) last = source + --bytes;
        std::memcpy(destination + copied, source, bytes);
        copied += bytes;
    }
    std::atomic_thread_fence(std::memory_order_release);
    if (last != nullptr) __atomic_store_n(destination + copied, *last, __ATOMIC_RELAXED);
}

}  // namespace

void delay_zero_hop_writes(std::chrono::microseconds delay) noexcept {
    test_delay.store(delay.count(), std::memory_order_relaxed);
}

bool DeviceCore::execute_from_doorbell(QueuePairContext& queue_pair) {
    if (!zero_hop_enabled_ || !queue_pair.zero_hop_remote.load(std::memory_order_relaxed)) return false;
    // Never wait for the progress thread: if it holds the mutex, it will execute the WQEs.
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (queue_pair.state != QueuePairState::ready_to_send || !queue_pair.in_flight.empty()) return false;
    const std::uint32_t producer = big_to_host32(load_acquire32(queue_pair.send_ring.doorbell_record + kSendDoorbell)) & 0xffff;
    // The same bound per turn as the progress thread: a long batch is left to it.
    constexpr int kWqesPerTurn = 64;
    for (int executed = 0; ((producer - queue_pair.executed) & 0xffff) != 0; ++executed) {
        if (executed == kWqesPerTurn) return false;
        bool left_for_progress = false;
        if (!execute_one(queue_pair, queue_pair.executed, &left_for_progress)) return false;
    }
    return true;
}

Connection* DeviceCore::zero_hop_connection(const std::array<std::uint8_t, 16>& remote_gid, std::uint16_t remote_lid) {
    for (auto& connection : connections_) {
        if (connection->outgoing && connection->socket >= 0 && connection->gid == remote_gid && connection->lid == remote_lid) {
            return connection->by_reference && !connection->awaiting_reply && connection->peer_table != nullptr ? connection.get()
                                                                                                               : nullptr;
        }
    }
    return nullptr;
}

bool DeviceCore::zero_hop_write(QueuePairContext& queue_pair, const wire::Request& request,
                                const std::vector<std::uint8_t>& payload, const wire::Segment* segments,
                                std::uint32_t segment_count) {
    if (!zero_hop_enabled_ || request.opcode != kOpcodeRdmaWrite) return false;
    if (queue_pair.transport != Transport::reliable_connected || queue_pair.state != QueuePairState::ready_to_send ||
        !queue_pair.in_flight.empty() || queue_pair.waiting_rnr || queue_pair.umr_waits_for_answers) {
        return false;
    }
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    if (remote.gid == gid && remote.lid == lid) return false;  // this device: the loopback path
    Connection* connection = zero_hop_connection(remote.gid, remote.lid);
    queue_pair.zero_hop_remote.store(connection != nullptr, std::memory_order_relaxed);
    if (connection == nullptr) return false;

    // The bytes, in order: the frame's payload (inline data came first, or the WQE was mixed),
    // or the pointer segments.
    std::uint64_t length = payload.size();
    iovec local[wire::kMaxSegments];
    std::size_t local_count = 0;
    if (!payload.empty()) {
        if (segment_count != 0) return false;  // not a shape execute_one makes; the request path sorts it out
        local[local_count++] = {const_cast<std::uint8_t*>(payload.data()), payload.size()};
    } else {
        for (std::uint32_t i = 0; i < segment_count; ++i) {
            local[local_count++] = {reinterpret_cast<void*>(segments[i].address), static_cast<std::size_t>(segments[i].length)};
            length += segments[i].length;
        }
    }
    // A zero-length write checks no memory at the responder: too little to gain here.
    if (length == 0) return false;

    // The responder's checks, as perform_request makes them for a write: the QP (as
    // handle_request: ready, connected to us), its access, then the key.
    PeerTable& table = *connection->peer_table;
    // A simulated partition (either side) loses frames; zero-hop writes must be lost too, so
    // they take the request path, where the frames are dropped.
    if (partition_simulated() || table.partitioned()) return false;
    const std::optional<PublishedQueuePairView> target = table.read_queue_pair(remote.qpn);
    if (!target) return false;
    const bool ready = target->state == static_cast<std::uint32_t>(QueuePairState::ready_to_receive) ||
                       target->state == static_cast<std::uint32_t>(QueuePairState::ready_to_send);
    if (!ready || target->remote_qpn != queue_pair.qpn || target->remote_gid != gid || target->remote_lid != lid ||
        (target->access & kRemoteWrite) == 0) {
        return false;
    }
    PeerTable::RegionUse use;
    table.use_region(request.rkey, use);
    const std::optional<PublishedRegionView>& region = use.entry();
    if (!region || region->protection_domain != target->protection_domain || (region->access & kRemoteWrite) == 0) return false;
    if (request.remote_addr < region->addr || length > region->length || request.remote_addr - region->addr > region->length - length) {
        return false;
    }
    if (const auto delay = test_delay.load(std::memory_order_relaxed); delay != 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay));
    }
    // Into the target's arena, from memory that cannot go away under this thread (the frame's
    // payload, or this device's own arena): a memcpy into the mapping, no system call. Memory
    // the user registered from the heap could be unmapped while registered; a plain load of it
    // would fault where process_vm_writev reports EFAULT, so it takes the system call.
    if (std::uint8_t* mapped = table.arena_range(region->arena_offset, region->length); mapped != nullptr) {
        bool stable = !payload.empty();
        if (!stable) {
            stable = true;
            for (std::size_t i = 0; i < local_count && stable; ++i) stable = arena.holds(local[i].iov_base, local[i].iov_len);
        }
        if (stable) {
            copy_in_order(mapped + (request.remote_addr - region->addr), local, local_count, length);
            use.release();
            zero_hop_writes.fetch_add(1, std::memory_order_relaxed);
            zero_hop_arena_writes.fetch_add(1, std::memory_order_relaxed);
            return true;
        }
    }
    // A large write by system call moves faster on the request path, where the target's thread
    // moves it while this process goes on (rdmachan-bench, 2 CPUs: 1 MiB writes 4.3-6.1 GB/s
    // zero-hop against 6.9-10.2 GB/s; equal within the noise at 64 and 256 KiB; README
    // "Zero-hop writes").
    if (length > kZeroHopMaxBytes) return false;
    const iovec destination{reinterpret_cast<void*>(request.remote_addr), static_cast<std::size_t>(length)};
    const int error = write_to_peer(connection->peer_process, local, local_count, &destination, 1, length);
    use.release();
    if (error != 0) {
        // The target exited (ESRCH, also when its pidfd says so before or after the move) or our
        // own memory went away (EFAULT): the request path reports it as it always did (the lost
        // connection, or the responder's local protection error).
        if (!std::exchange(connection->zero_hop_failure_logged, true)) {
            detail::logger().warn("software device {}: QP {}: zero-hop write into process {} failed: {}; "
                                  "the request path takes over (said once per connection)",
                                  owner_.name(), queue_pair.qpn, connection->peer_process.pid(), std::strerror(error));
        }
        return false;
    }
    zero_hop_writes.fetch_add(1, std::memory_order_relaxed);
    return true;
}

}  // namespace rdmachan::soft
