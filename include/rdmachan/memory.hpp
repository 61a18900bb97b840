// Registered memory. A MemoryRegion is owned (deregistered when the last handle goes); a
// LocalSlice is a checked piece of one, the only way to hand local memory to an operation; a
// RemoteMemoryRegion is what a peer tells you about its memory, and yields checked sub-regions.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

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
namespace detail {
struct Registered;
}

class MemoryRegion {
public:
    MemoryRegion() = default;

    void* data() const { return data_; }
    std::size_t length() const { return length_; }
    std::uint32_t lkey() const { return lkey_; }
    std::uint32_t rkey() const { return rkey_; }
    // Registered: false for a default-constructed region and once deregister() succeeded.
    bool valid() const;
    // Deregisters now rather than when the last copy goes, for every copy: their keys stop
    // working (an operation still naming them fails at the device, as on a NIC), and valid(),
    // slice() and remote() say it is not registered. Memory from allocate_memory stays until the
    // last copy goes. Throws rdmachan::Error, the region staying registered, when the device
    // refuses: ibv_dereg_mr's errno on a NIC (EBUSY: memory windows bound), or on the software
    // device a same-host peer stopped for 2 s inside a zero-hop write of it (the error names the
    // process); it may be called again. A memory layout (register_layout) cannot end early: that
    // is an error too, and it is deregistered with its last copy. Control path: waits, throws.
    void deregister();
    // A registered memory layout (Channel::register_layout): addresses are offsets into the
    // layout, not host addresses; data() is null.
    bool zero_based() const { return zero_based_; }

    // What to send a peer so it can read or write this region (if it was registered for that).
    RemoteMemoryRegion remote() const;
    RemoteMemoryRegion remote(std::uint64_t offset, std::uint64_t slice_length) const;
    // A checked piece of this region for a local scatter/gather element.
    LocalSlice slice(std::uint64_t offset, std::uint64_t slice_length) const;
    LocalSlice all() const;

private:
    friend class EngineAccess;
    friend class EngineLayoutAccess;
    MemoryRegion(std::shared_ptr<detail::Registered> registered, void* data, std::size_t length, std::uint32_t lkey,
                 std::uint32_t rkey, bool zero_based = false)
        : registered_(std::move(registered)), data_(data), length_(length), lkey_(lkey), rkey_(rkey), zero_based_(zero_based) {}
    std::shared_ptr<detail::Registered> registered_;  // shared by every copy; the registration goes with the last
    void* data_ = nullptr;
    std::size_t length_ = 0;
    std::uint32_t lkey_ = 0;
    std::uint32_t rkey_ = 0;
    bool zero_based_ = false;
};

class LocalSlice {
public:
    LocalSlice() = default;  // empty: zero bytes, for containers; real ones come from MemoryRegion
    std::uint64_t addr() const { return addr_; }
    std::uint32_t length() const { return length_; }
    std::uint32_t lkey() const { return lkey_; }
    std::uint8_t* bytes() const { return reinterpret_cast<std::uint8_t*>(addr_); }  // not for a layout's slice
    // A slice of a memory layout: addr() is an offset into the layout, and the bytes are not
    // contiguous in this process (so they never travel inline in a work request).
    bool zero_based() const { return zero_based_; }

private:
    friend class MemoryRegion;
    LocalSlice(std::uint64_t addr, std::uint32_t length, std::uint32_t lkey, bool zero_based = false)
        : addr_(addr), length_(length), lkey_(lkey), zero_based_(zero_based) {}
    std::uint64_t addr_ = 0;
    std::uint32_t length_ = 0;
    std::uint32_t lkey_ = 0;
    bool zero_based_ = false;
};

// A memory layout (mlx5 UMR): pieces of registered memory seen as one zero-based
// range, so that one write, read, send or receive scatters or gathers all of them. Register it
// with Channel::register_layout (or MultiChannel's); the region that returns is used like any
// other, locally through slice()/all() and by a peer through remote(), published as a remote
// region is (JSON: addr 0, the layout's length, its rkey).
class MemoryLayout {
public:
    // The slices back to back: byte 0 of the layout is the first slice's first byte
    // (mlx5dv_wr_mr_list). Throws rdmachan::Error if there are none.
    static MemoryLayout list(std::vector<LocalSlice> slices);
    // repeat_count blocks of block_length bytes, stride bytes apart, from `offset` in `region`
    // (mlx5dv_wr_mr_interleaved with one entry): a matrix column is block_length = the element
    // size, stride = the row size, repeat_count = the rows. The NIC holds block_length and stride
    // in 16 bits. Throws rdmachan::Error naming the field that does not fit.
    static MemoryLayout strided(const MemoryRegion& region, std::uint64_t offset, std::uint32_t block_length,
                                std::uint32_t stride, std::uint32_t repeat_count);
    std::uint64_t length() const;

    // What strided() recorded (for the engine, which turns it into the UMR's pattern).
    struct Strided {
        std::uint64_t addr = 0;
        std::uint32_t block_length = 0;
        std::uint32_t stride = 0;
        std::uint32_t repeat_count = 0;
        std::uint32_t lkey = 0;
    };

private:
    friend class EngineLayoutAccess;
    std::vector<LocalSlice> slices_;
    Strided strided_;
    bool is_strided_ = false;
};

}  // namespace rdmachan
