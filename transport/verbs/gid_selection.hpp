// Which GID index a queue pair uses as its source address. Pure logic over a port's GID table,
// so the rule is tested without a device.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "transport/verbs/port.hpp"

namespace rdmachan::verbs {

struct GidChoice {
    GidEntry entry;
    std::string reason;
};

// Rules, in order:
// - an explicit override index wins, if that entry exists (else VerbsError naming it);
// - InfiniBand: the lowest valid index (index 0 holds the port GID);
// - Ethernet (RoCE): RoCE v2 with an IPv4-mapped address first (routable over UDP/IP and what
//   most fabrics configure), then any other RoCE v2 that is not link-local, then RoCE v2
//   link-local, then RoCE v1. Within a rank the lowest index wins.
// Throws VerbsError when the table has no usable entry.
GidChoice select_gid(std::span<const GidEntry> table, LinkLayer link_layer,
                     std::optional<std::uint32_t> override_index = std::nullopt);

}  // namespace rdmachan::verbs
