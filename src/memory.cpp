#include "rdmachan/memory.hpp"

#include <string>

#include "rdmachan/error.hpp"
#include "src/registered.hpp"

namespace rdmachan {

RemoteMemoryRegion RemoteMemoryRegion::slice(std::uint64_t offset, std::uint64_t slice_length) const {
    if (offset > length || slice_length > length - offset) {
        throw Error("RemoteMemoryRegion::slice: [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
                    std::to_string(slice_length) + ") is outside the region of " + std::to_string(length) + " bytes");
    }
    return {addr + offset, slice_length, rkey};
}

void to_json(nlohmann::json& json, const RemoteMemoryRegion& region) {
    json = {{"addr", region.addr}, {"length", region.length}, {"rkey", region.rkey}};
}

void from_json(const nlohmann::json& json, RemoteMemoryRegion& region) {
    for (const char* name : {"addr", "length", "rkey"}) {
        if (!json.is_object() || !json.contains(name)) throw Error(std::string("remote memory region: field '") + name + "' is missing");
        if (!json.at(name).is_number_unsigned()) {
            throw Error(std::string("remote memory region: field '") + name + "' = " + json.at(name).dump() +
                        " is not a non-negative integer");
        }
    }
    region.addr = json.at("addr").get<std::uint64_t>();
    region.length = json.at("length").get<std::uint64_t>();
    const std::uint64_t rkey = json.at("rkey").get<std::uint64_t>();
    if (rkey > 0xffffffffu) throw Error("remote memory region: field 'rkey' = " + std::to_string(rkey) + " is not 32 bits");
    if (region.addr + region.length < region.addr) throw Error("remote memory region: addr + length overflows 64 bits");
    region.rkey = static_cast<std::uint32_t>(rkey);
}

bool MemoryRegion::valid() const { return registered_ != nullptr && !registered_->ended.load(std::memory_order_acquire); }

void MemoryRegion::deregister() {
    if (registered_ == nullptr) throw Error("MemoryRegion::deregister: the region was never registered");
    std::lock_guard lock(registered_->mutex);
    if (registered_->ended.load(std::memory_order_relaxed)) return;  // by this or another copy
    if (!registered_->deregister) {
        throw Error("MemoryRegion::deregister: a memory layout cannot be deregistered early; it is deregistered "
                    "when its last copy goes");
    }
    registered_->deregister();  // a refusal throws, and the region stays registered
    registered_->ended.store(true, std::memory_order_release);
}

RemoteMemoryRegion MemoryRegion::remote() const {
    if (!valid()) throw Error("MemoryRegion::remote: the region is not registered");
    return {reinterpret_cast<std::uint64_t>(data_), length_, rkey_};
}

RemoteMemoryRegion MemoryRegion::remote(std::uint64_t offset, std::uint64_t slice_length) const {
    return remote().slice(offset, slice_length);
}

LocalSlice MemoryRegion::slice(std::uint64_t offset, std::uint64_t slice_length) const {
    if (!valid()) throw Error("MemoryRegion::slice: the region is not registered");
    if (offset > length_ || slice_length > length_ - offset) {
        throw Error("MemoryRegion::slice: [" + std::to_string(offset) + ", " + std::to_string(offset) + " + " +
                    std::to_string(slice_length) + ") is outside the registered region of " + std::to_string(length_) +
                    " bytes");
    }
    if (slice_length > 0x80000000ull) throw Error("MemoryRegion::slice: " + std::to_string(slice_length) + " bytes is more than one work request carries (2 GiB)");
    return LocalSlice(reinterpret_cast<std::uint64_t>(data_) + offset, static_cast<std::uint32_t>(slice_length), lkey_,
                      zero_based_);
}

LocalSlice MemoryRegion::all() const { return slice(0, length_); }

MemoryLayout MemoryLayout::list(std::vector<LocalSlice> slices) {
    if (slices.empty()) throw Error("MemoryLayout::list: slices is empty");
    for (std::size_t i = 0; i < slices.size(); ++i) {
        if (slices[i].zero_based()) {
            throw Error("MemoryLayout::list: slices[" + std::to_string(i) + "] is a slice of a layout; layouts do not nest");
        }
    }
    MemoryLayout layout;
    layout.slices_ = std::move(slices);
    return layout;
}

MemoryLayout MemoryLayout::strided(const MemoryRegion& region, std::uint64_t offset, std::uint32_t block_length,
                                   std::uint32_t stride, std::uint32_t repeat_count) {
    const std::string call = "MemoryLayout::strided: ";
    if (!region.valid()) throw Error(call + "region is not registered");
    if (region.zero_based()) throw Error(call + "region is a layout; layouts do not nest");
    if (block_length == 0 || block_length > 0xffff) {
        throw Error(call + "block_length = " + std::to_string(block_length) + " (1 to 65535: 16 bits on the NIC)");
    }
    if (stride < block_length || stride > 0xffff) {
        throw Error(call + "stride = " + std::to_string(stride) + " (block_length " + std::to_string(block_length) +
                    " to 65535: 16 bits on the NIC)");
    }
    if (repeat_count == 0) throw Error(call + "repeat_count = 0");
    const std::uint64_t span = std::uint64_t{stride} * (repeat_count - 1) + block_length;
    if (offset > region.length() || span > region.length() - offset) {
        throw Error(call + "offset " + std::to_string(offset) + " + " + std::to_string(repeat_count) + " blocks " +
                    std::to_string(stride) + " bytes apart (" + std::to_string(span) +
                    " bytes) run past the region's " + std::to_string(region.length()) + " bytes");
    }
    MemoryLayout layout;
    layout.is_strided_ = true;
    layout.strided_ = {reinterpret_cast<std::uint64_t>(region.data()) + offset, block_length, stride, repeat_count,
                       region.lkey()};
    return layout;
}

std::uint64_t MemoryLayout::length() const {
    if (is_strided_) return std::uint64_t{strided_.block_length} * strided_.repeat_count;
    std::uint64_t total = 0;
    for (const LocalSlice& slice : slices_) total += slice.length();
    return total;
}

}  // namespace rdmachan
