// The memory regions every peer of a MultiChannel published, by name. One map per peer cost
// about 140 bytes per peer for the usual single region (the map, its node, the name), a third of
// a DC peer's memory (docs/SCALE.md, "DC memory per peer"). Here the names are kept once (peers
// mostly publish the same ones) and each region is one 32-byte entry, sorted by peer.
#pragma once

#include <cstdint>
#include <functional>
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
    // Regions read when a peer's are first asked for (a table decoded on demand), for `peers`
    // peers: a peer never asked about costs a bit. A loader that throws leaves the peer with
    // none, and the error is logged naming it.
    using Loader = std::function<std::map<std::string, RemoteRegion>(std::uint32_t peer)>;
    void set_loader(Loader loader, std::uint32_t peers);

private:
    struct Entry {
        std::uint32_t peer;
        std::uint32_t name;  // index into names_
        RemoteRegion region;
    };
    // Const: find() stores a peer's regions the first time it is asked about them.
    std::uint32_t name_index(const std::string& name) const;
    void store(std::uint32_t peer, const std::map<std::string, RemoteRegion>& regions) const;
    void load(std::uint32_t peer) const;
    mutable std::vector<std::string> names_;
    mutable std::vector<Entry> entries_;  // sorted by peer
    Loader loader_;
    mutable std::vector<bool> loaded_;  // by peer, with a loader
};

}  // namespace rdmachan::detail
