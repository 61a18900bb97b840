#include "handshake/rendezvous_table.hpp"

#include "handshake/hex.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

constexpr std::uint64_t max_24_bits = (1u << 24) - 1;

std::string shown(const nlohmann::json& value) {
    std::string text = value.dump();
    if (text.size() > 64) text = text.substr(0, 61) + "...";
    return text;
}

// Element `position` of an array, an unsigned integer at most `maximum`; errors name `field`.
std::uint64_t unsigned_at(const nlohmann::json& array, std::size_t position, const std::string& field,
                          std::uint64_t maximum, const char* range_name) {
    const nlohmann::json& value = array[position];
    if (!value.is_number_unsigned())
        throw Error("field '" + field + "' = " + shown(value) + " is not an unsigned integer");
    const std::uint64_t number = value.get<std::uint64_t>();
    if (number > maximum)
        throw Error("field '" + field + "' = " + std::to_string(number) + " is out of range (" + range_name + ")");
    return number;
}

const std::string& string_at(const nlohmann::json& array, std::size_t position, const std::string& field) {
    const nlohmann::json& value = array[position];
    if (!value.is_string()) throw Error("field '" + field + "' = " + shown(value) + " is not a string");
    return value.get_ref<const std::string&>();
}

const nlohmann::json& array_at(const nlohmann::json& array, std::size_t position, const std::string& field,
                               std::size_t max_size) {
    const nlohmann::json& value = array[position];
    if (!value.is_array()) throw Error("field '" + field + "' = " + shown(value) + " is not an array");
    if (value.size() > max_size)
        throw Error("field '" + field + "' has " + std::to_string(value.size()) + " entries, more than " +
                    std::to_string(max_size));
    return value;
}

std::uint64_t hex64_at(const nlohmann::json& array, std::size_t position, const std::string& field) {
    const std::string& text = string_at(array, position, field);
    std::uint64_t value = 0;
    if (!parse_hex_u64(text, value))
        throw Error("field '" + field + "' = \"" + text.substr(0, 40) + "\" is not 1 to 16 hex digits");
    return value;
}

}  // namespace

nlohmann::json compact_rc_entries(const std::vector<RcEntry>& entries) {
    nlohmann::json array = nlohmann::json::array();
    array.get_ref<nlohmann::json::array_t&>().reserve(entries.size());
    for (const RcEntry& entry : entries) array.push_back({entry.peer, entry.qpn, entry.psn});
    return array;
}

std::vector<RcEntry> parse_compact_rc_entries(const nlohmann::json& entries) {
    if (!entries.is_array()) throw Error("field 'rc' = " + shown(entries) + " is not an array");
    if (entries.size() > endpoint_max_rc_entries)
        throw Error("field 'rc' has " + std::to_string(entries.size()) + " entries, more than " +
                    std::to_string(endpoint_max_rc_entries));
    std::vector<RcEntry> result;
    result.reserve(entries.size());
    for (std::size_t index = 0; index < entries.size(); ++index) {
        const std::string field = "rc[" + std::to_string(index) + "]";
        const nlohmann::json& entry = entries[index];
        if (!entry.is_array() || entry.size() != 3)
            throw Error("field '" + field + "' = " + shown(entry) + " is not [peer, qpn, psn]");
        RcEntry parsed;
        parsed.peer = static_cast<std::uint32_t>(unsigned_at(entry, 0, field + ".peer", UINT32_MAX, "32 bits"));
        parsed.qpn = static_cast<std::uint32_t>(unsigned_at(entry, 1, field + ".qpn", max_24_bits, "24 bits"));
        parsed.psn = static_cast<std::uint32_t>(unsigned_at(entry, 2, field + ".psn", max_24_bits, "24 bits"));
        result.push_back(parsed);
    }
    return result;
}

TableRowText table_row_text(const Endpoint& endpoint) {
    const nlohmann::json head = {endpoint.rank,
                                 to_hex_u64(endpoint.session),
                                 to_string(endpoint.device),
                                 endpoint.port.lid,
                                 gid_to_hex(endpoint.port.gid),
                                 endpoint.port.gid_index,
                                 to_string(endpoint.port.link_layer),
                                 endpoint.port.mtu};
    TableRowText text;
    text.prefix = head.dump();
    text.prefix.back() = ',';  // the closing ']' becomes the separator before the RC part
    nlohmann::json dc = nlohmann::json::array();
    for (const DcEntry& entry : endpoint.dc) dc.push_back({entry.dctn, to_hex_u64(entry.dc_key)});
    nlohmann::json regions = nlohmann::json::array();
    for (const auto& [name, region] : endpoint.regions)
        regions.push_back({name, region.addr, region.length, region.rkey});
    const nlohmann::json dci = endpoint.dci;
    // Appended, not a chain of operator+ (GCC 12 at -O3 reports a false -Wstringop-overflow there).
    text.suffix.append(",").append(dc.dump()).append(",").append(dci.dump()).append(",").append(regions.dump()).append("]");
    return text;
}

