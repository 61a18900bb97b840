#include "rdmachan/endpoint.hpp"

#include <nlohmann/json.hpp>

#include "handshake/hex.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan {
namespace {

constexpr std::uint32_t max_24_bits = (1u << 24) - 1;

[[noreturn]] void field_error(const std::string& field, const std::string& value,
                              const std::string& problem) {
    throw Error("endpoint field '" + field + "' = " + value + " " + problem);
}

void check_24_bits(const std::string& field, std::uint64_t value) {
    if (value > max_24_bits) field_error(field, std::to_string(value), "is out of range (24 bits)");
}

// A region may end exactly at 2^64 (its last byte is the last address), not beyond.
bool region_wraps(const RemoteRegion& region) {
    return region.length != 0 && region.length - 1 > UINT64_MAX - region.addr;
}

std::string describe(const nlohmann::json& value) {
    std::string text = value.dump();
    if (text.size() > 64) text = text.substr(0, 61) + "...";
    return text;
}

const nlohmann::json& member(const nlohmann::json& object, const std::string& path,
                             const char* key) {
    const std::string field = path.empty() ? key : path + "." + key;
    auto found = object.find(key);
    if (found == object.end()) throw Error("endpoint field '" + field + "' is missing");
    return *found;
}

std::string join(const std::string& path, const char* key) {
    return path.empty() ? key : path + "." + key;
}

// Reads an unsigned integer no larger than `maximum`; rejects negatives, fractions, strings.
std::uint64_t read_unsigned(const nlohmann::json& object, const std::string& path, const char* key,
                            std::uint64_t maximum, const char* range_name) {
    const nlohmann::json& value = member(object, path, key);
    const std::string field = join(path, key);
    if (value.is_number_integer() && !value.is_number_unsigned() && value.get<std::int64_t>() < 0)
        field_error(field, describe(value), "is negative");
    if (!value.is_number_unsigned())
        field_error(field, describe(value), "is not an unsigned integer");
    const std::uint64_t number = value.get<std::uint64_t>();
    if (number > maximum)
        field_error(field, std::to_string(number),
                    std::string("is out of range (") + range_name + ")");
    return number;
}

std::string read_string(const nlohmann::json& object, const std::string& path, const char* key) {
    const nlohmann::json& value = member(object, path, key);
    if (!value.is_string()) field_error(join(path, key), describe(value), "is not a string");
    return value.get<std::string>();
}

std::uint64_t read_hex64(const nlohmann::json& object, const std::string& path, const char* key) {
    const std::string text = read_string(object, path, key);
    std::uint64_t value = 0;
    if (!handshake::parse_hex_u64(text, value))
        field_error(join(path, key), "\"" + text.substr(0, 40) + "\"", "is not 1 to 16 hex digits");
    return value;
}

const nlohmann::json& read_container(const nlohmann::json& object, const std::string& path,
                                     const char* key, bool want_array, std::size_t maximum) {
    const nlohmann::json& value = member(object, path, key);
    const std::string field = join(path, key);
    if (want_array ? !value.is_array() : !value.is_object())
        field_error(field, describe(value), want_array ? "is not an array" : "is not an object");
    if (value.size() > maximum)
        field_error(field, std::to_string(value.size()) + " entries",
                    "has too many entries (at most " + std::to_string(maximum) + ")");
    return value;
}

template <typename Enum>
Enum read_enum(const nlohmann::json& object, const std::string& path, const char* key,
               std::initializer_list<Enum> choices) {
    const std::string text = read_string(object, path, key);
    std::string allowed;
    for (Enum choice : choices) {
        if (text == to_string(choice)) return choice;
        allowed += allowed.empty() ? "" : ", ";
        allowed += to_string(choice);
    }
    field_error(join(path, key), "\"" + text.substr(0, 40) + "\"", "is not one of " + allowed);
}

void check_version(const nlohmann::json& json) {
    const std::uint64_t version = read_unsigned(json, "", "schema_version", UINT32_MAX, "32 bits");
    const std::uint64_t minimum =
        read_unsigned(json, "", "min_compatible_version", UINT32_MAX, "32 bits");
    if (minimum > endpoint_schema_version || version < endpoint_min_compatible_version)
        throw Error("endpoint schema version " + std::to_string(version) +
                    " (readable from version " + std::to_string(minimum) +
                    ") is incompatible with this reader's schema version " +
                    std::to_string(endpoint_schema_version));
}

}  // namespace

