// SHA-256 against the FIPS 180 examples, HMAC-SHA-256 against RFC 4231.
#include "handshake/sha256.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "handshake/hex.hpp"

using namespace rdmachan::handshake;

namespace {

std::string hex(const Digest& digest) {
    return to_hex(digest.data(), digest.size());
}

std::vector<std::uint8_t> repeated(std::uint8_t byte, std::size_t count) {
    return std::vector<std::uint8_t>(count, byte);
}

}  // namespace

TEST_CASE("SHA-256 reproduces the FIPS 180 examples") {
    CHECK(hex(sha256(as_bytes(""))) ==
          "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    CHECK(hex(sha256(as_bytes("abc"))) ==
          "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    CHECK(hex(sha256(as_bytes("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq"))) ==
          "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
    // One million 'a', fed in uneven pieces so block boundaries fall mid-update.
    Sha256 hash;
    const std::string piece(997, 'a');
    std::size_t fed = 0;
    while (fed < 1000000) {
        const std::size_t take = std::min<std::size_t>(piece.size(), 1000000 - fed);
        hash.update(std::string_view(piece).substr(0, take));
        fed += take;
    }
    CHECK(hex(hash.finish()) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
}

TEST_CASE("HMAC-SHA-256 reproduces the RFC 4231 test cases") {
    CHECK(hex(hmac_sha256(repeated(0x0b, 20), as_bytes("Hi There"))) ==
          "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
    CHECK(hex(hmac_sha256(as_bytes("Jefe"), as_bytes("what do ya want for nothing?"))) ==
          "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    CHECK(hex(hmac_sha256(repeated(0xaa, 20), repeated(0xdd, 50))) ==
          "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe");
    std::vector<std::uint8_t> counting_key;
    for (std::uint8_t byte = 1; byte <= 25; ++byte) counting_key.push_back(byte);
    CHECK(hex(hmac_sha256(counting_key, repeated(0xcd, 50))) ==
          "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b");
    CHECK(hex(hmac_sha256(repeated(0xaa, 131),
                          as_bytes("Test Using Larger Than Block-Size Key - Hash Key First"))) ==
          "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
    CHECK(hex(hmac_sha256(repeated(0xaa, 131),
                          as_bytes("This is a test using a larger than block-size key and a larger "
                                   "than block-size data. The key needs to be hashed before being "
                                   "used by the HMAC algorithm."))) ==
          "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2");
}

TEST_CASE("digest comparison finds a difference in any byte") {
    const Digest digest = sha256(as_bytes("abc"));
    CHECK(digests_equal(digest, digest));
    for (std::size_t index = 0; index < digest.size(); ++index) {
        Digest changed = digest;
        changed[index] ^= 1;
        CHECK_FALSE(digests_equal(digest, changed));
    }
}

TEST_CASE("hex helpers reject malformed text") {
    std::uint64_t value = 0;
    CHECK(parse_hex_u64("00ff", value));
    CHECK(value == 0xff);
    CHECK(to_hex_u64(0xdeadbeef) == "00000000deadbeef");
    CHECK_FALSE(parse_hex_u64("", value));
    CHECK_FALSE(parse_hex_u64("12345678901234567", value));
    CHECK_FALSE(parse_hex_u64("0x12", value));
    std::uint8_t bytes[2];
    CHECK_FALSE(from_hex("abc", bytes, 2));
    CHECK_FALSE(from_hex("zz00", bytes, 2));
    CHECK(from_hex("A0b1", bytes, 2));
    CHECK(bytes[0] == 0xa0);
    CHECK(bytes[1] == 0xb1);
}
