// The zero-hop write's shared table, the target's side: it writes the entries under seqlocks
// (published_table.hpp says why each step is there); its peers read them (peer_table.cpp).
#include "transport/soft/published_table.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {
namespace {

// The writer's half of a seqlock: odd while the fields change. Only one writer per table (the
// device mutex), so a plain load of the counter is enough.
template <typename Entry, typename Change>
void write_entry(Entry& entry, Change change) {
    const std::uint32_t sequence = entry.sequence.load(std::memory_order_relaxed);
    entry.sequence.store(sequence + 1, std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_release);
    change();
    entry.sequence.store(sequence + 2, std::memory_order_release);
}

// Every table of this process, for mark_partitioned (fault injection; control plane only).
std::mutex tables_mutex;
std::vector<PublishedLayout*> tables;
bool tables_partitioned = false;

}  // namespace

void PublishedTable::mark_partitioned(bool partitioned) {
    std::lock_guard lock(tables_mutex);
    tables_partitioned = partitioned;
    for (PublishedLayout* layout : tables) layout->partitioned.store(partitioned ? 1 : 0, std::memory_order_release);
}

PublishedTable::PublishedTable() {
    descriptor_ = ::memfd_create("rdmachan-soft-table", MFD_CLOEXEC);
    if (descriptor_ < 0) {
        why_not_ = "memfd_create failed";
        return;
    }
    if (::ftruncate(descriptor_, static_cast<off_t>(kPublishedLayoutBytes)) != 0) {
        why_not_ = "ftruncate of the memfd failed";
        ::close(descriptor_);
        descriptor_ = -1;
        return;
    }
    void* mapped = ::mmap(nullptr, kPublishedLayoutBytes, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor_, 0);
    if (mapped == MAP_FAILED) {
        why_not_ = "mmap of the memfd failed";
        ::close(descriptor_);
        descriptor_ = -1;
        return;
    }
    // A fresh memfd reads as zeros: every entry empty, every counter 0 (atomics of these widths
    // are lock-free and zero is their value).
    layout_ = static_cast<PublishedLayout*>(mapped);
    receive_lock_ = ReceiveLock(layout_);
    layout_->pid = static_cast<std::uint32_t>(::getpid());
    layout_->region_slots = kPublishedRegionSlots;
    layout_->queue_pair_slots = kPublishedQueuePairSlots;
    layout_->holder_slots = kPublishedHolderSlots;
    layout_->version = kPublishedVersion;
    {
        std::lock_guard lock(tables_mutex);
        layout_->partitioned.store(tables_partitioned ? 1 : 0, std::memory_order_relaxed);
        tables.push_back(layout_);
    }
    __atomic_store_n(&layout_->magic, kPublishedMagic, __ATOMIC_RELEASE);
}

PublishedTable::~PublishedTable() {
    if (layout_ != nullptr) {
        std::lock_guard lock(tables_mutex);
        std::erase(tables, layout_);
    }
    if (layout_ != nullptr) ::munmap(layout_, kPublishedLayoutBytes);
    if (descriptor_ >= 0) ::close(descriptor_);
}

void PublishedTable::publish_region(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr,
                                    std::uint64_t length, std::uint32_t access, std::uint64_t arena_offset) {
    if (layout_ == nullptr) return;
    PublishedRegion& slot = layout_->regions[(key >> 8) % kPublishedRegionSlots];
    const std::uint32_t held = slot.key.load(std::memory_order_relaxed);
    if (held != 0 && held != key) return;  // another live region: this one takes the request path
    write_entry(slot, [&] {
        slot.protection_domain.store(protection_domain, std::memory_order_relaxed);
        slot.access.store(access, std::memory_order_relaxed);
        slot.addr.store(addr, std::memory_order_relaxed);
        slot.length.store(length, std::memory_order_relaxed);
        slot.arena_offset.store(arena_offset, std::memory_order_relaxed);
        slot.key.store(key, std::memory_order_relaxed);
    });
}

void PublishedTable::publish_arena(const SharedArena& arena) {
    const int descriptor = arena.descriptor();
    const std::uint64_t file_size = arena.file_size();
    if (layout_ == nullptr || descriptor < 0) return;
    arena_ = &arena;
    // The size first: a peer that sees the descriptor (acquire) sees a size at least this one.
    layout_->arena_size.store(file_size, std::memory_order_release);
    layout_->arena_descriptor.store(static_cast<std::uint32_t>(descriptor) + 1, std::memory_order_release);
}

