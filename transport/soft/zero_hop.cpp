// Zero-hop RDMA writes and reads on the same-host path: the initiator's doorbell
// thread executes them itself. It decodes the WQE with the device's decoder (execute_one), makes
// the responder's checks (perform_request's) against the table the target published
// (published_table.hpp), moves the bytes (a memcpy when both sides' memory is in arenas,
// shared_arena.hpp; else process_vm_writev / process_vm_readv, on the process itself when the
// target QP is on this device), and writes its own CQE. No thread of either process is woken and
// no frame is sent.
//
// Only when that is exactly what the request path would have done:
//   - the QP is an RC QP in RTS with nothing on the request path (no request in flight, no RNR
//     wait, no UMR waiting for answers): the request cannot overtake anything, so RC ordering and
//     completion order hold, and fences (which wait for earlier reads and atomics) are met;
//   - the remote QP is in RTR or RTS, connected to this QP, with remote write (read) access, and
//     the key is a region of its PD that holds the range with that access.
// Anything else, a check that fails included, goes the request path unchanged: the responder
// then refuses it with the NAK and the error CQE it always gave, and memory stays untouched.
// Zero-hop requests use no PSN (nothing is sent), so the two sides' PSNs stay in step.
#include <sys/uio.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>

#include "transport/soft/flight_events.hpp"
#include "common/logger.hpp"
#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/atomic_word.hpp"
#include "transport/soft/device_core.hpp"
#include "transport/soft/dma_copy.hpp"

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
// may store the bytes in any order. (dma_copy.hpp: why ThreadSanitizer does not see the copy.)
void copy_in_order(std::uint8_t* destination, const iovec* local, std::size_t local_count, std::uint64_t length) {
    const std::uint8_t* last = nullptr;
    std::uint64_t copied = 0;
    for (std::size_t i = 0; i < local_count; ++i) {
        std::size_t bytes = local[i].iov_len;
        const auto* source = static_cast<const std::uint8_t*>(local[i].iov_base);
        if (bytes != 0 && copied + bytes == length) last = source + --bytes;
        dma_copy(destination + copied, source, bytes);
        copied += bytes;
    }
    std::atomic_thread_fence(std::memory_order_release);
    if (last != nullptr) __atomic_store_n(destination + copied, __atomic_load_n(last, __ATOMIC_RELAXED), __ATOMIC_RELAXED);
}

}  // namespace

void delay_zero_hop_writes(std::chrono::microseconds delay) noexcept {
    test_delay.store(delay.count(), std::memory_order_relaxed);
}

bool Requester::execute_from_doorbell(QueuePairContext& queue_pair) {
    if (!settings.zero_hop_enabled || !queue_pair.zero_hop_remote.load(std::memory_order_relaxed)) return false;
    if (execute_all_from_doorbell(queue_pair)) return true;
    statistics.doorbells_left_to_progress.fetch_add(1, std::memory_order_relaxed);
    return false;
}

