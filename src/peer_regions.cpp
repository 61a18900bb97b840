#include "src/peer_regions.hpp"

#include <algorithm>

#include "common/logger.hpp"

namespace rdmachan::detail {

std::uint32_t PeerRegions::name_index(const std::string& name) const {
    for (std::uint32_t index = 0; index < names_.size(); ++index) {
        if (names_[index] == name) return index;
    }
    names_.push_back(name);
    return static_cast<std::uint32_t>(names_.size() - 1);
}

void PeerRegions::set(std::uint32_t peer, const std::map<std::string, RemoteRegion>& regions) {
    if (peer < loaded_.size()) loaded_[peer] = true;
    store(peer, regions);
}

void PeerRegions::store(std::uint32_t peer, const std::map<std::string, RemoteRegion>& regions) const {
    auto first = std::lower_bound(entries_.begin(), entries_.end(), peer, [](const Entry& entry, std::uint32_t wanted) { return entry.peer < wanted; });
    auto last = first;
    while (last != entries_.end() && last->peer == peer) ++last;
    first = entries_.erase(first, last);
    std::vector<Entry> added;
    added.reserve(regions.size());
    for (const auto& [name, region] : regions) added.push_back(Entry{peer, name_index(name), region});
    entries_.insert(first, added.begin(), added.end());
}

void PeerRegions::set_loader(Loader loader, std::uint32_t peers) {
    loader_ = std::move(loader);
    loaded_.assign(peers, false);
}

void PeerRegions::load(std::uint32_t peer) const {
    loaded_[peer] = true;
    std::map<std::string, RemoteRegion> regions;
    try {
        regions = loader_(peer);
    } catch (const std::exception& error) {
        logger().error("rank {}: its published regions could not be read: {}", peer, error.what());
        return;
    }
    store(peer, regions);
}

const RemoteRegion* PeerRegions::find(std::uint32_t peer, std::string_view name) const {
    if (loader_ && peer < loaded_.size() && !loaded_[peer]) load(peer);
    for (auto entry = std::lower_bound(entries_.begin(), entries_.end(), peer, [](const Entry& entry, std::uint32_t wanted) { return entry.peer < wanted; });
         entry != entries_.end() && entry->peer == peer; ++entry) {
        if (names_[entry->name] == name) return &entry->region;
    }
    return nullptr;
}

}  // namespace rdmachan::detail
