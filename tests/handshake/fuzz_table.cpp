// libFuzzer target: the rendezvous' compact forms (protocol 2), read from hostile bytes.
//   - A table frame, as a client reads what a server sent: the scanner (the fast path) either
//     refuses it or returns exactly what the JSON path returns for it; the JSON path either
//     returns a table or throws rdmachan::Error (a malformed document may also fail to parse).
//   - The same bytes as a register message's RC triples, as the server reads them from a
//     client: parsed, or refused with rdmachan::Error.
// The first input byte picks the world size (1-8), the second the recipient; the rest is the
// frame. Any other exception, a crash or a disagreement is a finding.
#include <cstdint>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string_view>
#include <vector>

#include "handshake/rendezvous_table.hpp"
#include "rdmachan/error.hpp"

namespace {

// The client's JSON path (rendezvous_client.cpp): rows of the world's size, each a valid row
// of its own rank. Returns false when the document does not parse.
bool parse_as_json(std::string_view frame, std::uint32_t world_size, std::uint32_t recipient,
                   std::vector<rdmachan::Endpoint>& table) {
    const nlohmann::json message = nlohmann::json::parse(frame, nullptr, false);
    if (message.is_discarded()) return false;
    if (!message.is_object()) throw rdmachan::Error("not an object");
    const auto rows = message.find("rows");
    if (rows == message.end() || !rows->is_array() || rows->size() != world_size)
        throw rdmachan::Error("not world_size rows");
    for (std::uint32_t index = 0; index < world_size; ++index) {
        table.push_back(rdmachan::handshake::parse_table_row((*rows)[index], index, recipient));
        if (table.back().rank != index) throw rdmachan::Error("a row at another rank's index");
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
    if (size < 2) return 0;
    const std::uint32_t world_size = 1 + data[0] % 8;
    const std::uint32_t recipient = data[1] % world_size;
    const std::string_view frame(reinterpret_cast<const char*>(data + 2), size - 2);

    std::vector<rdmachan::Endpoint> scanned;
    const bool scanner_accepted = rdmachan::handshake::scan_table(frame, world_size, recipient, scanned);
    std::vector<rdmachan::Endpoint> parsed;
    bool json_accepted = false;
    try {
        json_accepted = parse_as_json(frame, world_size, recipient, parsed);
    } catch (const rdmachan::Error&) {
    }
    if (scanner_accepted && (!json_accepted || !(parsed == scanned))) std::abort();
    if (!scanner_accepted && !scanned.empty()) std::abort();  // "table untouched" on refusal

    const nlohmann::json triples = nlohmann::json::parse(frame, nullptr, false);
    if (!triples.is_discarded()) {
        try {
            (void)rdmachan::handshake::parse_compact_rc_entries(triples);
        } catch (const rdmachan::Error&) {
        }
    }
    return 0;
}
