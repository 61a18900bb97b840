#include "handshake/authentication.hpp"

#include "handshake/crypto.hpp"
#include "handshake/hex.hpp"

namespace rdmachan::handshake {

std::string make_nonce() {
    std::uint8_t bytes[16];
    random_bytes(bytes);
    return to_hex(bytes, sizeof bytes);
}

std::string make_proof(std::string_view token, std::string_view label,
                       std::initializer_list<std::string_view> fields) {
    std::string message;
    auto append = [&message](std::string_view field) {
        message += std::to_string(field.size());
        message += ':';
        message += field;
    };
    append(label);
    for (std::string_view field : fields) append(field);
    const Digest digest = hmac_sha256(as_bytes(token), as_bytes(message));
    return to_hex(digest.data(), digest.size());
}

bool proofs_match(std::string_view expected, std::string_view received) {
    return equal_in_constant_time(as_bytes(expected), as_bytes(received));
}

}  // namespace rdmachan::handshake
