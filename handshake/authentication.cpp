#include "handshake/authentication.hpp"

#include <random>

#include "handshake/hex.hpp"
#include "handshake/sha256.hpp"

namespace rdmachan::handshake {

std::uint64_t random_u64() {
    std::random_device device;
    return std::uint64_t{device()} << 32 | device();
}

std::string make_nonce() {
    std::uint8_t bytes[16];
    for (int index = 0; index < 16; index += 8) {
        const std::uint64_t value = random_u64();
        for (int byte = 0; byte < 8; ++byte)
            bytes[index + byte] = static_cast<std::uint8_t>(value >> (8 * byte));
    }
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
    if (expected.size() != received.size()) return false;
    unsigned difference = 0;
    for (std::size_t index = 0; index < expected.size(); ++index)
        difference |= static_cast<unsigned char>(expected[index] ^ received[index]);
    return difference == 0;
}

}  // namespace rdmachan::handshake
