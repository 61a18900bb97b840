// The handshake's cryptography, all from OpenSSL's libcrypto: HMAC-SHA-256 for proofs of the
// job token, a constant-time comparison for checking them, and random bytes from the
// operating system's generator for nonces, tokens, session ids, PSNs and DC keys, and the base64
// of etcd's gateway. Kept behind this one small interface so nothing else in the project calls
// libcrypto; the etcd client's TLS (etcd_http.cpp) reaches libssl through Asio's ssl::stream.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace rdmachan::handshake {

using Digest = std::array<std::uint8_t, 32>;

Digest sha256(std::span<const std::uint8_t> bytes);
Digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message);

// True when both spans hold the same bytes; the time taken depends only on their lengths.
bool equal_in_constant_time(std::span<const std::uint8_t> left, std::span<const std::uint8_t> right);

// Fills `bytes` from OpenSSL's generator (seeded by the kernel); throws rdmachan::Error when
// the generator cannot produce them, rather than handing out predictable values.
void random_bytes(std::span<std::uint8_t> bytes);
std::uint64_t random_u64();

// Base64 (RFC 4648, with padding), as etcd's JSON gateway carries keys and values.
std::string base64_encode(std::string_view bytes);
// Strict: a length that is not a multiple of 4, a character outside the alphabet, or padding
// anywhere but the end gives nullopt.
std::optional<std::string> base64_decode(std::string_view text);

inline std::span<const std::uint8_t> as_bytes(std::string_view text) {
    return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

}  // namespace rdmachan::handshake
