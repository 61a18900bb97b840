// The endpoint JSON schema: every field round-trips, every bad input is refused with a message
// naming the field.
#include "rdmachan/endpoint.hpp"

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "rdmachan/error.hpp"

using rdmachan::Endpoint;

namespace {

Endpoint full_endpoint() {
    Endpoint endpoint;
    endpoint.rank = 7;
    endpoint.session = 0xfedcba9876543210ull;
    endpoint.device = rdmachan::DeviceKind::mlx5;
    endpoint.port.lid = 0xbeef;
    endpoint.port.gid = rdmachan::gid_from_hex("fe80:0000:0000:0000:0248:4eff:fe12:3456");
    endpoint.port.gid_index = 3;
    endpoint.port.link_layer = rdmachan::LinkLayer::ethernet;
    endpoint.port.mtu = 2048;
    endpoint.rc = {{0, 0xffffff, 0}, {1, 17, 0xabcdef}, {9, 1, 0xffffff}};
    endpoint.dc = {{0x123456, 0xffffffffffffffffull}, {1, 0}};
    endpoint.regions["weights"] = {0x7f0000001000ull, 1ull << 30, 0xdeadbeef};
    endpoint.regions["tail"] = {0xffffffffffffff00ull, 0x100, 0};
    return endpoint;
}

nlohmann::json full_json() {
    nlohmann::json json;
    to_json(json, full_endpoint());
    return json;
}

// Parses the JSON and returns the error message (empty if it parsed).
std::string parse_error(const nlohmann::json& json) {
    try {
        (void)rdmachan::parse_endpoint(json.dump());
    } catch (const rdmachan::Error& error) {
        return error.what();
    }
    return {};
}

}  // namespace

TEST_CASE("every endpoint field survives a JSON round trip") {
    const Endpoint original = full_endpoint();
    const Endpoint parsed = rdmachan::parse_endpoint(rdmachan::serialize_endpoint(original));
    CHECK(parsed.rank == 7);
    CHECK(parsed.session == 0xfedcba9876543210ull);
    CHECK(parsed.device == rdmachan::DeviceKind::mlx5);
    CHECK(parsed.port.lid == 0xbeef);
    CHECK(rdmachan::gid_to_hex(parsed.port.gid) == "fe8000000000000002484efffe123456");
    CHECK(parsed.port.gid_index == 3);
    CHECK(parsed.port.link_layer == rdmachan::LinkLayer::ethernet);
    CHECK(parsed.port.mtu == 2048);
    REQUIRE(parsed.rc.size() == 3);
    CHECK(parsed.rc[1] == rdmachan::RcEntry{1, 17, 0xabcdef});
    CHECK(parsed.rc[2].psn == 0xffffff);
    REQUIRE(parsed.dc.size() == 2);
    CHECK(parsed.dc[0].dctn == 0x123456);
    CHECK(parsed.dc[0].dc_key == 0xffffffffffffffffull);
    CHECK(parsed.regions.at("weights") ==
          rdmachan::RemoteRegion{0x7f0000001000ull, 1ull << 30, 0xdeadbeef});
    CHECK(parsed.regions.at("tail").addr == 0xffffffffffffff00ull);
    CHECK(parsed == original);

    for (auto device : {rdmachan::DeviceKind::soft, rdmachan::DeviceKind::verbs}) {
        Endpoint other;
        other.device = device;
        other.port.link_layer = rdmachan::LinkLayer::infiniband;
        CHECK(rdmachan::parse_endpoint(rdmachan::serialize_endpoint(other)) == other);
    }
}

TEST_CASE("unknown fields are ignored and regions are optional") {
    nlohmann::json json = full_json();
    json["a_future_field"] = {{"nested", true}};
    json["port"]["another"] = 12;
    json["rc"][0]["extra"] = "x";
    CHECK(rdmachan::parse_endpoint(json.dump()) == full_endpoint());
    json.erase("regions");
    CHECK(rdmachan::parse_endpoint(json.dump()).regions.empty());
}

