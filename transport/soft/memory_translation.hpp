// The software device's memory translation tables, as a NIC keeps them: the memory regions and
// the indirect keys by key, and the one check every request, receive and local segment passes
// through (key, protection domain, bounds, access) on its way to host memory. Under the device
// mutex.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>

#include "transport/mlx5/rings.hpp"
#include "transport/soft/indirect_keys.hpp"

namespace rdmachan::soft {

// A registered region as the NIC's tables hold it.
struct MemoryRegionState {
    std::uint32_t protection_domain = 0;
    std::uint64_t addr = 0;
    std::uint64_t length = 0;
    std::uint32_t access = 0;

    // Whether an access of `length` bytes at `addr` from that protection domain, needing every
    // right in `needed_access`, falls in this region.
    bool admits(std::uint32_t from_domain, std::uint64_t at, std::uint64_t bytes, std::uint32_t needed_access) const {
        return from_domain == protection_domain && at >= addr && bytes <= length && at - addr <= length - bytes &&
               (access & needed_access) == needed_access;
    }
};

class MemoryTranslation {
public:
    // The index of a new key (the key is the index << 8 with a tag in the low byte). Index 1 is
    // never handed out: key 0x100 (index 1, tag 0) is MLX5_INVALID_LKEY, which ends a receive
    // WQE's scatter list.
    std::uint32_t allocate_key_index() { return next_key_index_++; }

    void add_region(std::uint32_t key, const MemoryRegionState& region) { regions_[key] = region; }
    // The region `key` named, now removed; nothing when it named none.
    std::optional<MemoryRegionState> remove_region(std::uint32_t key);
    // The region `key` names if [addr, addr + length) lies in it, in that protection domain, with
    // every right in `needed_access`; else nullptr.
    const MemoryRegionState* find_region(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr,
                                         std::uint64_t length, std::uint32_t needed_access) const;

    void add_indirect_key(std::uint32_t key, IndirectKeyState state) { indirect_keys_[key] = std::move(state); }
    void remove_indirect_key(std::uint32_t key) { indirect_keys_.erase(key); }
    const IndirectKeyState* indirect_key(std::uint32_t key) const;

    // The host memory `length` bytes at `addr` through `key` are, appended to `segments`: one
    // piece of a region, or the pieces an indirect key's layout maps them to (zero-based). False,
    // with nothing appended, when the key, a piece's region, the bounds or the access do not allow it.
    bool translate(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr, std::uint64_t length,
                   std::uint32_t needed_access, MemorySegments& segments) const;
    // Whether what translate appended from `first` on is the posted address itself (one piece at
    // `addr`), not an indirect key's pieces: only then may scatter-to-CQE stand for it.
    static bool translated_as_posted(const MemorySegments& segments, std::size_t first, std::uint64_t addr,
                                     std::uint64_t length) {
        return length == 0 || (segments.size() == first + 1 &&
                               segments[first].first == reinterpret_cast<std::uint8_t*>(static_cast<std::uintptr_t>(addr)));
    }

    // A UMR WQE's effect on indirect key `key` (the control segment's immediate), checked against
    // the QP's protection domain: LOCAL_INV frees the key, a key configuration gives it the
    // layout the WQE carries inline. The WQE is `ds` 16-byte units at `wqe_offset` of `ring`.
    // On a refusal the key is unchanged, and the syndrome and why are returned.
    struct Refusal {
        std::uint8_t syndrome = 0;
        std::string why;
    };
    std::optional<Refusal> apply_umr(std::uint32_t protection_domain, std::uint32_t key, const mlx5::SendQueueRing& ring,
                                     std::size_t wqe_offset, std::uint32_t ds);

private:
    // The region rights a key's mkey context access bits need from every region it maps.
    static std::uint32_t region_access_for_key(std::uint8_t key_access);

    std::map<std::uint32_t, MemoryRegionState> regions_;
    std::map<std::uint32_t, IndirectKeyState> indirect_keys_;
    std::uint32_t next_key_index_ = 2;
};

}  // namespace rdmachan::soft
