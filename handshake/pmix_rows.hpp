// The PMIx bootstrap's keys and the form of their values (handshake/README.md, "PMIx
// bootstrap"). Plain text work, compiled with or without libpmix, so tests read it directly.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "handshake/rendezvous_table.hpp"
#include "rdmachan/endpoint.hpp"

namespace rdmachan::detail {

// The keys the exchange uses (handshake/README.md, "PMIx bootstrap"); `sequence` counts the
// exchanges in this process (1 for the first), so a second MultiChannel never reads the first
// one's values. A DC rank publishes its table row under pmix_row_key; an RC rank publishes it
// under pmix_row_block_key for each block of peers [block * B, (block + 1) * B), with the RC
// entries it made for that block's peers. B = pmix_rc_block_size(world size), the whole number
// just at or above the square root of the world size.
std::string pmix_row_key(std::uint64_t sequence);
std::string pmix_row_block_key(std::uint64_t sequence, std::uint32_t block);
std::uint32_t pmix_rc_block_size(std::uint32_t world_size);

// A row key's value: the table row's text before and after its RC part (handshake/
// rendezvous_table.hpp), a line each; an RC row key adds a third line, `[e0,e1,...]`, the entry
// (`[qpn,psn]`, or `[]` for none) for each peer of the block in order.
std::string pmix_row_text(const handshake::TableRowText& row, std::span<const RcEntry* const> block);
// The table row a reader takes from such a value: with `position` (RC: the reader's place in its
// block), the row holding that entry; without, the row with no RC entry (from either form: peer
// replacement reads a rank's common part from its first RC block). Throws rdmachan::Error
// beginning with `what` (the key and its owner) when the value is not of that form or holds no
// entry at `position`; the row itself is checked by the table's readers.
std::string pmix_row_for(std::string_view text, std::optional<std::uint32_t> position, std::uint32_t reader,
                         const std::string& what);
// The key that holds a rank's row with no RC entry needed: its only key (DC) or its first block (RC).
std::string pmix_common_row_key(std::uint64_t sequence, bool rc_mode);

}  // namespace rdmachan::detail