bool PublishedTable::unpublish_region(std::uint32_t key) {
    if (layout_ == nullptr) return false;
    PublishedRegion& slot = layout_->regions[(key >> 8) % kPublishedRegionSlots];
    if (slot.key.load(std::memory_order_relaxed) != key) return false;
    write_entry(slot, [&] { slot.key.store(0, std::memory_order_relaxed); });
    // Pairs with the reader's fence between storing the key in its holder slot and reading the
    // entry: either that reader sees the key gone, or wait_unused sees its slot holding it.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return true;
}

std::uint32_t PublishedTable::wait_unused(std::uint32_t key, int deadline_ms) {
    if (layout_ == nullptr || key == 0) return 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
    for (PublishedHolder& holder : layout_->holders) {
        for (std::uint32_t spins = 0; holder.holding.load(std::memory_order_acquire) == key; ++spins) {
            const std::uint32_t pid = holder.pid.load(std::memory_order_acquire);
            // A write holds the key for one process_vm_writev: usually microseconds. Asking
            // whether its process exited costs two system calls: only once it takes longer.
            const bool late = std::chrono::steady_clock::now() > until;
            if ((late || (spins >= 64 && spins % 64 == 0)) && process_exited(pid)) {
                // Died between its check and the end of its write: reclaim the slot (key first,
                // then the pid, so a process claiming it finds it empty).
                std::uint32_t expected = key;
                holder.holding.compare_exchange_strong(expected, 0, std::memory_order_acq_rel);
                std::uint32_t owner = pid;
                holder.pid.compare_exchange_strong(owner, 0, std::memory_order_acq_rel);
                break;
            }
            if (late) return pid;
            if (spins < 64) std::this_thread::yield();
            else std::this_thread::sleep_for(std::chrono::microseconds(50));
        }
    }
    return 0;
}

std::uint32_t PublishedTable::holder_of(std::uint32_t key) const {
    if (layout_ == nullptr || key == 0) return 0;
    for (const PublishedHolder& holder : layout_->holders) {
        if (holder.holding.load(std::memory_order_acquire) == key) return holder.pid.load(std::memory_order_acquire);
    }
    return 0;
}