TEST_CASE("a newer schema stays readable while its minimum compatible version allows it") {
    nlohmann::json json = full_json();
    json["schema_version"] = 5;
    json["min_compatible_version"] = 1;
    CHECK(rdmachan::parse_endpoint(json.dump()) == full_endpoint());
    json["min_compatible_version"] = 4;
    const std::string message = parse_error(json);
    CHECK(message.find("version 5") != std::string::npos);
    CHECK(message.find("readable from version 4") != std::string::npos);
    CHECK(message.find("schema version 1") != std::string::npos);
    json["schema_version"] = 0;
    json["min_compatible_version"] = 0;
    CHECK(parse_error(json).find("schema version 0") != std::string::npos);
}

TEST_CASE("rejected endpoint values name the field and the value") {
    struct Case {
        const char* description;
        nlohmann::json::json_pointer pointer;
        nlohmann::json value;
        const char* expected;
    };
    using Pointer = nlohmann::json::json_pointer;
    const Case cases[] = {
        {"psn over 24 bits", Pointer("/rc/2/psn"), 16777216,
         "endpoint field 'rc[2].psn' = 16777216 is out of range (24 bits)"},
        {"qpn over 24 bits", Pointer("/rc/0/qpn"), 1 << 24, "'rc[0].qpn' = 16777216"},
        {"dctn over 24 bits", Pointer("/dc/1/dctn"), 1 << 24, "'dc[1].dctn' = 16777216"},
        {"negative qpn", Pointer("/rc/1/qpn"), -1, "'rc[1].qpn' = -1 is negative"},
        {"fractional psn", Pointer("/rc/1/psn"), 1.5, "'rc[1].psn' = 1.5 is not an unsigned"},
        {"string rank", Pointer("/rank"), "7", "'rank' = \"7\" is not an unsigned integer"},
        {"rank over 32 bits", Pointer("/rank"), 1ull << 32, "'rank' = 4294967296"},
        {"MTU not a verbs size", Pointer("/port/mtu"), 1500, "'port.mtu' = 1500"},
        {"MTU too large", Pointer("/port/mtu"), 8192, "'port.mtu' = 8192"},
        {"MTU zero", Pointer("/port/mtu"), 0, "'port.mtu' = 0"},
        {"LID over 16 bits", Pointer("/port/lid"), 65536, "'port.lid' = 65536"},
        {"GID index over 8 bits", Pointer("/port/gid_index"), 256, "'port.gid_index' = 256"},
        {"short GID", Pointer("/port/gid"), "fe80", "'port.gid' = \"fe80\""},
        {"GID with non-hex", Pointer("/port/gid"), "zz8000000000000002484efffe123456",
         "'port.gid' = \"zz80"},
        {"GID number", Pointer("/port/gid"), 5, "'port.gid' = 5 is not a string"},
        {"unknown link layer", Pointer("/port/link_layer"), "token-ring",
         "'port.link_layer' = \"token-ring\" is not one of infiniband, ethernet"},
        {"unknown device", Pointer("/device"), "gpu", "'device' = \"gpu\""},
        {"session not hex", Pointer("/session"), "xyz", "'session' = \"xyz\""},
        {"session too long", Pointer("/session"), "11112222333344445", "'session'"},
        {"dc key number", Pointer("/dc/0/dc_key"), 5, "'dc[0].dc_key' = 5 is not a string"},
        {"rc not an array", Pointer("/rc"), nlohmann::json::object(), "'rc' = {} is not an array"},
        {"rc entry not an object", Pointer("/rc/0"), 3, "'rc[0]' = 3 is not an object"},
        {"port not an object", Pointer("/port"), nlohmann::json::array(), "'port' = []"},
        {"region overflows", Pointer("/regions/tail/length"), 0x101,
         "'regions.tail.length' = 257 overflows 64 bits"},
        {"region rkey over 32 bits", Pointer("/regions/weights/rkey"), 1ull << 32,
         "'regions.weights.rkey' = 4294967296"},
        {"negative region length", Pointer("/regions/weights/length"), -4,
         "'regions.weights.length' = -4 is negative"},
        {"regions not an object", Pointer("/regions"), nlohmann::json::array(),
         "'regions' = [] is not an object"},
        {"empty region name",
         Pointer("/regions/"),
         {{"addr", 0}, {"length", 0}, {"rkey", 0}},
         "'regions' = \"\""},
    };
    for (const Case& test : cases) {
        const std::string description = test.description;
        CAPTURE(description);
        nlohmann::json json = full_json();
        json[test.pointer] = test.value;
        const std::string message = parse_error(json);
        CAPTURE(message);
        CHECK(message.find(test.expected) != std::string::npos);
    }
}