const char* to_string(DeviceKind kind) {
    switch (kind) {
        case DeviceKind::soft:
            return "soft";
        case DeviceKind::verbs:
            return "verbs";
        case DeviceKind::mlx5:
            return "mlx5";
    }
    return "unknown";
}

const char* to_string(LinkLayer link_layer) {
    switch (link_layer) {
        case LinkLayer::infiniband:
            return "infiniband";
        case LinkLayer::ethernet:
            return "ethernet";
    }
    return "unknown";
}

std::string gid_to_hex(const Gid& gid) {
    return handshake::to_hex(gid.data(), gid.size());
}

Gid gid_from_hex(std::string_view text) {
    std::string digits;
    for (char character : text)
        if (character != ':') digits += character;
    Gid gid{};
    if (digits.size() != 32 || !handshake::from_hex(digits, gid.data(), gid.size()))
        throw Error("GID \"" + std::string(text.substr(0, 48)) +
                    "\" is not 32 hex digits (optionally grouped with ':')");
    return gid;
}

bool is_valid_mtu(std::uint32_t bytes) {
    return bytes == 256 || bytes == 512 || bytes == 1024 || bytes == 2048 || bytes == 4096;
}

std::uint32_t mtu_to_ibv_mtu(std::uint32_t bytes) {
    // IBV_MTU_256 = 1 ... IBV_MTU_4096 = 5: each step doubles the size.
    if (!is_valid_mtu(bytes))
        throw Error("MTU " + std::to_string(bytes) + " is not one of 256, 512, 1024, 2048, 4096");
    std::uint32_t value = 1;
    for (std::uint32_t size = 256; size < bytes; size *= 2) ++value;
    return value;
}

std::uint32_t mtu_from_ibv_mtu(std::uint32_t value) {
    if (value < 1 || value > 5)
        throw Error("ibv_mtu value " + std::to_string(value) + " is not in 1..5");
    return 256u << (value - 1);
}

void validate(const Endpoint& endpoint) {
    if (!is_valid_mtu(endpoint.port.mtu))
        field_error("port.mtu", std::to_string(endpoint.port.mtu),
                    "is not one of 256, 512, 1024, 2048, 4096");
    if (endpoint.rc.size() > endpoint_max_rc_entries)
        field_error("rc", std::to_string(endpoint.rc.size()) + " entries", "has too many entries");
    if (endpoint.dc.size() > endpoint_max_dc_entries)
        field_error("dc", std::to_string(endpoint.dc.size()) + " entries", "has too many entries");
    if (endpoint.regions.size() > endpoint_max_regions)
        field_error("regions", std::to_string(endpoint.regions.size()) + " entries",
                    "has too many entries");
    for (std::size_t index = 0; index < endpoint.rc.size(); ++index) {
        const std::string prefix = "rc[" + std::to_string(index) + "]";
        check_24_bits(prefix + ".qpn", endpoint.rc[index].qpn);
        check_24_bits(prefix + ".psn", endpoint.rc[index].psn);
    }
    for (std::size_t index = 0; index < endpoint.dc.size(); ++index)
        check_24_bits("dc[" + std::to_string(index) + "].dctn", endpoint.dc[index].dctn);
    if (endpoint.dci.size() > endpoint_max_dc_entries)
        field_error("dci", std::to_string(endpoint.dci.size()) + " entries", "has too many entries");
    for (std::size_t index = 0; index < endpoint.dci.size(); ++index)
        check_24_bits("dci[" + std::to_string(index) + "]", endpoint.dci[index]);
    for (const auto& [name, region] : endpoint.regions) {
        if (name.empty() || name.size() > endpoint_max_region_name_length)
            field_error("regions", "\"" + name.substr(0, 40) + "\"",
                        "has a name that is empty or longer than " +
                            std::to_string(endpoint_max_region_name_length) + " characters");
        if (region_wraps(region))
            field_error("regions." + name + ".length", std::to_string(region.length),
                        "overflows 64 bits when added to addr " + std::to_string(region.addr));
    }
}

