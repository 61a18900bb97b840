// The rendezvous table's compact forms (protocol 2): the canonical scanner and the JSON parse
// agree on everything the server writes, the scanner gives up on anything else, and the JSON
// parse names the row and the field of what is wrong.
#include "handshake/rendezvous_table.hpp"

#include <doctest/doctest.h>

#include "rdmachan/error.hpp"
#include "tests/handshake/rendezvous_support.hpp"

using rdmachan::Endpoint;
using namespace rdmachan::handshake;

namespace {

// Endpoints covering every field: RC and DC, both link layers and every device kind, several
// regions, values at the top of their ranges.
std::vector<Endpoint> varied_endpoints() {
    std::vector<Endpoint> endpoints;
    for (std::uint32_t rank = 0; rank < 4; ++rank) {
        Endpoint endpoint = rdmachan::test::predictable_endpoint(rank, 4);
        endpoint.device = rank == 1 ? rdmachan::DeviceKind::verbs : rank == 2 ? rdmachan::DeviceKind::mlx5
                                                                              : rdmachan::DeviceKind::soft;
        endpoint.port.link_layer = rank % 2 ? rdmachan::LinkLayer::ethernet : rdmachan::LinkLayer::infiniband;
        endpoint.port.gid_index = 255;
        endpoint.port.lid = rank == 3 ? 0xffff : endpoint.port.lid;
        endpoint.session = rank == 3 ? ~0ull : endpoint.session;
        if (rank == 2) {  // DC shaped: no rc entries
            endpoint.rc.clear();
            endpoint.dci = {1, 2, 0xffffff};
        }
        endpoint.regions["second region"] = {~0ull - 9, 10, 0xffffffff};
        endpoints.push_back(endpoint);
    }
    return endpoints;
}

// The table for `recipient`, assembled as RendezvousServer::State::table_for does.
std::string table_frame(const std::vector<Endpoint>& endpoints, std::uint32_t recipient) {
    std::string frame = R"({"type":"table","rows":[)";
    for (std::size_t rank = 0; rank < endpoints.size(); ++rank) {
        if (rank != 0) frame += ',';
        const TableRowText text = table_row_text(endpoints[rank]);
        frame += text.prefix;
        const rdmachan::RcEntry* entry = nullptr;
        for (const auto& candidate : endpoints[rank].rc)
            if (candidate.peer == recipient) entry = &candidate;
        append_table_rc(frame, entry);
        frame += text.suffix;
    }
    return frame + "]}";
}

std::vector<Endpoint> parsed_as_json(const std::string& frame, std::uint32_t recipient) {
    const nlohmann::json message = nlohmann::json::parse(frame);
    std::vector<Endpoint> table;
    for (std::uint32_t index = 0; index < message["rows"].size(); ++index)
        table.push_back(parse_table_row(message["rows"][index], index, recipient));
    return table;
}

using rdmachan::test::error_of;

}  // namespace

TEST_CASE("the scanner and the JSON parse read the server's table identically") {
    const std::vector<Endpoint> endpoints = varied_endpoints();
    for (std::uint32_t recipient = 0; recipient < endpoints.size(); ++recipient) {
        CAPTURE(recipient);
        const std::string frame = table_frame(endpoints, recipient);
        std::vector<Endpoint> scanned;
        REQUIRE(scan_table(frame, 4, recipient, scanned));
        const std::vector<Endpoint> json = parsed_as_json(frame, recipient);
        REQUIRE(scanned.size() == 4);
        for (std::uint32_t rank = 0; rank < 4; ++rank) {
            CAPTURE(rank);
            CHECK(scanned[rank] == json[rank]);
            CHECK(scanned[rank] == rdmachan::test::as_received_by(endpoints[rank], recipient));
        }
    }
}

TEST_CASE("the scanner gives up on valid JSON written differently; the JSON parse reads it") {
    std::vector<Endpoint> endpoints = varied_endpoints();
    endpoints[1].regions["quote \" and caf\xc3\xa9"] = {4096, 64, 7};  // escaped and non-ASCII
    const std::string escaped = table_frame(endpoints, 0);
    std::vector<Endpoint> scanned;
    CHECK_FALSE(scan_table(escaped, 4, 0, scanned));
    CHECK(scanned.empty());
    CHECK(parsed_as_json(escaped, 0)[1] == rdmachan::test::as_received_by(endpoints[1], 0));

    std::string spaced = table_frame(varied_endpoints(), 0);
    spaced.insert(spaced.find("\"rows\"") + 7, " ");
    CHECK_FALSE(scan_table(spaced, 4, 0, scanned));
    CHECK(parsed_as_json(spaced, 0).size() == 4);

    // A row at the wrong index, a missing row, trailing bytes.
    const std::string frame = table_frame(varied_endpoints(), 0);
    CHECK_FALSE(scan_table(frame, 3, 0, scanned));
    CHECK_FALSE(scan_table(frame, 5, 0, scanned));
    CHECK_FALSE(scan_table(frame + " ", 4, 0, scanned));
    CHECK(scan_table(frame, 4, 0, scanned));
}

TEST_CASE("out-of-range and malformed rows: the scanner gives up, the JSON parse names the field") {
    const std::string good = table_frame({varied_endpoints()[0]}, 1);
    std::vector<Endpoint> scanned;
    auto error_for = [&](const std::string& frame) {
        CHECK_FALSE(scan_table(frame, 1, 1, scanned));
        return error_of([&] { parsed_as_json(frame, 1); });
    };
    std::string qpn = good;
    const std::size_t rc = qpn.find(",4096,[") + 7;  // the RC part follows the MTU
    qpn.replace(rc, qpn.find(',', rc) - rc, "16777216");
    CHECK(error_for(qpn) == "table row 0: field 'rc.qpn' = 16777216 is out of range (24 bits)");

    std::string mtu = good;
    mtu.replace(mtu.find(",4096,["), 6, ",4000,");
    CHECK(error_for(mtu).find("table row 0: endpoint field 'port.mtu' = 4000") == 0);

    std::string device = good;
    device.replace(device.find("\"soft\""), 6, "\"tcp\"");
    CHECK(error_for(device) == "table row 0: field 'device' = \"tcp\" is not soft, verbs or mlx5");

    CHECK(error_for(R"({"type":"table","rows":[[0,"5e55"]]})").find("table row 0: is not an array of 12 fields") == 0);
}

TEST_CASE("compact rc entries: triples of unsigned integers, errors name the entry") {
    const std::vector<rdmachan::RcEntry> entries = {{0, 1, 2}, {7, 0xffffff, 0}};
    CHECK(parse_compact_rc_entries(compact_rc_entries(entries)) == entries);
    CHECK(error_of([] { parse_compact_rc_entries(nlohmann::json::parse("[[1,2]]")); }) ==
          "field 'rc[0]' = [1,2] is not [peer, qpn, psn]");
    CHECK(error_of([] { parse_compact_rc_entries(nlohmann::json::parse("[[1,2,3],[1,16777216,3]]")); }) ==
          "field 'rc[1].qpn' = 16777216 is out of range (24 bits)");
    CHECK(error_of([] { parse_compact_rc_entries(nlohmann::json::parse("{}")); }) ==
          "field 'rc' = {} is not an array");
}
