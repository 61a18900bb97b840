#include "rdmachan/memory.hpp"

#include <string>

#include "rdmachan/error.hpp"

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
    return LocalSlice(reinterpret_cast<std::uint64_t>(data_) + offset, static_cast<std::uint32_t>(slice_length), lkey_);
}

LocalSlice MemoryRegion::all() const { return slice(0, length_); }

}  // namespace rdmachan
