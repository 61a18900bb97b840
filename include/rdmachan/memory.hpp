// Registered memory. A MemoryRegion is owned (deregistered when the last handle goes); a
// LocalSlice is a checked piece of one, the only way to hand local memory to an operation; a
// RemoteMemoryRegion is what a peer tells you about its memory, and yields checked sub-regions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>

namespace rdmachan {

enum class Access : std::uint32_t {
    local_only = 0,
    local_write = 1u << 0,
    remote_write = 1u << 1,
    remote_read = 1u << 2,
    remote_atomic = 1u << 3,
    // Everything a peer may do: read, write and atomics (and local write, which they require).
    remote_all = (1u << 0) | (1u << 1) | (1u << 2) | (1u << 3),
};

constexpr Access operator|(Access left, Access right) {
    return static_cast<Access>(static_cast<std::uint32_t>(left) | static_cast<std::uint32_t>(right));
}

struct RemoteMemoryRegion {
    std::uint64_t addr = 0;
    std::uint64_t length = 0;
    std::uint32_t rkey = 0;

    // A piece of this region; throws rdmachan::Error if it does not lie inside.
    RemoteMemoryRegion slice(std::uint64_t offset, std::uint64_t slice_length) const;
};

void to_json(nlohmann::json& json, const RemoteMemoryRegion& region);
void from_json(const nlohmann::json& json, RemoteMemoryRegion& region);

class LocalSlice;

class MemoryRegion {
public:
    MemoryRegion() = default;

    void* data() const { return data_; }
    std::size_t length() const { return length_; }
    std::uint32_t lkey() const { return lkey_; }
    std::uint32_t rkey() const { return rkey_; }
    bool valid() const { return owner_ != nullptr; }

    // What to send a peer so it can read or write this region (if it was registered for that).
    RemoteMemoryRegion remote() const;
    RemoteMemoryRegion remote(std::uint64_t offset, std::uint64_t slice_length) const;
    // A checked piece of this region for a local scatter/gather element.
    LocalSlice slice(std::uint64_t offset, std::uint64_t slice_length) const;
    LocalSlice all() const;

private:
    friend class EngineAccess;
    MemoryRegion(std::shared_ptr<void> owner, void* data, std::size_t length, std::uint32_t lkey, std::uint32_t rkey)
        : owner_(std::move(owner)), data_(data), length_(length), lkey_(lkey), rkey_(rkey) {}
    std::shared_ptr<void> owner_;  // the device's registration: deregistered with the last copy
    void* data_ = nullptr;
    std::size_t length_ = 0;
    std::uint32_t lkey_ = 0;
    std::uint32_t rkey_ = 0;
};

class LocalSlice {
public:
    LocalSlice() = default;  // empty: zero bytes, for containers; real ones come from MemoryRegion
    std::uint64_t addr() const { return addr_; }
    std::uint32_t length() const { return length_; }
    std::uint32_t lkey() const { return lkey_; }
    std::uint8_t* bytes() const { return reinterpret_cast<std::uint8_t*>(addr_); }

private:
    friend class MemoryRegion;
    LocalSlice(std::uint64_t addr, std::uint32_t length, std::uint32_t lkey) : addr_(addr), length_(length), lkey_(lkey) {}
    std::uint64_t addr_ = 0;
    std::uint32_t length_ = 0;
    std::uint32_t lkey_ = 0;
};

}  // namespace rdmachan
