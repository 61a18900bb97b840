#include "src/peer_regions.hpp"

#include <algorithm>

namespace rdmachan::detail {

std::uint32_t PeerRegions::name_index(const std::string& name) {
    for (std::uint32_t index = 0; index < names_.size(); ++index) {
        if (names_[index] == name) return index;
    }
    names_.push_back(name);
    return static_cast<std::uint32_t>(names_.size() - 1);
}

void PeerRegions::set(std::uint32_t peer, const std::map<std::string, RemoteRegion>& regions) {
    auto first = std::lower_bound(entries_.begin(), entries_.end(), peer, [](const Entry& entry, std::uint32_t wanted) { return entry.peer < wanted; });
    auto last = first;
    while (last != entries_.end() && last->peer == peer) ++last;
    first = entries_.erase(first, last);
    std::vector<Entry> added;
    added.reserve(regions.size());
    for (const auto& [name, region] : regions) added.push_back(Entry{peer, name_index(name), region});
    entries_.insert(first, added.begin(), added.end());
}

const RemoteRegion* PeerRegions::find(std::uint32_t peer, std::string_view name) const {
    for (auto entry = std::lower_bound(entries_.begin(), entries_.end(), peer, [](const Entry& entry, std::uint32_t wanted) { return entry.peer < wanted; });
         entry != entries_.end() && entry->peer == peer; ++entry) {
        if (names_[entry->name] == name) return &entry->region;
    }
    return nullptr;
}

}  // namespace rdmachan::detail
