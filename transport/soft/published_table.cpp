// The zero-hop write's shared table: the target writes its entries under seqlocks, peers map it
// and read them (published_table.hpp says why each step is there).
#include "transport/soft/published_table.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {
namespace {

constexpr int kReadAttempts = 64;  // a writer holds an entry for a few stores; then the request path

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

constexpr std::size_t kLayoutBytes = (sizeof(PublishedLayout) + 4095) & ~std::size_t{4095};

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
    if (::ftruncate(descriptor_, static_cast<off_t>(kLayoutBytes)) != 0) {
        why_not_ = "ftruncate of the memfd failed";
        ::close(descriptor_);
        descriptor_ = -1;
        return;
    }
    void* mapped = ::mmap(nullptr, kLayoutBytes, PROT_READ | PROT_WRITE, MAP_SHARED, descriptor_, 0);
    if (mapped == MAP_FAILED) {
        why_not_ = "mmap of the memfd failed";
        ::close(descriptor_);
        descriptor_ = -1;
        return;
    }
    // A fresh memfd reads as zeros: every entry empty, every counter 0 (atomics of these widths
    // are lock-free and zero is their value).
    layout_ = static_cast<PublishedLayout*>(mapped);
    layout_->pid = static_cast<std::uint32_t>(::getpid());
    layout_->region_slots = kPublishedRegionSlots;
    layout_->queue_pair_slots = kPublishedQueuePairSlots;
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
    if (layout_ != nullptr) ::munmap(layout_, kLayoutBytes);
    if (descriptor_ >= 0) ::close(descriptor_);
}

void PublishedTable::publish_region(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr,
                                    std::uint64_t length, std::uint32_t access) {
    if (layout_ == nullptr) return;
    PublishedRegion& slot = layout_->regions[(key >> 8) % kPublishedRegionSlots];
    const std::uint32_t held = slot.key.load(std::memory_order_relaxed);
    if (held != 0 && held != key) return;  // another live region: this one takes the request path
    write_entry(slot, [&] {
        slot.protection_domain.store(protection_domain, std::memory_order_relaxed);
        slot.access.store(access, std::memory_order_relaxed);
        slot.addr.store(addr, std::memory_order_relaxed);
        slot.length.store(length, std::memory_order_relaxed);
        slot.key.store(key, std::memory_order_relaxed);
    });
}

PublishedRegion* PublishedTable::unpublish_region(std::uint32_t key) {
    if (layout_ == nullptr) return nullptr;
    PublishedRegion& slot = layout_->regions[(key >> 8) % kPublishedRegionSlots];
    if (slot.key.load(std::memory_order_relaxed) != key) return nullptr;
    write_entry(slot, [&] { slot.key.store(0, std::memory_order_relaxed); });
    // Pairs with the reader's fence between raising the in-use counter and reading the entry:
    // either that reader sees the key gone, or wait_unused sees its count.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    return &slot;
}

bool PublishedTable::wait_unused(PublishedRegion& slot, int deadline_ms) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(deadline_ms);
    for (std::uint32_t spins = 0; slot.users.load(std::memory_order_acquire) != 0; ++spins) {
        if (std::chrono::steady_clock::now() > until) return false;
        // A write holds the slot for one process_vm_writev: usually a few microseconds.
        if (spins < 64) std::this_thread::yield();
        else std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    return true;
}

void PublishedTable::publish_queue_pair(const QueuePairContext& queue_pair) {
    if (layout_ == nullptr || queue_pair.transport != Transport::reliable_connected) return;
    PublishedQueuePair& slot = layout_->queue_pairs[queue_pair.qpn % kPublishedQueuePairSlots];
    const std::uint32_t held = slot.qpn.load(std::memory_order_relaxed);
    if (held != 0 && held != queue_pair.qpn) return;  // taken: this QP's writes take the request path
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
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
        slot.qpn.store(queue_pair.qpn, std::memory_order_relaxed);
    });
}

void PublishedTable::unpublish_queue_pair(std::uint32_t qpn) {
    if (layout_ == nullptr) return;
    PublishedQueuePair& slot = layout_->queue_pairs[qpn % kPublishedQueuePairSlots];
    if (slot.qpn.load(std::memory_order_relaxed) != qpn) return;
    write_entry(slot, [&] { slot.qpn.store(0, std::memory_order_relaxed); });
}

PeerTable::PeerTable(std::uint32_t pid, int descriptor) {
    if (descriptor < 0) {
        why_not_ = "the peer publishes no table";
        return;
    }
    const std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(descriptor);
    const int opened = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (opened < 0) {
        why_not_ = "its table cannot be opened through /proc (ptrace access refused?)";
        return;
    }
    struct stat status{};
    void* mapped = MAP_FAILED;
    if (::fstat(opened, &status) == 0 && static_cast<std::size_t>(status.st_size) == kLayoutBytes) {
        mapped = ::mmap(nullptr, kLayoutBytes, PROT_READ | PROT_WRITE, MAP_SHARED, opened, 0);
    }
    ::close(opened);
    if (mapped == MAP_FAILED) {
        why_not_ = "its table has another size or cannot be mapped";
        return;
    }
    auto* layout = static_cast<PublishedLayout*>(mapped);
    if (__atomic_load_n(&layout->magic, __ATOMIC_ACQUIRE) != kPublishedMagic || layout->version != kPublishedVersion ||
        layout->pid != pid || layout->region_slots != kPublishedRegionSlots ||
        layout->queue_pair_slots != kPublishedQueuePairSlots) {
        ::munmap(mapped, kLayoutBytes);
        why_not_ = "its table is of another version or another process";
        return;
    }
    layout_ = layout;
}

PeerTable::~PeerTable() {
    if (layout_ != nullptr) ::munmap(layout_, kLayoutBytes);
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
    });
    if (!consistent || view.qpn != qpn) return std::nullopt;
    return view;
}

void PeerTable::use_region(std::uint32_t key, RegionUse& use) const {
    use.release();
    PublishedRegion& slot = layout_->regions[(key >> 8) % kPublishedRegionSlots];
    slot.users.fetch_add(1, std::memory_order_seq_cst);
    use.slot_ = &slot;
    // Pairs with unpublish_region's fence (see there).
    std::atomic_thread_fence(std::memory_order_seq_cst);
    PublishedRegionView view;
    const bool consistent = read_entry(slot, [&] {
        view.key = slot.key.load(std::memory_order_relaxed);
        view.protection_domain = slot.protection_domain.load(std::memory_order_relaxed);
        view.access = slot.access.load(std::memory_order_relaxed);
        view.addr = slot.addr.load(std::memory_order_relaxed);
        view.length = slot.length.load(std::memory_order_relaxed);
    });
    if (consistent && view.key == key && key != 0) use.entry_ = view;
}

void PeerTable::RegionUse::release() {
    if (slot_ != nullptr) slot_->users.fetch_sub(1, std::memory_order_release);
    slot_ = nullptr;
    entry_.reset();
}

}  // namespace rdmachan::soft
