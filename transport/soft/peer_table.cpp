// A peer's mapping of a device's published table (peer_table.hpp).
#include "transport/soft/peer_table.hpp"

#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "transport/soft/same_host.hpp"
#include "transport/soft/shared_arena.hpp"

namespace rdmachan::soft {
namespace {

constexpr int kReadAttempts = 64;  // a writer holds an entry for a few stores; then the request path

// The reader's half: copies the fields; false when a writer was in the middle or came between.
template <typename Entry, typename Copy>
bool read_entry(const Entry& entry, Copy copy) {
    for (int attempt = 0; attempt < kReadAttempts; ++attempt) {
        const std::uint32_t before = entry.sequence.load(std::memory_order_acquire);
        if ((before & 1) != 0) continue;
        copy();
        std::atomic_thread_fence(std::memory_order_acquire);
        if (entry.sequence.load(std::memory_order_relaxed) == before) return true;
    }
    return false;
}

}  // namespace

PeerTable::PeerTable(const PeerProcess& peer, int descriptor) {
    if (descriptor < 0) {
        why_not_ = "the peer publishes no table";
        return;
    }
    const std::uint32_t pid = peer.pid();
    const int opened = static_cast<int>(::syscall(SYS_pidfd_getfd, peer.descriptor(), descriptor, 0));  // close-on-exec
    if (opened < 0) {
        why_not_ = "its table's descriptor cannot be taken with pidfd_getfd (ptrace access refused?)";
        return;
    }
    struct stat status{};
    void* mapped = MAP_FAILED;
    if (::fstat(opened, &status) == 0 && static_cast<std::size_t>(status.st_size) == kPublishedLayoutBytes) {
        mapped = ::mmap(nullptr, kPublishedLayoutBytes, PROT_READ | PROT_WRITE, MAP_SHARED, opened, 0);
    }
    ::close(opened);
    if (mapped == MAP_FAILED) {
        why_not_ = "its table has another size or cannot be mapped";
        return;
    }
    auto* layout = static_cast<PublishedLayout*>(mapped);
    if (__atomic_load_n(&layout->magic, __ATOMIC_ACQUIRE) != kPublishedMagic || layout->version != kPublishedVersion ||
        layout->pid != pid || layout->region_slots != kPublishedRegionSlots ||
        layout->queue_pair_slots != kPublishedQueuePairSlots || layout->holder_slots != kPublishedHolderSlots) {
        ::munmap(mapped, kPublishedLayoutBytes);
        why_not_ = "its table is of another version or another process";
        return;
    }
    layout_ = layout;
    if (!claim_holder()) {
        layout_ = nullptr;
        ::munmap(mapped, kPublishedLayoutBytes);
        why_not_ = "every holder slot of its table is taken";
        return;
    }
    peer_ = &peer;
    receive_lock_ = ReceiveLock(layout_);
}

PeerTable::PeerTable(PublishedTable& own, const SharedArena& arena) : own_arena_(&arena) {
    layout_ = own.layout_;
    if (layout_ == nullptr || !claim_holder()) {
        layout_ = nullptr;
        why_not_ = own.layout_ == nullptr ? "this device publishes no table" : "every holder slot of its table is taken";
        return;
    }
    receive_lock_ = ReceiveLock(layout_);
}

bool PeerTable::claim_holder() {
    // A free slot, else one whose process exited (its key, if any, with it: no thread of a
    // process that exited is in a write).
    const auto mine = static_cast<std::uint32_t>(::getpid());
    for (int pass = 0; pass < 2; ++pass) {
        for (PublishedHolder& holder : layout_->holders) {
            std::uint32_t owner = holder.pid.load(std::memory_order_acquire);
            if (owner != 0 && (pass == 0 || !process_exited(owner))) continue;
            // Win the slot first, then clear the key: a slot's key is only ever stored by its owner.
            if (holder.pid.compare_exchange_strong(owner, mine, std::memory_order_acq_rel)) {
                holder.holding.store(0, std::memory_order_release);
                holder_ = &holder;
                return true;
            }
        }
    }
    return false;
}

PeerTable::~PeerTable() {
    if (holder_ != nullptr) {
        holder_->holding.store(0, std::memory_order_release);
        holder_->pid.store(0, std::memory_order_release);
    }
    for (const auto& entry : event_descriptors_) ::close(entry.second);
    if (own_arena_ != nullptr) return;  // this process's own table and arena: nothing of ours mapped
    if (arena_ != nullptr) ::munmap(arena_, kArenaReserveBytes);
    if (layout_ != nullptr) ::munmap(layout_, kPublishedLayoutBytes);
}

std::uint8_t* PeerTable::arena_range(std::uint64_t arena_offset, std::uint64_t length) {
    if (arena_offset == 0) return nullptr;
    const std::uint64_t offset = arena_offset - 1;
    // Below the size the target published after growing its file (and so below the file's real
    // size, which never shrinks): the mapping never reaches past the file's end there.
    const std::uint64_t size = layout_->arena_size.load(std::memory_order_acquire);
    if (offset > size || length > size - offset) return nullptr;
    if (own_arena_ != nullptr) {
        std::uint8_t* base = own_arena_->base();
        return base == nullptr ? nullptr : base + offset;
    }
    if (arena_ == nullptr) {
        if (arena_failed_) return nullptr;
        const std::uint32_t descriptor = layout_->arena_descriptor.load(std::memory_order_acquire);
        if (descriptor == 0) return nullptr;
        arena_failed_ = true;  // until it is mapped: a failure is not retried on every write
        const int opened = static_cast<int>(::syscall(SYS_pidfd_getfd, peer_->descriptor(), static_cast<int>(descriptor - 1), 0));
        if (opened < 0) return nullptr;
        struct stat status{};
        void* mapped = MAP_FAILED;
        // The arena's file: never larger than the reservation, at least as large as published.
        if (::fstat(opened, &status) == 0 && static_cast<std::uint64_t>(status.st_size) <= kArenaReserveBytes &&
            static_cast<std::uint64_t>(status.st_size) >= size) {
            mapped = ::mmap(nullptr, kArenaReserveBytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, opened, 0);
        }
        ::close(opened);
        if (mapped == MAP_FAILED) return nullptr;
        arena_ = static_cast<std::uint8_t*>(mapped);
        arena_failed_ = false;
    }
    return arena_ + offset;
}

int PeerTable::event_descriptor(std::uint32_t published) {
    if (published == 0) return -1;
    if (own_arena_ != nullptr) return static_cast<int>(published - 1);  // this process's own
    for (const auto& [number, descriptor] : event_descriptors_) {
        if (number == published) return descriptor;
    }
    const int opened = static_cast<int>(::syscall(SYS_pidfd_getfd, peer_->descriptor(), static_cast<int>(published - 1), 0));
    if (opened < 0) return -1;
    event_descriptors_.emplace_back(published, opened);
    return opened;
}

std::optional<PublishedQueuePairView> PeerTable::read_queue_pair(std::uint32_t qpn) const {
    const PublishedQueuePair& slot = layout_->queue_pairs[qpn % kPublishedQueuePairSlots];
    PublishedQueuePairView view;
    const bool consistent = read_entry(slot, [&] {
        view.qpn = slot.qpn.load(std::memory_order_relaxed);
        view.state = slot.state.load(std::memory_order_relaxed);
        view.access = slot.access.load(std::memory_order_relaxed);
        view.protection_domain = slot.protection_domain.load(std::memory_order_relaxed);
        view.remote_qpn = slot.remote_qpn.load(std::memory_order_relaxed);
        view.remote_lid = static_cast<std::uint16_t>(slot.remote_lid.load(std::memory_order_relaxed));
        for (int i = 0; i < 4; ++i) {
            const std::uint32_t word = slot.remote_gid[i].load(std::memory_order_relaxed);
            std::memcpy(view.remote_gid.data() + 4 * i, &word, 4);
        }
        view.user_index = slot.user_index.load(std::memory_order_relaxed);
        view.receive_queue_offset = slot.receive_queue_offset.load(std::memory_order_relaxed);
        view.receive_wqe_count = slot.receive_wqe_count.load(std::memory_order_relaxed);
        view.receive_stride = slot.receive_stride.load(std::memory_order_relaxed);
        view.doorbell_offset = slot.doorbell_offset.load(std::memory_order_relaxed);
        view.receive_cq_offset = slot.receive_cq_offset.load(std::memory_order_relaxed);
        view.receive_cq_doorbell_offset = slot.receive_cq_doorbell_offset.load(std::memory_order_relaxed);
        view.receive_cqe_count = slot.receive_cqe_count.load(std::memory_order_relaxed);
        view.receive_cqe_size = slot.receive_cqe_size.load(std::memory_order_relaxed);
        view.transport = slot.transport.load(std::memory_order_relaxed);
        view.dc_key = slot.dc_key.load(std::memory_order_relaxed);
        view.receive_protection_domain = slot.receive_protection_domain.load(std::memory_order_relaxed);
        view.receive_cq_event_descriptor = slot.receive_cq_event_descriptor.load(std::memory_order_relaxed);
    });
    if (!consistent || view.qpn != qpn) return std::nullopt;
    return view;
}

void PeerTable::use_region(std::uint32_t key, RegionUse& use) const {
    use.release();
    PublishedRegion& slot = layout_->regions[(key >> 8) % kPublishedRegionSlots];
    // Relaxed: the fence below orders it before the entry's loads (on x86 a seq_cst store would
    // be a second full barrier).
    holder_->holding.store(key, std::memory_order_relaxed);
    use.holder_ = holder_;
    // Pairs with unpublish_region's fence (see there).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    PublishedRegionView view;
    const bool consistent = read_entry(slot, [&] {
        view.key = slot.key.load(std::memory_order_relaxed);
        view.protection_domain = slot.protection_domain.load(std::memory_order_relaxed);
        view.access = slot.access.load(std::memory_order_relaxed);
        view.addr = slot.addr.load(std::memory_order_relaxed);
        view.length = slot.length.load(std::memory_order_relaxed);
        view.arena_offset = slot.arena_offset.load(std::memory_order_relaxed);
    });
    if (consistent && view.key == key && key != 0) use.entry_ = view;
}

void PeerTable::RegionUse::release() {
    if (holder_ != nullptr) holder_->holding.store(0, std::memory_order_release);
    holder_ = nullptr;
    entry_.reset();
}

}  // namespace rdmachan::soft
