// The memory regions every peer of a MultiChannel published, by name. One map per peer cost
// about 140 bytes per peer for the usual single region (the map, its node, the name), a third of
// a DC peer's memory (docs/SCALE.md, "DC memory per peer"). Here the names are kept once (peers
// mostly publish the same ones) and each region is one 32-byte entry, sorted by peer.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "rdmachan/endpoint.hpp"

namespace rdmachan::detail {

class PeerRegions {
public:
    // Room for `count` regions in all, so that the table is allocated once at a handshake.
    void reserve(std::size_t count) { entries_.reserve(count); }
    // `peer`'s regions, replacing any it had (a replacement process publishes its own).
    void set(std::uint32_t peer, const std::map<std::string, RemoteRegion>& regions);
    // The region `peer` published as `name`, or null.
    const RemoteRegion* find(std::uint32_t peer, std::string_view name) const;

private:
    struct Entry {
        std::uint32_t peer;
        std::uint32_t name;  // index into names_
        RemoteRegion region;
    };
    std::uint32_t name_index(const std::string& name);
    std::vector<std::string> names_;
    std::vector<Entry> entries_;  // sorted by peer
};

}  // namespace rdmachan::detail
