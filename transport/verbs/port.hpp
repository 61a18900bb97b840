// Port facts as plain values (no verbs handles), so GID selection and endpoint building can
// be tested without a device.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace rdmachan::verbs {

using Gid = std::array<std::uint8_t, 16>;

enum class GidType : std::uint8_t { infiniband, roce_v1, roce_v2 };
enum class LinkLayer : std::uint8_t { unspecified, infiniband, ethernet };

struct GidEntry {
    std::uint32_t index = 0;
    Gid gid{};
    GidType type = GidType::infiniband;
};

struct PortAttributes {
    std::uint8_t port_num = 0;
    bool active = false;           // IBV_PORT_ACTIVE
    std::uint16_t lid = 0;         // 0 on RoCE
    std::uint32_t active_mtu = 0;  // bytes: 256 .. 4096
    std::uint32_t max_mtu = 0;     // bytes
    LinkLayer link_layer = LinkLayer::unspecified;
    std::uint32_t gid_table_length = 0;
    std::vector<GidEntry> gid_table;  // valid entries only, ascending index
};

// ::ffff:a.b.c.d — the GID RoCE derives from an IPv4 address.
bool is_ipv4_mapped(const Gid& gid) noexcept;
// fe80::/10 — derived from the interface's IPv6 link-local address.
bool is_ipv6_link_local(const Gid& gid) noexcept;
bool is_zero(const Gid& gid) noexcept;
// "fe80:0000:...": the form the kernel shows in /sys/class/infiniband/*/ports/*/gids/*.
std::string to_string(const Gid& gid);
const char* to_string(GidType type) noexcept;
const char* to_string(LinkLayer layer) noexcept;

// IBV_MTU_* enum value <-> bytes. mtu_from_bytes returns 0 for a size verbs cannot express.
std::uint32_t mtu_to_bytes(int ibv_mtu_value) noexcept;
int mtu_from_bytes(std::uint32_t bytes) noexcept;

}  // namespace rdmachan::verbs
