// The memory translation tables (memory_translation.hpp): regions, indirect keys, and the
// translation of an access into host memory pieces. UMR WQEs that configure indirect keys are
// decoded in indirect_keys.cpp.
#include "transport/soft/memory_translation.hpp"

#include <algorithm>

#include "transport/mlx5/work_request.hpp"
#include "transport/soft/device.hpp"

namespace rdmachan::soft {
namespace {

using namespace rdmachan::mlx5;

// Each mkey context access bit: the access right it grants through the key, and what it needs
// from every region the key maps (writing through a key writes the region locally too).
struct KeyAccessBit {
    std::uint8_t key_bit;
    std::uint32_t grants;
    std::uint32_t region_needs;
};
constexpr KeyAccessBit kKeyAccessBits[] = {
    {kMemoryKeyLocalWrite, kLocalWrite, kLocalWrite},
    {kMemoryKeyRemoteRead, kRemoteRead, kRemoteRead},
    {kMemoryKeyRemoteWrite, kRemoteWrite, kRemoteWrite | kLocalWrite},
    {kMemoryKeyAtomic, kRemoteAtomic, kRemoteAtomic | kLocalWrite},
};

// The mkey context access bits an access needing `needed_access` asks of the key (local read is
// always granted).
std::uint8_t key_access_for(std::uint32_t needed_access) {
    std::uint8_t bits = 0;
    for (const KeyAccessBit& bit : kKeyAccessBits) {
        if ((needed_access & bit.grants) != 0) bits |= bit.key_bit;
    }
    return bits;
}

}  // namespace

std::uint32_t MemoryTranslation::region_access_for_key(std::uint8_t key_access) {
    std::uint32_t needed = 0;
    for (const KeyAccessBit& bit : kKeyAccessBits) {
        if ((key_access & bit.key_bit) != 0) needed |= bit.region_needs;
    }
    return needed;
}

std::optional<MemoryRegionState> MemoryTranslation::remove_region(std::uint32_t key) {
    const auto found = regions_.find(key);
    if (found == regions_.end()) return std::nullopt;
    const MemoryRegionState region = found->second;
    regions_.erase(found);
    return region;
}

const IndirectKeyState* MemoryTranslation::indirect_key(std::uint32_t key) const {
    const auto found = indirect_keys_.find(key);
    return found == indirect_keys_.end() ? nullptr : &found->second;
}

const MemoryRegionState* MemoryTranslation::find_region(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr,
                                                 std::uint64_t length, std::uint32_t needed_access) const {
    auto found = regions_.find(key);
    if (found == regions_.end()) return nullptr;
    return found->second.admits(protection_domain, addr, length, needed_access) ? &found->second : nullptr;
}

bool MemoryTranslation::translate(std::uint32_t key, std::uint32_t protection_domain, std::uint64_t addr,
                                  std::uint64_t length, std::uint32_t needed_access, MemorySegments& segments) const {
    if (find_region(key, protection_domain, addr, length, needed_access) != nullptr) {
        if (length != 0) segments.emplace_back(reinterpret_cast<std::uint8_t*>(addr), static_cast<std::uint32_t>(length));
        return true;
    }
    auto found = indirect_keys_.find(key);
    if (found == indirect_keys_.end()) return false;
    const IndirectKeyState& state = found->second;
    const std::uint8_t needed_bits = key_access_for(needed_access);
    if (!state.configured || state.protection_domain != protection_domain || (state.access & needed_bits) != needed_bits) {
        return false;
    }
    if (addr > state.length || length > state.length - addr) return false;
    const std::size_t first = segments.size();
    auto piece = [&](const IndirectEntry& entry, std::uint64_t target, std::uint64_t bytes) {
        // The region is checked again at every use: it may have been deregistered since.
        if (find_region(entry.key, protection_domain, target, bytes, needed_access) == nullptr) return false;
        segments.emplace_back(reinterpret_cast<std::uint8_t*>(target), static_cast<std::uint32_t>(bytes));
        return true;
    };
    std::uint64_t position = addr;
    std::uint64_t remaining = length;
    if (!state.interleaved) {
        std::uint64_t start = 0;  // where the current entry begins in the key
        for (const IndirectEntry& entry : state.entries) {
            if (remaining == 0) break;
            const std::uint64_t end = start + entry.byte_count;
            if (position < end) {
                const std::uint64_t within = position - start;
                const std::uint64_t bytes = std::min<std::uint64_t>(remaining, entry.byte_count - within);
                if (!piece(entry, entry.addr + within, bytes)) break;
                position += bytes;
                remaining -= bytes;
            }
            start = end;
        }
    } else {
        while (remaining != 0 && state.pattern_bytes != 0) {
            const std::uint64_t repetition = position / state.pattern_bytes;
            std::uint64_t within = position % state.pattern_bytes;
            const IndirectEntry* entry = state.entries.data();
            while (within >= entry->byte_count) within -= (entry++)->byte_count;  // zero-length entries skipped
            const std::uint64_t bytes = std::min<std::uint64_t>(remaining, entry->byte_count - within);
            if (!piece(*entry, entry->addr + repetition * entry->stride + within, bytes)) break;
            position += bytes;
            remaining -= bytes;
        }
    }
    if (remaining != 0) {
        segments.resize(first);  // nothing of a refused access is used
        return false;
    }
    return true;
}

}  // namespace rdmachan::soft