void to_json(nlohmann::json& json, const Endpoint& endpoint) {
    json = nlohmann::json::object();
    json["schema_version"] = endpoint_schema_version;
    json["min_compatible_version"] = endpoint_min_compatible_version;
    json["rank"] = endpoint.rank;
    json["session"] = handshake::to_hex_u64(endpoint.session);
    json["device"] = to_string(endpoint.device);
    json["port"] = {{"lid", endpoint.port.lid},
                    {"gid", gid_to_hex(endpoint.port.gid)},
                    {"gid_index", endpoint.port.gid_index},
                    {"link_layer", to_string(endpoint.port.link_layer)},
                    {"mtu", endpoint.port.mtu}};
    json["rc"] = nlohmann::json::array();
    for (const RcEntry& entry : endpoint.rc)
        json["rc"].push_back({{"peer", entry.peer}, {"qpn", entry.qpn}, {"psn", entry.psn}});
    json["dc"] = nlohmann::json::array();
    for (const DcEntry& entry : endpoint.dc)
        json["dc"].push_back(
            {{"dctn", entry.dctn}, {"dc_key", handshake::to_hex_u64(entry.dc_key)}});
    if (!endpoint.dci.empty()) json["dci"] = endpoint.dci;
    json["regions"] = nlohmann::json::object();
    for (const auto& [name, region] : endpoint.regions)
        json["regions"][name] = {
            {"addr", region.addr}, {"length", region.length}, {"rkey", region.rkey}};
}

