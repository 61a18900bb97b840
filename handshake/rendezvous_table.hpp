// The compact forms the rendezvous (protocol 2) carries, schema in handshake/README.md: a rank's
// RC entries as [peer, qpn, psn] triples in its register message, and the table a rank receives
// as one row (a JSON array) per rank holding only the RC entry made for the recipient. Arrays
// instead of objects: at thousands of ranks the table is most of the rendezvous' work, and an
// array parses several times faster than an object with named keys.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "rdmachan/endpoint.hpp"

namespace rdmachan::handshake {

// [[peer, qpn, psn], ...]
nlohmann::json compact_rc_entries(const std::vector<RcEntry>& entries);
// Throws rdmachan::Error naming the field ("rc[3].qpn") on anything but such triples of
// unsigned integers (peer 32 bits, qpn and psn 24 bits), or more than endpoint_max_rc_entries.
std::vector<RcEntry> parse_compact_rc_entries(const nlohmann::json& entries);

// A table row is prefix + the RC part + suffix; the server serializes prefix and suffix once per
// rank and concatenates per recipient.
struct TableRowText {
    std::string prefix;  // `[rank,"session","device",lid,"gid",gid_index,"link_layer",mtu,`
    std::string suffix;  // `,[[dctn,"dc_key"],...],[dci,...],[["name",addr,length,rkey],...]]`
};
TableRowText table_row_text(const Endpoint& endpoint);
// `[qpn,psn]` for the recipient's entry, `[]` when there is none.
void append_table_rc(std::string& row, const RcEntry* entry);

// One row back into an Endpoint (its rc holding at most the recipient's entry, named as peer
// `recipient`), validated. Throws rdmachan::Error naming the row and the field.
Endpoint parse_table_row(const nlohmann::json& row, std::uint32_t index, std::uint32_t recipient);

// The fast path (rendezvous_table_scanner.cpp): reads a whole table frame written exactly as the
// server writes it, every row valid and at its rank's index. False, with `table` untouched, on
// anything else; the caller then parses the frame as JSON, which names what is wrong. When it
// returns true, `table` equals what the JSON path gives.
bool scan_table(std::string_view frame, std::uint32_t world_size, std::uint32_t recipient,
                std::vector<Endpoint>& table);

}  // namespace rdmachan::handshake