bool Requester::execute_all_from_doorbell(QueuePairContext& queue_pair) {
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

Connection* Requester::zero_hop_connection(const std::array<std::uint8_t, 16>& remote_gid, std::uint16_t remote_lid) {
    Connection* connection = links.open_connection_to(remote_gid, remote_lid);
    return connection != nullptr && connection->by_reference && !connection->awaiting_reply && connection->peer_table != nullptr
               ? connection
               : nullptr;
}

ZeroHopTarget Requester::zero_hop_target(QueuePairContext& queue_pair, std::uint32_t remote_access,
                                          PublishedQueuePairView& target, std::uint64_t dc_key) {
    const bool dc = queue_pair.transport == Transport::dc_initiator;
    if ((queue_pair.transport != Transport::reliable_connected && !dc) || queue_pair.state != QueuePairState::ready_to_send ||
        !queue_pair.in_flight.empty() || queue_pair.waiting_rnr || queue_pair.umr_waits_for_answers) {
        return {};
    }
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    ZeroHopTarget found;
    if (same_gid(remote.gid, gid) && remote.lid == lid) {
        // This device itself: its own table, read as a peer reads it (loopback frames are never
        // lost to a simulated partition, so neither is this).
        if (self_table_ == nullptr && published_table.valid()) self_table_ = std::make_unique<PeerTable>(published_table, arena);
        if (self_table_ != nullptr && self_table_->valid()) found.table = self_table_.get();
        queue_pair.zero_hop_remote.store(found.table != nullptr, std::memory_order_relaxed);
        if (found.table == nullptr) return {};
    } else {
        found.connection = zero_hop_connection(remote.gid, remote.lid);
        queue_pair.zero_hop_remote.store(found.connection != nullptr, std::memory_order_relaxed);
        if (found.connection == nullptr) return {};
        found.table = found.connection->peer_table.get();
        // A simulated partition (either side) loses frames; zero-hop requests must be lost too,
        // so they take the request path, where the frames are dropped.
        if (partition_simulated() || found.table->partitioned()) return {};
    }
    // The responder's checks on its QP, as handle_request and perform_request make them: ready,
    // connected to us, with the access the request needs (none for a send). For a DCT, as
    // handle_dc_request makes them: in RTR, and the key first (a wrong one is the request path's
    // NAK and remote access error).
    const std::optional<PublishedQueuePairView> entry = found.table->read_queue_pair(remote.qpn);
    if (!entry || (remote_access != 0 && (entry->access & remote_access) == 0)) return {};
    if (dc ? entry->transport != kPublishedDcTarget || entry->dc_key != dc_key ||
                 entry->state != static_cast<std::uint32_t>(QueuePairState::ready_to_receive)
           : entry->transport != kPublishedReliableConnected || !zero_hop_ready(*entry, queue_pair)) {
        return {};
    }
    target = *entry;
    return found;
}

bool Requester::zero_hop_ready(const PublishedQueuePairView& target, const QueuePairContext& queue_pair) const {
    const bool ready = target.state == static_cast<std::uint32_t>(QueuePairState::ready_to_receive) ||
                       target.state == static_cast<std::uint32_t>(QueuePairState::ready_to_send);
    return ready && target.remote_qpn == queue_pair.qpn && same_gid(target.remote_gid, gid) && target.remote_lid == lid;
}

bool zero_hop_region_admits(const PublishedRegionView& region, std::uint32_t protection_domain, std::uint32_t access,
                            std::uint64_t addr, std::uint64_t length) {
    return region.protection_domain == protection_domain && (region.access & access) == access && addr >= region.addr &&
           length <= region.length && addr - region.addr <= region.length - length;
}

ZeroHopTarget Requester::zero_hop_admit(QueuePairContext& queue_pair, const wire::Request& request, std::uint64_t length,
                                         std::uint32_t remote_access, PeerTable::RegionUse& use) {
    PublishedQueuePairView target;
    const ZeroHopTarget found = zero_hop_target(queue_pair, remote_access, target, request.dc_key);
    // A zero-length request checks no memory at the responder: too little to gain here.
    if (found.table == nullptr || length == 0) return {};
    // Then the key, as perform_request checks it.
    found.table->use_region(request.rkey, use);
    const std::optional<PublishedRegionView>& region = use.entry();
    if (!region || !zero_hop_region_admits(*region, target.protection_domain, remote_access, request.remote_addr, length)) {
        use.release();
        return {};
    }
    if (const auto delay = test_delay.load(std::memory_order_relaxed); delay != 0) {
        std::this_thread::sleep_for(std::chrono::microseconds(delay));
    }
    return found;
}

bool Requester::in_own_arena(const iovec* pieces, std::size_t count) const {
    for (std::size_t i = 0; i < count; ++i) {
        if (!arena.holds(pieces[i].iov_base, pieces[i].iov_len)) return false;
    }
    return true;
}

void Requester::log_zero_hop_failure(Connection& connection, const QueuePairContext& queue_pair, const char* what, int error) {
    // The target exited (ESRCH, also when its pidfd says so before or after the move) or our own
    // memory went away (EFAULT): the request path reports it as it always did (the lost
    // connection, or the responder's local protection error).
    if (!std::exchange(connection.zero_hop_failure_logged, true)) {
        detail::logger().warn("software device {}: QP {}: zero-hop {} process {} failed: {}; "
                              "the request path takes over (said once per connection)",
                              owner.name(), queue_pair.qpn, what, connection.peer_process.pid(), std::strerror(error));
    }
}

bool Requester::self_cross_memory_attach() {
    if (self_attach_ != SelfAttach::unknown) [[likely]]
        return self_attach_ == SelfAttach::allowed;
    // The same probe a peer's hello gets (RDMACHAN_SOFT_REFUSE_CMA=1 refuses it too): a seccomp
    // profile may forbid the system calls even on the caller itself.
    const std::uint64_t word = 0x5e1f0a77ac4ed;
    const int error = probe_cross_memory_attach(static_cast<std::uint32_t>(::getpid()), reinterpret_cast<std::uint64_t>(&word), word);
    self_attach_ = error == 0 ? SelfAttach::allowed : SelfAttach::refused;
    if (error != 0) {
        detail::logger().info("software device {}: cross-memory attach within this process refused ({}): a QP connected to "
                              "this device moves memory outside its arena through the progress thread",
                              owner.name(), std::strerror(error));
    }
    return error == 0;
}

int Requester::move_zero_hop(const ZeroHopTarget& target, const QueuePairContext& queue_pair, bool write, const iovec* local,
                              std::size_t local_count, const iovec& remote, std::uint64_t length) {
    if (target.connection == nullptr) {
        // This device itself: its own process, which cannot exit under the call. Memory unmapped
        // while registered (EFAULT) is left to the loopback path, whose responder reports it.
        if (!self_cross_memory_attach()) return EPERM;
        const auto self = static_cast<std::uint32_t>(::getpid());
        return write ? write_to_process(self, local, local_count, &remote, 1, length)
                     : read_from_process(self, local, local_count, &remote, 1, length);
    }
    const int error = write ? write_to_peer(target.connection->peer_process, local, local_count, &remote, 1, length)
                            : read_from_peer(target.connection->peer_process, local, local_count, &remote, 1, length);
    if (error != 0) log_zero_hop_failure(*target.connection, queue_pair, write ? "write into" : "read from", error);
    return error;
}

bool Requester::zero_hop_write(QueuePairContext& queue_pair, const wire::Request& request,
                                std::span<const std::uint8_t> payload, const wire::Segment* segments,
                                std::uint32_t segment_count) {
    if (!settings.zero_hop_enabled || request.opcode != kOpcodeRdmaWrite) return false;
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
    // Memory that cannot go away under this thread: the frame's payload, or this device's own
    // arena. Memory the user registered from the heap could be unmapped while registered; a plain
    // load of it would fault where process_vm_writev reports EFAULT, so it takes the system call.
    const bool stable = !payload.empty() || in_own_arena(local, local_count);
    // A large write by system call moves faster on the request path, where the target's thread
    // moves it while this process goes on (rdmachan-bench, 2 CPUs: 1 MiB writes 4.3-6.1 GB/s
    // zero-hop against 6.9-10.2 GB/s; equal within the noise at 64 and 256 KiB; README
    // "Zero-hop writes"). Refused before the responder's checks, which would be wasted on it.
    if (!stable && length > kZeroHopMaxBytes) return false;
    PeerTable::RegionUse use;
    const ZeroHopTarget target = zero_hop_admit(queue_pair, request, length, kRemoteWrite, use);
    if (target.table == nullptr) return false;
    const PublishedRegionView& region = *use.entry();
    // Into the target's arena from stable memory: a memcpy into the mapping, no system call.
    if (std::uint8_t* mapped = target.table->arena_range(region.arena_offset, region.length);
        mapped != nullptr && stable) {
        copy_in_order(mapped + (request.remote_addr - region.addr), local, local_count, length);
        use.release();
        count_one(statistics.zero_hop_writes);
        count_one(statistics.zero_hop_arena_writes);
        return true;
    }
    // Stable, but the target's memory is not in its arena: by system call.
    if (length > kZeroHopMaxBytes) return false;
    const iovec destination{reinterpret_cast<void*>(request.remote_addr), static_cast<std::size_t>(length)};
    const int error = move_zero_hop(target, queue_pair, true, local, local_count, destination, length);
    use.release();
    if (error != 0) return false;
    count_one(statistics.zero_hop_writes);
    return true;
}

bool Requester::zero_hop_read(QueuePairContext& queue_pair, const wire::Request& request, const MemorySegments& targets,
                               std::uint64_t length) {
    if (!settings.zero_hop_enabled || request.opcode != kOpcodeRdmaRead || targets.size() > wire::kMaxSegments) return false;
    iovec local[wire::kMaxSegments];
    std::size_t local_count = 0;
    for (auto [address, bytes] : targets) local[local_count++] = {address, bytes};
    const bool stable = in_own_arena(local, local_count);  // no target can be unmapped under a store
    // By system call, within the same bound as writes (the request path moves larger ones on
    // the target's thread): refused before the responder's checks.
    if (!stable && length > kZeroHopMaxBytes) return false;
    PeerTable::RegionUse use;
    const ZeroHopTarget target = zero_hop_admit(queue_pair, request, length, kRemoteRead, use);
    if (target.table == nullptr) return false;
    const PublishedRegionView& region = *use.entry();
    // From the target's arena into ours: memcpys, no system call.
    if (std::uint8_t* mapped = target.table->arena_range(region.arena_offset, region.length);
        mapped != nullptr && stable) {
        const std::uint8_t* source = mapped + (request.remote_addr - region.addr);
        for (std::size_t i = 0; i < local_count; ++i) {
            dma_copy(local[i].iov_base, source, local[i].iov_len);
            source += local[i].iov_len;
        }
        use.release();
        count_one(statistics.zero_hop_reads);
        count_one(statistics.zero_hop_arena_reads);
        return true;
    }
    // Stable, but the target's memory is not in its arena: by system call.
    if (length > kZeroHopMaxBytes) return false;
    const iovec source{reinterpret_cast<void*>(request.remote_addr), static_cast<std::size_t>(length)};
    const int error = move_zero_hop(target, queue_pair, false, local, local_count, source, length);
    use.release();
    if (error != 0) return false;
    count_one(statistics.zero_hop_reads);
    return true;
}

bool Requester::zero_hop_atomic(QueuePairContext& queue_pair, const wire::Request& request, const MemorySegments& targets) {
    const bool fetch_and_add = request.opcode == kOpcodeAtomicFetchAndAdd;
    if (!settings.zero_hop_enabled || (!fetch_and_add && request.opcode != kOpcodeAtomicCompareAndSwap)) return false;
    // A misaligned word is the responder's error to report (remote invalid request).
    if (request.remote_addr % 8 != 0 || targets.size() > wire::kMaxSegments) return false;
    iovec local[wire::kMaxSegments];
    std::size_t local_count = 0;
    for (auto [address, bytes] : targets) local[local_count++] = {address, bytes};
    if (!in_own_arena(local, local_count)) return false;  // the result is stored by plain stores
    PeerTable::RegionUse use;
    const ZeroHopTarget target = zero_hop_admit(queue_pair, request, 8, kRemoteAtomic, use);
    if (target.table == nullptr) return false;
    const PublishedRegionView& region = *use.entry();
    // Only an instruction on the same memory is atomic with the target's own atomics: a word
    // outside the target's arena (no shared mapping) goes the request path.
    std::uint8_t* mapped = target.table->arena_range(region.arena_offset, region.length);
    if (mapped == nullptr) {
        use.release();
        return false;
    }
    auto* word = reinterpret_cast<std::uint64_t*>(mapped + (request.remote_addr - region.addr));
    // The responder's operation exactly: the operands in host byte order, the original value
    // returned as the response's payload carries it.
    const std::uint64_t original = perform_atomic(word, request, fetch_and_add);
    use.release();
    const auto* bytes = reinterpret_cast<const std::uint8_t*>(&original);
    for (std::size_t i = 0; i < local_count; ++i) {
        dma_copy(local[i].iov_base, bytes, local[i].iov_len);
        bytes += local[i].iov_len;
    }
    count_one(statistics.zero_hop_atomics);
    return true;
}

}  // namespace rdmachan::soft