void from_json(const nlohmann::json& json, Endpoint& endpoint) {
    if (!json.is_object()) throw Error("endpoint is not a JSON object: " + describe(json));
    check_version(json);
    Endpoint result;
    result.rank =
        static_cast<std::uint32_t>(read_unsigned(json, "", "rank", UINT32_MAX, "32 bits"));
    result.session = read_hex64(json, "", "session");
    result.device =
        read_enum(json, "", "device", {DeviceKind::soft, DeviceKind::verbs, DeviceKind::mlx5});

    const nlohmann::json& port = member(json, "", "port");
    if (!port.is_object()) field_error("port", describe(port), "is not an object");
    result.port.lid =
        static_cast<std::uint16_t>(read_unsigned(port, "port", "lid", 0xffff, "16 bits"));
    const std::string gid = read_string(port, "port", "gid");
    try {
        result.port.gid = gid_from_hex(gid);
    } catch (const Error&) {
        field_error("port.gid", "\"" + gid.substr(0, 48) + "\"", "is not 32 hex digits");
    }
    result.port.gid_index =
        static_cast<std::uint8_t>(read_unsigned(port, "port", "gid_index", 0xff, "8 bits"));
    result.port.link_layer =
        read_enum(port, "port", "link_layer", {LinkLayer::infiniband, LinkLayer::ethernet});
    result.port.mtu =
        static_cast<std::uint32_t>(read_unsigned(port, "port", "mtu", 4096, "256..4096"));
    if (!is_valid_mtu(result.port.mtu))
        field_error("port.mtu", std::to_string(result.port.mtu),
                    "is not one of 256, 512, 1024, 2048, 4096");

    const nlohmann::json& rc = read_container(json, "", "rc", true, endpoint_max_rc_entries);
    for (std::size_t index = 0; index < rc.size(); ++index) {
        const std::string path = "rc[" + std::to_string(index) + "]";
        if (!rc[index].is_object()) field_error(path, describe(rc[index]), "is not an object");
        RcEntry entry;
        entry.peer = static_cast<std::uint32_t>(
            read_unsigned(rc[index], path, "peer", UINT32_MAX, "32 bits"));
        entry.qpn = static_cast<std::uint32_t>(
            read_unsigned(rc[index], path, "qpn", max_24_bits, "24 bits"));
        entry.psn = static_cast<std::uint32_t>(
            read_unsigned(rc[index], path, "psn", max_24_bits, "24 bits"));
        result.rc.push_back(entry);
    }

    const nlohmann::json& dc = read_container(json, "", "dc", true, endpoint_max_dc_entries);
    for (std::size_t index = 0; index < dc.size(); ++index) {
        const std::string path = "dc[" + std::to_string(index) + "]";
        if (!dc[index].is_object()) field_error(path, describe(dc[index]), "is not an object");
        DcEntry entry;
        entry.dctn = static_cast<std::uint32_t>(
            read_unsigned(dc[index], path, "dctn", max_24_bits, "24 bits"));
        entry.dc_key = read_hex64(dc[index], path, "dc_key");
        result.dc.push_back(entry);
    }

    // DC initiator numbers are optional (RC endpoints have none).
    if (json.contains("dci")) {
        const nlohmann::json& dci = read_container(json, "", "dci", true, endpoint_max_dc_entries);
        for (std::size_t index = 0; index < dci.size(); ++index) {
            const std::string path = "dci[" + std::to_string(index) + "]";
            if (!dci[index].is_number_unsigned()) field_error(path, describe(dci[index]), "is not an unsigned integer");
            const std::uint64_t number = dci[index].get<std::uint64_t>();
            if (number > max_24_bits) field_error(path, std::to_string(number), "is out of range (24 bits)");
            result.dci.push_back(static_cast<std::uint32_t>(number));
        }
    }

    // Regions are optional: an endpoint without any may leave the field out.
    if (json.contains("regions")) {
        const nlohmann::json& regions =
            read_container(json, "", "regions", false, endpoint_max_regions);
        for (const auto& [name, value] : regions.items()) {
            const std::string path = "regions." + name.substr(0, endpoint_max_region_name_length);
            if (name.empty() || name.size() > endpoint_max_region_name_length)
                field_error("regions", "\"" + name.substr(0, 40) + "\"",
                            "has a name that is empty or longer than " +
                                std::to_string(endpoint_max_region_name_length) + " characters");
            if (!value.is_object()) field_error(path, describe(value), "is not an object");
            RemoteRegion region;
            region.addr = read_unsigned(value, path, "addr", UINT64_MAX, "64 bits");
            region.length = read_unsigned(value, path, "length", UINT64_MAX, "64 bits");
            region.rkey = static_cast<std::uint32_t>(
                read_unsigned(value, path, "rkey", UINT32_MAX, "32 bits"));
            if (region_wraps(region))
                field_error(path + ".length", std::to_string(region.length),
                            "overflows 64 bits when added to addr " + std::to_string(region.addr));
            result.regions.emplace(name, region);
        }
    }
    endpoint = std::move(result);
}

std::string serialize_endpoint(const Endpoint& endpoint) {
    validate(endpoint);
    nlohmann::json json;
    to_json(json, endpoint);
    return json.dump();
}

Endpoint parse_endpoint(std::string_view text) {
    // The schema is three levels deep; refusing absurd nesting up front keeps every later
    // recursive walk (dump, error descriptions) shallow.
    std::size_t depth = 0;
    bool in_string = false;
    bool escaped = false;
    for (char character : text) {
        if (in_string) {
            if (escaped)
                escaped = false;
            else if (character == '\\')
                escaped = true;
            else if (character == '"')
                in_string = false;
        } else if (character == '"') {
            in_string = true;
        } else if (character == '[' || character == '{') {
            if (++depth > 64) throw Error("endpoint JSON nests deeper than 64 levels");
        } else if ((character == ']' || character == '}') && depth > 0) {
            --depth;
        }
    }
    nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded())
        throw Error("endpoint is not valid JSON (" + std::to_string(text.size()) + " bytes)");
    Endpoint endpoint;
    from_json(json, endpoint);
    return endpoint;
}

}  // namespace rdmachan
