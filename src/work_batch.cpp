#include "rdmachan/work_batch.hpp"

#include <atomic>
#include <string>
#include <utility>

#include "rdmachan/error.hpp"

namespace rdmachan {
namespace {

// Versions are unique in the process, not per batch: a batch built at the address of a
// destroyed one, with as many changes, still has a version no cached conversion belongs to.
std::uint64_t next_version() {
    static std::atomic<std::uint64_t> counter{0};
    return counter.fetch_add(1, std::memory_order_relaxed) + 1;
}

}  // namespace

WorkBatch::WorkBatch(WorkBatch&& other) noexcept
    : entries_(std::move(other.entries_)), version_(std::exchange(other.version_, next_version())) {
    other.entries_.clear();
}

WorkBatch& WorkBatch::operator=(WorkBatch&& other) noexcept {
    if (this != &other) {
        entries_ = std::move(other.entries_);
        version_ = std::exchange(other.version_, next_version());
        other.entries_.clear();
    }
    return *this;
}

void WorkBatch::clear() {
    entries_.clear();
    version_ = next_version();
}

WorkBatch& WorkBatch::send(const LocalSlice& local, std::optional<std::uint32_t> immediate) {
    Entry entry;
    entry.kind = Kind::send;
    entry.local_addr = local.addr();
    entry.local_length = local.length();
    entry.lkey = local.lkey();
    entry.zero_based = local.zero_based();
    entry.immediate = immediate;
    entries_.push_back(entry);
    version_ = next_version();
    return *this;
}

WorkBatch& WorkBatch::write(const LocalSlice& local, const RemoteMemoryRegion& remote,
                            std::optional<std::uint32_t> immediate) {
    if (local.length() > remote.length) {
        throw Error("WorkBatch::write (entry " + std::to_string(entries_.size()) + "): " +
                    std::to_string(local.length()) + " bytes do not fit the remote region of " +
                    std::to_string(remote.length) + " bytes");
    }
    Entry entry;
    entry.kind = Kind::write;
    entry.local_addr = local.addr();
    entry.local_length = local.length();
    entry.lkey = local.lkey();
    entry.zero_based = local.zero_based();
    entry.remote_addr = remote.addr;
    entry.rkey = remote.rkey;
    entry.immediate = immediate;
    entries_.push_back(entry);
    version_ = next_version();
    return *this;
}

WorkBatch& WorkBatch::read(const LocalSlice& local, const RemoteMemoryRegion& remote) {
    if (local.length() > remote.length) {
        throw Error("WorkBatch::read (entry " + std::to_string(entries_.size()) + "): " +
                    std::to_string(local.length()) + " bytes are more than the remote region's " +
                    std::to_string(remote.length));
    }
    Entry entry;
    entry.kind = Kind::read;
    entry.local_addr = local.addr();
    entry.local_length = local.length();
    entry.lkey = local.lkey();
    entry.zero_based = local.zero_based();
    entry.remote_addr = remote.addr;
    entry.rkey = remote.rkey;
    entries_.push_back(entry);
    version_ = next_version();
    return *this;
}

}  // namespace rdmachan
