// Several operations to one peer, posted together under one doorbell. Only the last one asks
// for a completion, so a batch costs the NIC one CQE and the CPU one poll; if an earlier one
// fails, the batch's result is that failure.
//
//   rdmachan::WorkBatch batch;
//   for (auto& piece : pieces) batch.write(piece.local, piece.remote);
//   channel.execute(batch);          // or s.post_batch(batch) in a scope, channel.post_batch(batch)
//
// A batch is a reusable list (clear() keeps its storage): build it once, post it many times.
// Its buffers follow the same rule as every operation's: valid until the batch completes.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "rdmachan/memory.hpp"

namespace rdmachan {

class WorkBatch {
public:
    enum class Kind : std::uint8_t { send, write, read };
    struct Entry {
        Kind kind = Kind::write;
        std::uint64_t local_addr = 0;
        std::uint32_t local_length = 0;
        std::uint32_t lkey = 0;
        bool zero_based = false;  // the local side is a layout's slice: never inline
        std::uint64_t remote_addr = 0;
        std::uint32_t rkey = 0;
        std::optional<std::uint32_t> immediate;
    };

    WorkBatch() = default;
    explicit WorkBatch(std::size_t capacity) { entries_.reserve(capacity); }
    // A copy has the same entries and so the same version; a moved-from batch gets a new one.
    WorkBatch(const WorkBatch&) = default;
    WorkBatch& operator=(const WorkBatch&) = default;
    WorkBatch(WorkBatch&& other) noexcept;
    WorkBatch& operator=(WorkBatch&& other) noexcept;

    // Each checks its arguments like the single operation does (rdmachan::Error otherwise).
    WorkBatch& send(const LocalSlice& local, std::optional<std::uint32_t> immediate = std::nullopt);
    WorkBatch& write(const LocalSlice& local, const RemoteMemoryRegion& remote,
                     std::optional<std::uint32_t> immediate = std::nullopt);
    WorkBatch& read(const LocalSlice& local, const RemoteMemoryRegion& remote);

    std::size_t size() const { return entries_.size(); }
    bool empty() const { return entries_.empty(); }
    void clear();
    const std::vector<Entry>& entries() const { return entries_; }
    // Names the entries as they are now: every change gives the batch a number no batch of the
    // process had before (0: none yet). A channel that posts the same version again reuses the
    // work requests it converted the batch into last time instead of converting it again.
    std::uint64_t version() const { return version_; }

private:
    std::vector<Entry> entries_;
    std::uint64_t version_ = 0;
};

}  // namespace rdmachan