void append_table_rc(std::string& row, const RcEntry* entry) {
    if (entry == nullptr) {
        row += "[]";
        return;
    }
    row += '[';
    row += std::to_string(entry->qpn);
    row += ',';
    row += std::to_string(entry->psn);
    row += ']';
}

Endpoint parse_table_row(const nlohmann::json& row, std::uint32_t index, std::uint32_t recipient) {
    const std::string where = "table row " + std::to_string(index);
    try {
        if (!row.is_array() || row.size() < 12)
            throw Error("is not an array of 12 fields: " + shown(row));
        Endpoint endpoint;
        endpoint.rank = static_cast<std::uint32_t>(unsigned_at(row, 0, "rank", UINT32_MAX, "32 bits"));
        endpoint.session = hex64_at(row, 1, "session");
        const std::string& device = string_at(row, 2, "device");
        if (device == "soft") endpoint.device = DeviceKind::soft;
        else if (device == "verbs") endpoint.device = DeviceKind::verbs;
        else if (device == "mlx5") endpoint.device = DeviceKind::mlx5;
        else throw Error("field 'device' = \"" + device.substr(0, 40) + "\" is not soft, verbs or mlx5");
        endpoint.port.lid = static_cast<std::uint16_t>(unsigned_at(row, 3, "port.lid", 0xffff, "16 bits"));
        const std::string& gid = string_at(row, 4, "port.gid");
        try {
            endpoint.port.gid = gid_from_hex(gid);
        } catch (const Error&) {
            throw Error("field 'port.gid' = \"" + gid.substr(0, 48) + "\" is not 32 hex digits");
        }
        endpoint.port.gid_index = static_cast<std::uint8_t>(unsigned_at(row, 5, "port.gid_index", 0xff, "8 bits"));
        const std::string& link_layer = string_at(row, 6, "port.link_layer");
        if (link_layer == "infiniband") endpoint.port.link_layer = LinkLayer::infiniband;
        else if (link_layer == "ethernet") endpoint.port.link_layer = LinkLayer::ethernet;
        else throw Error("field 'port.link_layer' = \"" + link_layer.substr(0, 40) + "\" is not infiniband or ethernet");
        endpoint.port.mtu = static_cast<std::uint32_t>(unsigned_at(row, 7, "port.mtu", 4096, "256..4096"));
        const nlohmann::json& rc = array_at(row, 8, "rc", 2);
        if (rc.size() == 2) {
            endpoint.rc.push_back({recipient,
                                   static_cast<std::uint32_t>(unsigned_at(rc, 0, "rc.qpn", max_24_bits, "24 bits")),
                                   static_cast<std::uint32_t>(unsigned_at(rc, 1, "rc.psn", max_24_bits, "24 bits"))});
        } else if (!rc.empty()) {
            throw Error("field 'rc' = " + shown(rc) + " is neither [] nor [qpn, psn]");
        }
        const nlohmann::json& dc = array_at(row, 9, "dc", endpoint_max_dc_entries);
        for (std::size_t position = 0; position < dc.size(); ++position) {
            const std::string field = "dc[" + std::to_string(position) + "]";
            const nlohmann::json& entry = dc[position];
            if (!entry.is_array() || entry.size() != 2)
                throw Error("field '" + field + "' = " + shown(entry) + " is not [dctn, \"dc_key\"]");
            endpoint.dc.push_back({static_cast<std::uint32_t>(unsigned_at(entry, 0, field + ".dctn", max_24_bits, "24 bits")),
                                   hex64_at(entry, 1, field + ".dc_key")});
        }
        const nlohmann::json& dci = array_at(row, 10, "dci", endpoint_max_dc_entries);
        for (std::size_t position = 0; position < dci.size(); ++position)
            endpoint.dci.push_back(static_cast<std::uint32_t>(
                unsigned_at(dci, position, "dci[" + std::to_string(position) + "]", max_24_bits, "24 bits")));
        const nlohmann::json& regions = array_at(row, 11, "regions", endpoint_max_regions);
        for (std::size_t position = 0; position < regions.size(); ++position) {
            const std::string field = "regions[" + std::to_string(position) + "]";
            const nlohmann::json& entry = regions[position];
            if (!entry.is_array() || entry.size() != 4)
                throw Error("field '" + field + "' = " + shown(entry) + " is not [\"name\", addr, length, rkey]");
            const std::string& name = string_at(entry, 0, field + ".name");
            RemoteRegion region{unsigned_at(entry, 1, field + ".addr", UINT64_MAX, "64 bits"),
                                unsigned_at(entry, 2, field + ".length", UINT64_MAX, "64 bits"),
                                static_cast<std::uint32_t>(unsigned_at(entry, 3, field + ".rkey", UINT32_MAX, "32 bits"))};
            if (!endpoint.regions.emplace(name, region).second)
                throw Error("field '" + field + ".name' = \"" + name.substr(0, 40) + "\" names a region twice");
        }
        validate(endpoint);
        return endpoint;
    } catch (const Error& error) {
        throw Error(where + ": " + error.what());
    }
}

}  // namespace rdmachan::handshake
