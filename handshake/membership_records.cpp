#include "handshake/membership_records.hpp"

#include <charconv>
#include <nlohmann/json.hpp>

#include "handshake/hex.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

constexpr int kPairRecordVersion = 1;
constexpr std::uint32_t kLargest24Bits = (1u << 24) - 1;

std::optional<std::uint32_t> parse_id(std::string_view text) {
    if (text.empty() || text.size() > 10 || (text.size() > 1 && text.front() == '0')) return std::nullopt;
    std::uint32_t id = 0;
    const auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), id);
    if (error != std::errc() || end != text.data() + text.size()) return std::nullopt;
    return id;
}

[[noreturn]] void refuse(const std::string& field, const std::string& why) {
    throw Error("pair record field '" + field + "' " + why);
}

const nlohmann::json& field_of(const nlohmann::json& record, const char* name) {
    const auto found = record.find(name);
    if (found == record.end()) refuse(name, "is missing");
    return *found;
}

std::uint32_t read_number(const nlohmann::json& record, const char* name, std::uint32_t largest) {
    const nlohmann::json& value = field_of(record, name);
    if (!value.is_number_unsigned() || value.get<std::uint64_t>() > largest)
        refuse(name, std::string("is not a whole number in 0..").append(std::to_string(largest)));
    return static_cast<std::uint32_t>(value.get<std::uint64_t>());
}

std::uint64_t read_session(const nlohmann::json& record, const char* name) {
    const nlohmann::json& value = field_of(record, name);
    if (!value.is_string() || value.get_ref<const std::string&>().size() != 16) refuse(name, "is not 16 hex digits");
    std::uint64_t session = 0;
    if (!parse_hex_u64(value.get_ref<const std::string&>(), session)) refuse(name, "is not 16 hex digits");
    return session;
}

}  // namespace

std::string member_key(std::uint32_t id) { return std::string(kMembersPrefix) + std::to_string(id); }
std::string leaving_key(std::uint32_t id) { return member_key(id) + "/leaving"; }
std::string pairs_prefix(std::uint32_t to) { return "pairs/" + std::to_string(to) + "/"; }
std::string pair_key(std::uint32_t to, std::uint32_t from) { return pairs_prefix(to) + std::to_string(from); }

std::optional<MemberKey> parse_member_key(std::string_view key) {
    if (!key.starts_with(kMembersPrefix)) return std::nullopt;
    key.remove_prefix(kMembersPrefix.size());
    MemberKey parsed;
    constexpr std::string_view leaving = "/leaving";
    if (key.ends_with(leaving)) {
        parsed.leaving = true;
        key.remove_suffix(leaving.size());
    }
    const std::optional<std::uint32_t> id = parse_id(key);
    if (!id) return std::nullopt;
    parsed.id = *id;
    return parsed;
}

std::optional<std::uint32_t> parse_pair_key(std::string_view key, std::uint32_t to) {
    const std::string prefix = pairs_prefix(to);
    if (!key.starts_with(prefix)) return std::nullopt;
    return parse_id(key.substr(prefix.size()));
}

const char* to_string(PairRecord::State state) {
    switch (state) {
        case PairRecord::State::offered: return "offered";
        case PairRecord::State::connected: return "connected";
        case PairRecord::State::released: return "released";
    }
    return "unknown";
}

std::string serialize_pair_record(const PairRecord& record) {
    const nlohmann::json json = {{"version", kPairRecordVersion},     {"state", to_string(record.state)},
                                 {"from_session", to_hex_u64(record.from_session)},
                                 {"to_session", to_hex_u64(record.to_session)},
                                 {"qpn", record.qpn},                  {"psn", record.psn},
                                 {"connected_to", record.connected_to}};
    return json.dump();
}

PairRecord parse_pair_record(std::string_view text) {
    const nlohmann::json json = nlohmann::json::parse(text, nullptr, false);
    if (json.is_discarded()) throw Error("pair record is not JSON");
    if (!json.is_object()) throw Error("pair record is not a JSON object");
    const nlohmann::json& version = field_of(json, "version");
    if (!version.is_number_integer() || version.get<std::int64_t>() != kPairRecordVersion)
        refuse("version", "is not " + std::to_string(kPairRecordVersion) + " (the version this library reads)");
    PairRecord record;
    const nlohmann::json& state = field_of(json, "state");
    if (state == "offered") {
        record.state = PairRecord::State::offered;
    } else if (state == "connected") {
        record.state = PairRecord::State::connected;
    } else if (state == "released") {
        record.state = PairRecord::State::released;
    } else {
        refuse("state", "is not \"offered\", \"connected\" or \"released\"");
    }
    record.from_session = read_session(json, "from_session");
    record.to_session = read_session(json, "to_session");
    record.qpn = read_number(json, "qpn", kLargest24Bits);
    record.psn = read_number(json, "psn", kLargest24Bits);
    record.connected_to = read_number(json, "connected_to", kLargest24Bits);
    return record;
}

}  // namespace rdmachan::handshake
