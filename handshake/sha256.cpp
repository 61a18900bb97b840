#include "handshake/sha256.hpp"

#include <algorithm>
#include <cstring>

namespace rdmachan::handshake {
namespace {

// FIPS 180-4 section 4.2.2: the first 32 bits of the fractional parts of the cube roots of the
// first 64 primes.
constexpr std::uint32_t round_constants[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
    0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
    0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
    0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
    0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
    0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
    0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};

constexpr std::uint32_t rotate_right(std::uint32_t value, int bits) {
    return value >> bits | value << (32 - bits);
}

}  // namespace

Sha256::Sha256()
    : state_{0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
             0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19} {}

void Sha256::compress(const std::uint8_t* block) {
    std::uint32_t schedule[64];
    for (int index = 0; index < 16; ++index)
        schedule[index] = std::uint32_t{block[4 * index]} << 24 |
                          std::uint32_t{block[4 * index + 1]} << 16 |
                          std::uint32_t{block[4 * index + 2]} << 8 | block[4 * index + 3];
    for (int index = 16; index < 64; ++index) {
        const std::uint32_t s0 = rotate_right(schedule[index - 15], 7) ^
                                 rotate_right(schedule[index - 15], 18) ^ schedule[index - 15] >> 3;
        const std::uint32_t s1 = rotate_right(schedule[index - 2], 17) ^
                                 rotate_right(schedule[index - 2], 19) ^ schedule[index - 2] >> 10;
        schedule[index] = schedule[index - 16] + s0 + schedule[index - 7] + s1;
    }
    std::uint32_t a = state_[0], b = state_[1], c = state_[2], d = state_[3];
    std::uint32_t e = state_[4], f = state_[5], g = state_[6], h = state_[7];
    for (int index = 0; index < 64; ++index) {
        const std::uint32_t sum1 = rotate_right(e, 6) ^ rotate_right(e, 11) ^ rotate_right(e, 25);
        const std::uint32_t choose = (e & f) ^ (~e & g);
        const std::uint32_t temp1 = h + sum1 + choose + round_constants[index] + schedule[index];
        const std::uint32_t sum0 = rotate_right(a, 2) ^ rotate_right(a, 13) ^ rotate_right(a, 22);
        const std::uint32_t majority = (a & b) ^ (a & c) ^ (b & c);
        const std::uint32_t temp2 = sum0 + majority;
        h = g;
        g = f;
        f = e;
        e = d + temp1;
        d = c;
        c = b;
        b = a;
        a = temp1 + temp2;
    }
    state_[0] += a;
    state_[1] += b;
    state_[2] += c;
    state_[3] += d;
    state_[4] += e;
    state_[5] += f;
    state_[6] += g;
    state_[7] += h;
}

void Sha256::update(std::span<const std::uint8_t> bytes) {
    total_bytes_ += bytes.size();
    std::size_t offset = 0;
    while (offset < bytes.size()) {
        const std::size_t take = std::min(bytes.size() - offset, block_.size() - block_used_);
        std::memcpy(block_.data() + block_used_, bytes.data() + offset, take);
        block_used_ += take;
        offset += take;
        if (block_used_ == block_.size()) {
            compress(block_.data());
            block_used_ = 0;
        }
    }
}

void Sha256::update(std::string_view text) {
    update(as_bytes(text));
}

Digest Sha256::finish() {
    // Padding: a 1 bit, zeros up to 56 bytes mod 64, then the message length in bits (big endian).
    const std::uint64_t total_bits = total_bytes_ * 8;
    const std::uint8_t one_bit = 0x80;
    update(std::span<const std::uint8_t>(&one_bit, 1));
    const std::uint8_t zero = 0;
    while (block_used_ != 56) update(std::span<const std::uint8_t>(&zero, 1));
    std::uint8_t length[8];
    for (int index = 0; index < 8; ++index)
        length[index] = static_cast<std::uint8_t>(total_bits >> (56 - 8 * index));
    update(std::span<const std::uint8_t>(length, 8));
    Digest digest;
    for (int index = 0; index < 8; ++index)
        for (int byte = 0; byte < 4; ++byte)
            digest[4 * index + byte] = static_cast<std::uint8_t>(state_[index] >> (24 - 8 * byte));
    return digest;
}

Digest sha256(std::span<const std::uint8_t> bytes) {
    Sha256 hash;
    hash.update(bytes);
    return hash.finish();
}

Digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message) {
    // RFC 2104: keys longer than the block are hashed first, shorter ones zero-padded.
    std::array<std::uint8_t, 64> block_key{};
    if (key.size() > block_key.size()) {
        const Digest hashed = sha256(key);
        std::memcpy(block_key.data(), hashed.data(), hashed.size());
    } else if (!key.empty()) {
        std::memcpy(block_key.data(), key.data(), key.size());
    }
    std::array<std::uint8_t, 64> inner_pad, outer_pad;
    for (std::size_t index = 0; index < block_key.size(); ++index) {
        inner_pad[index] = block_key[index] ^ 0x36;
        outer_pad[index] = block_key[index] ^ 0x5c;
    }
    Sha256 inner;
    inner.update(inner_pad);
    inner.update(message);
    const Digest inner_digest = inner.finish();
    Sha256 outer;
    outer.update(outer_pad);
    outer.update(inner_digest);
    return outer.finish();
}

bool digests_equal(const Digest& left, const Digest& right) {
    std::uint8_t difference = 0;
    for (std::size_t index = 0; index < left.size(); ++index)
        difference |= left[index] ^ right[index];
    return difference == 0;
}

}  // namespace rdmachan::handshake
