// What one process tells its peers so they can reach it: the port identity, one RC entry per
// peer queue pair, DC targets and optional named remote memory regions. A plain value; the
// handshake carries it as JSON (schema in handshake/README.md).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <string_view>
#include <vector>

namespace rdmachan {

// The JSON schema version this library writes, and the oldest reader version able to read it.
// A reader rejects an endpoint whose minimum compatible version is newer than its own version.
inline constexpr std::uint32_t endpoint_schema_version = 1;
inline constexpr std::uint32_t endpoint_min_compatible_version = 1;

// Bounds that keep a hostile or corrupt endpoint from costing unbounded memory.
inline constexpr std::size_t endpoint_max_rc_entries = 65536;
inline constexpr std::size_t endpoint_max_dc_entries = 1024;
inline constexpr std::size_t endpoint_max_regions = 1024;
inline constexpr std::size_t endpoint_max_region_name_length = 256;

using Gid = std::array<std::uint8_t, 16>;

// 32 lowercase hex digits, no separators.
std::string gid_to_hex(const Gid& gid);
// Accepts 32 hex digits, optionally grouped with ':' (as sysfs prints GIDs). Throws
// rdmachan::Error naming the text.
Gid gid_from_hex(std::string_view text);

// MTU in bytes (256, 512, 1024, 2048, 4096) and the ibv_mtu enum value (1..5).
bool is_valid_mtu(std::uint32_t bytes);
std::uint32_t mtu_to_ibv_mtu(std::uint32_t bytes);    // throws rdmachan::Error naming the value
std::uint32_t mtu_from_ibv_mtu(std::uint32_t value);  // throws rdmachan::Error naming the value

enum class DeviceKind : std::uint8_t { soft, verbs, mlx5 };
enum class LinkLayer : std::uint8_t { infiniband, ethernet };

const char* to_string(DeviceKind kind);
const char* to_string(LinkLayer link_layer);

struct PortIdentity {
    std::uint16_t lid = 0;  // 0 on Ethernet (RoCE), where the GID addresses the port
    Gid gid{};
    std::uint8_t gid_index = 0;
    LinkLayer link_layer = LinkLayer::infiniband;
    std::uint32_t mtu = 1024;  // bytes

    bool operator==(const PortIdentity&) const = default;
};

// The queue pair this process created for one peer.
struct RcEntry {
    std::uint32_t peer = 0;  // the peer's rank
    std::uint32_t qpn = 0;   // 24 bits
    std::uint32_t psn = 0;   // 24 bits, the first PSN this side sends

    bool operator==(const RcEntry&) const = default;
};

struct DcEntry {
    std::uint32_t dctn = 0;  // 24 bits
    std::uint64_t dc_key = 0;

    bool operator==(const DcEntry&) const = default;
};

struct RemoteRegion {
    std::uint64_t addr = 0;
    std::uint64_t length = 0;  // addr + length must not wrap
    std::uint32_t rkey = 0;

    bool operator==(const RemoteRegion&) const = default;
};

struct Endpoint {
    std::uint32_t rank = 0;
    // Random per process: a restarted process reusing a rank has a different session.
    std::uint64_t session = 0;
    DeviceKind device = DeviceKind::soft;
    PortIdentity port;
    std::vector<RcEntry> rc;
    std::vector<DcEntry> dc;
    // DC mode: this process's DC initiator numbers. A DC target's receive names the sending
    // initiator (and its LID), which is how the receiver knows the sending rank. Optional.
    std::vector<std::uint32_t> dci;
    std::map<std::string, RemoteRegion> regions;

    bool operator==(const Endpoint&) const = default;
};

// Throws rdmachan::Error naming the field and the value (e.g. "endpoint field 'rc[3].psn' =
// 16777216 is out of range (24 bits)") on any value the schema does not allow.
void validate(const Endpoint& endpoint);

void to_json(nlohmann::json& json, const Endpoint& endpoint);
// Unknown fields are ignored. Throws rdmachan::Error naming the field on wrong types, missing
// fields, out-of-range values and incompatible schema versions.
void from_json(const nlohmann::json& json, Endpoint& endpoint);

std::string serialize_endpoint(const Endpoint& endpoint);
// Parses JSON text; malformed JSON is an rdmachan::Error too.
Endpoint parse_endpoint(std::string_view text);

}  // namespace rdmachan
