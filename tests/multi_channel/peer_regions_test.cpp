// detail::PeerRegions (src/peer_regions.hpp): the regions each peer of a MultiChannel published,
// found by peer and name, replaced whole when a replacement process publishes its own.
#include <doctest/doctest.h>

#include <map>
#include <string>

#include "src/peer_regions.hpp"

using rdmachan::RemoteRegion;
using rdmachan::detail::PeerRegions;

namespace {

std::map<std::string, RemoteRegion> published(std::uint64_t base, std::initializer_list<const char*> names) {
    std::map<std::string, RemoteRegion> regions;
    std::uint32_t key = 1;
    for (const char* name : names) regions[name] = RemoteRegion{base + key * 0x1000, 0x1000 * key, key++};
    return regions;
}

}  // namespace

TEST_CASE("peer regions: each peer's regions are found by name, and only that peer's") {
    PeerRegions regions;
    regions.reserve(7);
    for (std::uint32_t peer = 0; peer < 3; ++peer) {
        regions.set(peer, peer == 1 ? published(peer << 20, {"buffer", "flags", "log"}) : published(peer << 20, {"buffer", "flags"}));
    }
    for (std::uint32_t peer = 0; peer < 3; ++peer) {
        const RemoteRegion expected = published(peer << 20, {"buffer", "flags"}).at("flags");
        const RemoteRegion* found = regions.find(peer, "flags");
        REQUIRE(found != nullptr);
        CHECK(*found == expected);
    }
    CHECK(regions.find(1, "log") != nullptr);
    CHECK(regions.find(0, "log") == nullptr);   // another peer's name
    CHECK(regions.find(2, "log") == nullptr);
    CHECK(regions.find(3, "buffer") == nullptr);  // no such peer
    CHECK(regions.find(0, "") == nullptr);
}

TEST_CASE("peer regions: a replacement's regions replace the old ones, the neighbours' stay") {
    PeerRegions regions;
    for (std::uint32_t peer = 0; peer < 4; ++peer) regions.set(peer, published(peer << 20, {"buffer", "flags"}));
    regions.set(2, published(0x7700000, {"buffer", "journal", "state"}));
    CHECK(regions.find(2, "flags") == nullptr);
    REQUIRE(regions.find(2, "journal") != nullptr);
    CHECK(*regions.find(2, "journal") == published(0x7700000, {"buffer", "journal", "state"}).at("journal"));
    CHECK(*regions.find(2, "buffer") == published(0x7700000, {"buffer"}).at("buffer"));
    for (std::uint32_t peer : {0u, 1u, 3u}) {
        REQUIRE(regions.find(peer, "flags") != nullptr);
        CHECK(*regions.find(peer, "flags") == published(peer << 20, {"buffer", "flags"}).at("flags"));
    }
    regions.set(3, {});  // a replacement that publishes nothing
    CHECK(regions.find(3, "buffer") == nullptr);
    CHECK(regions.find(1, "buffer") != nullptr);
}