void PublishedTable::publish_queue_pair(const QueuePairContext& queue_pair) {
    const bool dc_target = queue_pair.transport == Transport::dc_target;
    if (layout_ == nullptr || (queue_pair.transport != Transport::reliable_connected && !dc_target)) return;
    PublishedQueuePair& slot = layout_->queue_pairs[queue_pair.qpn % kPublishedQueuePairSlots];
    const std::uint32_t held = slot.qpn.load(std::memory_order_relaxed);
    if (held != 0 && held != queue_pair.qpn) return;  // taken: this QP's writes take the request path
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    // Where the receive side lies in the arena, for zero-hop receives: all of it, or none. An RC
    // QP's own receive queue (an RC QP on an SRQ: none); a DCT's SRQ.
    const CompletionQueueContext& receive_cq = *queue_pair.recv_cq;
    SharedReceiveQueueContext* const srq = dc_target ? queue_pair.srq : nullptr;
    // The WQEs and the doorbell block, and where in them the queue and the record start.
    struct {
        const AlignedBuffer* rings = nullptr;
        const AlignedBuffer* doorbell = nullptr;
        const void* queue = nullptr;
        const void* record = nullptr;
        std::uint32_t wqe_count = 0;
        std::uint32_t stride = 0;
    } side;
    if (srq != nullptr) {
        side = {srq->buffer.get(), srq->doorbell.get(), srq->ring.buffer, srq->ring.doorbell_record, srq->ring.wqe_count,
                srq->ring.stride};
    } else if (!dc_target) {
        side = {queue_pair.buffer.get(), queue_pair.buffer.get(), queue_pair.receive_ring.buffer,
                queue_pair.receive_ring.doorbell_record, queue_pair.receive_ring.wqe_count, queue_pair.receive_ring.stride};
    }
    const bool shared_receives = side.rings != nullptr && side.doorbell != nullptr && (dc_target || queue_pair.srq == nullptr) &&
                                 side.wqe_count != 0 && side.rings->arena_offset != 0 && side.doorbell->arena_offset != 0 &&
                                 receive_cq.buffer->arena_offset != 0;
    auto offset_in = [](const AlignedBuffer& buffer, const void* address) {
        return buffer.arena_offset + static_cast<std::uint64_t>(static_cast<const std::uint8_t*>(address) - buffer.data);
    };
    // Before the entry that lets peers write it (both under the device mutex, as every CQE write
    // and every consumption of an SRQ's WQE).
    if (shared_receives) {
        queue_pair.recv_cq->peer_writable = true;
        if (srq != nullptr) srq->peer_consumable = true;
    }
    const ReceiveGuard guard(*this);
    write_entry(slot, [&] {
        slot.state.store(static_cast<std::uint32_t>(queue_pair.state), std::memory_order_relaxed);
        slot.access.store(queue_pair.access, std::memory_order_relaxed);
        slot.protection_domain.store(queue_pair.protection_domain, std::memory_order_relaxed);
        slot.remote_qpn.store(remote.qpn, std::memory_order_relaxed);
        slot.remote_lid.store(remote.lid, std::memory_order_relaxed);
        for (int i = 0; i < 4; ++i) {
            std::uint32_t word;
            std::memcpy(&word, remote.gid.data() + 4 * i, 4);
            slot.remote_gid[i].store(word, std::memory_order_relaxed);
        }
        slot.user_index.store(queue_pair.user_index, std::memory_order_relaxed);
        slot.receive_wqe_count.store(shared_receives ? side.wqe_count : 0, std::memory_order_relaxed);
        slot.receive_stride.store(side.stride, std::memory_order_relaxed);
        slot.receive_queue_offset.store(shared_receives ? offset_in(*side.rings, side.queue) : 0, std::memory_order_relaxed);
        slot.doorbell_offset.store(shared_receives ? offset_in(*side.doorbell, side.record) : 0, std::memory_order_relaxed);
        slot.receive_protection_domain.store(srq != nullptr ? srq->protection_domain : queue_pair.protection_domain,
                                             std::memory_order_relaxed);
        slot.receive_cq_offset.store(shared_receives ? offset_in(*receive_cq.buffer, receive_cq.ring.buffer) : 0,
                                     std::memory_order_relaxed);
        slot.receive_cq_doorbell_offset.store(
            shared_receives ? offset_in(*receive_cq.buffer, receive_cq.ring.doorbell_record) : 0, std::memory_order_relaxed);
        slot.receive_cqe_count.store(receive_cq.ring.cqe_count, std::memory_order_relaxed);
        slot.receive_cqe_size.store(receive_cq.ring.cqe_size, std::memory_order_relaxed);
        slot.receive_cq_event_descriptor.store(
            shared_receives && receive_cq.event_descriptor >= 0 ? static_cast<std::uint32_t>(receive_cq.event_descriptor) + 1 : 0,
            std::memory_order_relaxed);
        slot.transport.store(dc_target ? kPublishedDcTarget : kPublishedReliableConnected, std::memory_order_relaxed);
        slot.dc_key.store(dc_target ? queue_pair.dc_access_key : 0, std::memory_order_relaxed);
        slot.qpn.store(queue_pair.qpn, std::memory_order_relaxed);
    });
}

void PublishedTable::unpublish_queue_pair(std::uint32_t qpn) {
    if (layout_ == nullptr) return;
    PublishedQueuePair& slot = layout_->queue_pairs[qpn % kPublishedQueuePairSlots];
    if (slot.qpn.load(std::memory_order_relaxed) != qpn) return;
    const ReceiveGuard guard(*this);
    write_entry(slot, [&] { slot.qpn.store(0, std::memory_order_relaxed); });
}

PublishedTable::ReceiveGuard::ReceiveGuard(PublishedTable& table, bool needed)
    : table_(needed && table.layout_ != nullptr ? &table : nullptr) {
    if (table_ == nullptr) return;
    if (table_->receive_lock_.lock_waiting(table_->arena_)) table_->takeovers_.fetch_add(1, std::memory_order_relaxed);
}

PublishedTable::ReceiveGuard::~ReceiveGuard() {
    if (table_ != nullptr) table_->receive_lock_.unlock();
}

bool PublishedTable::take_over_receive_lock(std::uint32_t pid) {
    if (layout_ == nullptr || pid == 0 || !receive_lock_.take_over_from(pid, arena_)) return false;
    takeovers_.fetch_add(1, std::memory_order_relaxed);
    receive_lock_.unlock();
    return true;
}

}  // namespace rdmachan::soft
