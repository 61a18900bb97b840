// Hex text for binary values (GIDs, nonces, HMACs, session ids, DC keys).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace rdmachan::handshake {

std::string to_hex(const std::uint8_t* bytes, std::size_t size);
// Exactly 2 * size hex digits (either case); false on anything else.
bool from_hex(std::string_view text, std::uint8_t* bytes, std::size_t size);

std::string to_hex_u64(std::uint64_t value);  // 16 lowercase digits
// 1 to 16 hex digits, no prefix; false on anything else.
bool parse_hex_u64(std::string_view text, std::uint64_t& value);

}  // namespace rdmachan::handshake
