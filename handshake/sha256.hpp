// SHA-256 (FIPS 180-4) and HMAC-SHA-256 (RFC 2104), small and dependency-free: the handshake
// needs only these to prove knowledge of the job token without sending it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

namespace rdmachan::handshake {

using Digest = std::array<std::uint8_t, 32>;

class Sha256 {
  public:
    Sha256();
    void update(std::span<const std::uint8_t> bytes);
    void update(std::string_view text);
    Digest finish();  // the object must not be updated afterwards

  private:
    void compress(const std::uint8_t* block);

    std::array<std::uint32_t, 8> state_;
    std::array<std::uint8_t, 64> block_{};
    std::size_t block_used_ = 0;
    std::uint64_t total_bytes_ = 0;
};

Digest sha256(std::span<const std::uint8_t> bytes);
Digest hmac_sha256(std::span<const std::uint8_t> key, std::span<const std::uint8_t> message);

// Compares in time independent of where the first difference is.
bool digests_equal(const Digest& left, const Digest& right);

inline std::span<const std::uint8_t> as_bytes(std::string_view text) {
    return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

}  // namespace rdmachan::handshake
