#include "handshake/crypto.hpp"

#include <openssl/crypto.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include <limits>
#include <string>

#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

// OpenSSL's own reason for the last failure, for an error a person can act on.
std::string openssl_reason(const char* call) {
    const unsigned long code = ERR_get_error();
    char text[256] = "no reason recorded";
    if (code != 0) ERR_error_string_n(code, text, sizeof text);
    return std::string(call) + " failed: " + text;
}

// OpenSSL takes int lengths in places; a message that long is a caller's bug, not a digest.
void check_length(std::size_t length, const char* what) {
    if (length > static_cast<std::size_t>(std::numeric_limits<int>::max()))
        throw Error(std::string("crypto: ") + what + " of " + std::to_string(length) + " bytes is too long");
}

}  // namespace

Digest sha256(std::span<const std::uint8_t> bytes) {
    Digest digest{};
    unsigned int length = 0;
    if (EVP_Digest(bytes.data(), bytes.size(), digest.data(), &length, EVP_sha256(), nullptr) != 1 ||
        length != digest.size())
        throw Error("crypto: " + openssl_reason("EVP_Digest(SHA-256)"));
    return digest;
}

Digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message) {
    check_length(key.size(), "an HMAC key");
    Digest digest{};
    unsigned int length = 0;
    // HMAC() reads an empty key through its pointer; give it a valid one.
    static const std::uint8_t empty_key = 0;
    const std::uint8_t* key_bytes = key.empty() ? &empty_key : key.data();
    if (HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()), message.data(), message.size(),
             digest.data(), &length) == nullptr ||
        length != digest.size())
        throw Error("crypto: " + openssl_reason("HMAC(SHA-256)"));
    return digest;
}

bool equal_in_constant_time(std::span<const std::uint8_t> left, std::span<const std::uint8_t> right) {
    // The lengths of proofs are public (fixed by the protocol); only their contents are secret.
    if (left.size() != right.size()) return false;
    if (left.empty()) return true;
    return CRYPTO_memcmp(left.data(), right.data(), left.size()) == 0;
}

void random_bytes(std::span<std::uint8_t> bytes) {
    check_length(bytes.size(), "a random request");
    if (bytes.empty()) return;
    if (RAND_bytes(bytes.data(), static_cast<int>(bytes.size())) != 1)
        throw Error("crypto: " + openssl_reason("RAND_bytes"));
}

std::uint64_t random_u64() {
    std::uint8_t bytes[8];
    random_bytes(bytes);
    std::uint64_t value = 0;
    for (std::uint8_t byte : bytes) value = value << 8 | byte;
    return value;
}

std::string base64_encode(std::string_view bytes) {
    check_length(bytes.size() / 3 * 4 + 4, "base64 text");
    std::string text(4 * ((bytes.size() + 2) / 3), '\0');
    if (text.empty()) return text;
    // EVP_EncodeBlock writes a terminating NUL after the text: room for it, then trimmed.
    text.resize(text.size() + 1);
    const int written = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(text.data()),
                                        reinterpret_cast<const unsigned char*>(bytes.data()),
                                        static_cast<int>(bytes.size()));
    text.resize(static_cast<std::size_t>(written));
    return text;
}

std::optional<std::string> base64_decode(std::string_view text) {
    if (text.size() % 4 != 0) return std::nullopt;
    check_length(text.size(), "base64 text");
    // EVP_DecodeBlock skips surrounding blanks and turns '=' into zero bytes; the checks here
    // refuse what it would let through, and the padding's bytes are dropped after.
    std::size_t padding = 0;
    for (std::size_t index = 0; index < text.size(); ++index) {
        const char character = text[index];
        const bool in_alphabet = (character >= 'A' && character <= 'Z') || (character >= 'a' && character <= 'z') ||
                                 (character >= '0' && character <= '9') || character == '+' || character == '/';
        if (character == '=' && index + 2 >= text.size() && (padding > 0 || index + 1 == text.size() ||
                                                             text[index + 1] == '=')) {
            ++padding;
        } else if (!in_alphabet || padding > 0) {
            return std::nullopt;
        }
    }
    std::string bytes(text.size() / 4 * 3, '\0');
    if (bytes.empty()) return bytes;
    const int decoded = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes.data()),
                                        reinterpret_cast<const unsigned char*>(text.data()),
                                        static_cast<int>(text.size()));
    if (decoded < 0 || static_cast<std::size_t>(decoded) != bytes.size()) return std::nullopt;
    bytes.resize(bytes.size() - padding);
    return bytes;
}

}  // namespace rdmachan::handshake
