// Challenge-response over a shared job token: each side sends a fresh nonce, each proves it
// knows the token with an HMAC over both nonces and the identity it claims. The token itself
// never crosses the wire, and the role label keeps one side's proof from being replayed as the
// other's.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <string_view>

namespace rdmachan::handshake {

std::string make_nonce();  // 128 random bits (OpenSSL's generator) as 32 hex digits

// HMAC-SHA-256(token, label and fields, each length-prefixed so no two lists collide), as hex.
std::string make_proof(std::string_view token, std::string_view label,
                       std::initializer_list<std::string_view> fields);

// Constant-time comparison of two proofs' hex text.
bool proofs_match(std::string_view expected, std::string_view received);

}  // namespace rdmachan::handshake