TEST_CASE("missing fields, too many entries and malformed JSON are refused") {
    for (const char* field : {"rank", "session", "device", "port", "rc", "dc", "schema_version"}) {
        CAPTURE(field);
        nlohmann::json json = full_json();
        json.erase(field);
        CHECK(parse_error(json).find(std::string("'") + field + "' is missing") !=
              std::string::npos);
    }
    nlohmann::json json = full_json();
    json["port"].erase("mtu");
    CHECK(parse_error(json).find("'port.mtu' is missing") != std::string::npos);

    json = full_json();
    json["dc"] = nlohmann::json::array();
    for (std::size_t index = 0; index <= rdmachan::endpoint_max_dc_entries; ++index)
        json["dc"].push_back({{"dctn", 1}, {"dc_key", "1"}});
    CHECK(parse_error(json).find("'dc' = 1025 entries has too many entries") != std::string::npos);

    CHECK_THROWS_WITH_AS(rdmachan::parse_endpoint("{\"rank\": "),
                         doctest::Contains("not valid JSON"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(rdmachan::parse_endpoint("[1,2]"), doctest::Contains("not a JSON object"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(rdmachan::parse_endpoint(std::string(100000, '[')),
                         doctest::Contains("deeper than 64"), rdmachan::Error);
    // Brackets inside strings do not count as nesting.
    json = full_json();
    json["regions"][std::string(100, '[')] = {{"addr", 1}, {"length", 1}, {"rkey", 1}};
    CHECK(rdmachan::parse_endpoint(json.dump()).regions.size() == 3);
}

TEST_CASE("serialize validates the value it writes") {
    Endpoint endpoint = full_endpoint();
    endpoint.rc[1].psn = 1u << 24;
    CHECK_THROWS_WITH_AS(rdmachan::serialize_endpoint(endpoint),
                         "endpoint field 'rc[1].psn' = 16777216 is out of range (24 bits)",
                         rdmachan::Error);
    endpoint = full_endpoint();
    endpoint.port.mtu = 1500;
    CHECK_THROWS_WITH_AS(rdmachan::serialize_endpoint(endpoint),
                         doctest::Contains("'port.mtu' = 1500"), rdmachan::Error);
    endpoint = full_endpoint();
    endpoint.regions["tail"].length = 0x1000;
    CHECK_THROWS_WITH_AS(rdmachan::serialize_endpoint(endpoint),
                         doctest::Contains("'regions.tail.length' = 4096 overflows"),
                         rdmachan::Error);
}

TEST_CASE("GID and MTU helpers") {
    const rdmachan::Gid gid = rdmachan::gid_from_hex("00112233445566778899AABBCCDDEEFF");
    CHECK(rdmachan::gid_to_hex(gid) == "00112233445566778899aabbccddeeff");
    CHECK_THROWS_WITH_AS(rdmachan::gid_from_hex("0011"), doctest::Contains("\"0011\""),
                         rdmachan::Error);
    CHECK(rdmachan::mtu_to_ibv_mtu(256) == 1);
    CHECK(rdmachan::mtu_to_ibv_mtu(4096) == 5);
    for (std::uint32_t value = 1; value <= 5; ++value)
        CHECK(rdmachan::mtu_to_ibv_mtu(rdmachan::mtu_from_ibv_mtu(value)) == value);
    CHECK_THROWS_WITH_AS(rdmachan::mtu_to_ibv_mtu(1500), doctest::Contains("MTU 1500"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(rdmachan::mtu_from_ibv_mtu(6), doctest::Contains("ibv_mtu value 6"),
                         rdmachan::Error);
    CHECK_THROWS_AS(rdmachan::mtu_from_ibv_mtu(0), rdmachan::Error);
}
