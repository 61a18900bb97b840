#include "transport/verbs/gid_selection.hpp"

#include <fmt/format.h>

#include <cerrno>

#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

namespace {

// Lower is better; nullopt means "never pick this entry automatically".
std::optional<int> roce_rank(const GidEntry& entry) {
    if (is_zero(entry.gid)) return std::nullopt;
    if (entry.type == GidType::roce_v2) {
        if (is_ipv4_mapped(entry.gid)) return 0;
        if (!is_ipv6_link_local(entry.gid)) return 1;
        return 2;
    }
    if (entry.type == GidType::roce_v1) return 3;
    return std::nullopt;
}

const char* roce_rank_words(int rank) {
    switch (rank) {
        case 0:
            return "RoCE v2 with an IPv4-mapped address (preferred on Ethernet)";
        case 1:
            return "RoCE v2 with a routable IPv6 address (no IPv4-mapped RoCE v2 GID)";
        case 2:
            return "RoCE v2 link-local (no routable RoCE v2 GID)";
        default:
            return "RoCE v1 (no RoCE v2 GID)";
    }
}

}  // namespace

GidChoice select_gid(std::span<const GidEntry> table, LinkLayer link_layer,
                     std::optional<std::uint32_t> override_index) {
    if (override_index) {
        for (const GidEntry& entry : table) {
            if (entry.index == *override_index && !is_zero(entry.gid)) {
                return {entry, fmt::format("GID index {} requested explicitly ({} {})", entry.index,
                                           to_string(entry.type), to_string(entry.gid))};
            }
        }
        throw VerbsError(
            fmt::format("select GID: requested GID index {} is not a valid entry of the port's "
                        "GID table ({} valid entries)",
                        *override_index, table.size()),
            EINVAL);
    }
    if (link_layer != LinkLayer::ethernet) {
        for (const GidEntry& entry : table) {
            if (!is_zero(entry.gid)) {
                return {entry, fmt::format("{} link: lowest valid GID index {}",
                                           to_string(link_layer), entry.index)};
            }
        }
        throw VerbsError(
            fmt::format("select GID: the {} port has no valid GID", to_string(link_layer)),
            ENODATA);
    }
    const GidEntry* best = nullptr;
    int best_rank = 0;
    for (const GidEntry& entry : table) {
        const std::optional<int> rank = roce_rank(entry);
        if (!rank) continue;
        if (best == nullptr || *rank < best_rank ||
            (*rank == best_rank && entry.index < best->index)) {
            best = &entry;
            best_rank = *rank;
        }
    }
    if (best == nullptr) {
        throw VerbsError(
            fmt::format(
                "select GID: the Ethernet port has no RoCE GID ({} entries, none RoCE v1/v2 "
                "with an address; is an IP address configured on the interface?)",
                table.size()),
            ENODATA);
    }
    return {*best, fmt::format("GID index {} {}: {}", best->index, to_string(best->gid),
                               roce_rank_words(best_rank))};
}

}  // namespace rdmachan::verbs
