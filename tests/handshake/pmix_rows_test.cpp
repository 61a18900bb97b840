// The PMIx bootstrap's row values (handshake/pmix_rows.hpp): what a publisher writes, each reader
// takes back as the table row the rendezvous's readers parse, holding its own RC entry; values
// that are not of that form are refused naming the key's owner, the reader and what is wrong.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "handshake/pmix_rows.hpp"
#include "rdmachan/error.hpp"

using rdmachan::detail::pmix_row_for;
using rdmachan::detail::pmix_row_text;

namespace {

rdmachan::Endpoint publisher() {
    rdmachan::Endpoint endpoint;
    endpoint.rank = 5;
    endpoint.session = 0x5e55000000000005ull;
    endpoint.port.lid = 17;
    endpoint.dci = {0x31};
    endpoint.dc = {{0x200, 0xdc00000000000005ull}};
    endpoint.regions["buffer\nwith a newline"] = {0x1000, 4096, 0x77};
    return endpoint;
}

std::string message_of(std::string_view text, std::optional<std::uint32_t> position) {
    try {
        (void)pmix_row_for(text, position, 9, "key 'k' from rank 5");
    } catch (const rdmachan::Error& error) {
        return error.what();
    }
    return "(accepted)";
}

}  // namespace

TEST_CASE("every reader of an RC block takes the row with its own entry, and a DC row has none") {
    const rdmachan::Endpoint endpoint = publisher();
    const rdmachan::handshake::TableRowText row = rdmachan::handshake::table_row_text(endpoint);
    const std::vector<rdmachan::RcEntry> entries = {{8, 0x1234, 0x11}, {10, 0xabcdef, 0xffffff}};
    // Peers 8, 9, 10 of the block: 9 has no entry.
    const std::vector<const rdmachan::RcEntry*> block = {&entries[0], nullptr, &entries[1]};
    const std::string text = pmix_row_text(row, block);
    for (std::uint32_t position = 0; position < block.size(); ++position) {
        const std::uint32_t reader = 8 + position;
        const std::string taken = pmix_row_for(text, position, reader, "key");
        const rdmachan::Endpoint read =
            rdmachan::handshake::parse_table_row(nlohmann::json::parse(taken), endpoint.rank, reader);
        rdmachan::Endpoint expected = endpoint;
        if (block[position] != nullptr) expected.rc = {{reader, block[position]->qpn, block[position]->psn}};
        CHECK(read == expected);
    }
    const std::string dc_text = pmix_row_text(row, {});
    const rdmachan::Endpoint dc_read =
        rdmachan::handshake::parse_table_row(nlohmann::json::parse(pmix_row_for(dc_text, std::nullopt, 0, "key")), 5, 0);
    CHECK(dc_read == endpoint);
    // The table scanner takes the rows as the JSON reader does.
    std::vector<rdmachan::Endpoint> table;
    const std::string frame = R"({"type":"table","rows":[)" + pmix_row_for(dc_text, std::nullopt, 0, "key") + "]}";
    rdmachan::Endpoint alone = endpoint;  // the scanner leaves escaped names to the JSON reader
    alone.rank = 0;
    alone.regions = {{"buffer", {0x1000, 4096, 0x77}}};
    const std::string alone_frame =
        R"({"type":"table","rows":[)" +
        pmix_row_for(pmix_row_text(rdmachan::handshake::table_row_text(alone), {}), std::nullopt, 0, "key") + "]}";
    REQUIRE(rdmachan::handshake::scan_table(alone_frame, 1, 0, table));
    CHECK(table[0] == alone);
    CHECK_FALSE(rdmachan::handshake::scan_table(frame, 1, 0, table));  // rank 5 at index 0
}

TEST_CASE("a row value not in the form is refused naming the key, the owner and the reader") {
    const std::string row = "[5,\"s\"\n,[]]";
    CHECK(message_of("{\"version\": 2}", 0).find("key 'k' from rank 5 is not a table row in the form") == 0);
    CHECK(message_of(row, 0).find("is not a table row") != std::string::npos);  // RC entries missing
    CHECK(message_of(row + "\n[]", std::nullopt) == "(accepted)");  // an RC value read for its common part
    CHECK(message_of(row + "\n[]", 0) == "key 'k' from rank 5 holds 0 RC entries, none for rank 9 (entry 0 of its block)");
    CHECK(message_of(row + "\n[[1,2],[]]", 2) ==
          "key 'k' from rank 5 holds 2 RC entries, none for rank 9 (entry 2 of its block)");
    for (const char* entries : {"{\"peer\": 0}", "[[1,2]", "[1,2]", "[[1,[2]]]", "[[1,2][3,4]]", "[[1,2],]", "x", "["}) {
        INFO(std::string(entries));
        CHECK(message_of(row + "\n" + entries, 1).find("its RC entries are not a JSON array of [] or [qpn, psn]") !=
              std::string::npos);
    }
    CHECK(message_of(row + "\n[[1,2],[3,4]]", 1) == "(accepted)");
}
