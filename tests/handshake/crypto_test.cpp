// The OpenSSL wrapper: SHA-256 against the FIPS 180 examples, HMAC-SHA-256 against RFC 4231,
// the constant-time comparison, the random generator.
#include "handshake/crypto.hpp"

#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "handshake/authentication.hpp"
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
    const std::string million(1000000, 'a');
    CHECK(hex(sha256(as_bytes(million))) == "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0");
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

TEST_CASE("HMAC-SHA-256 with an empty key matches the definition (key padded with zeros)") {
    // RFC 2104: the key is padded to the block size, so an empty key and a key of 64 zero
    // bytes give the same MAC.
    CHECK(hmac_sha256({}, as_bytes("message")) == hmac_sha256(repeated(0, 64), as_bytes("message")));
    CHECK(hmac_sha256({}, as_bytes("message")) != hmac_sha256(repeated(1, 64), as_bytes("message")));
}

TEST_CASE("the constant-time comparison finds a difference in any byte and in the length") {
    const Digest digest = sha256(as_bytes("abc"));
    CHECK(equal_in_constant_time(digest, digest));
    for (std::size_t index = 0; index < digest.size(); ++index) {
        Digest changed = digest;
        changed[index] ^= 1;
        CHECK_FALSE(equal_in_constant_time(digest, changed));
    }
    CHECK_FALSE(equal_in_constant_time(std::span(digest).first(31), digest));
    CHECK(equal_in_constant_time({}, {}));
    CHECK(proofs_match("00ff", "00ff"));
    CHECK_FALSE(proofs_match("00ff", "00fe"));
    CHECK_FALSE(proofs_match("00ff", "00ff00"));
}

TEST_CASE("random bytes: every call differs, and every bit position takes both values") {
    // 256 draws of 64 bits: a generator stuck on a value, or on a bit, fails this with
    // certainty; a working one fails with probability about 2^-250.
    std::set<std::uint64_t> seen;
    std::uint64_t ones = 0;
    std::uint64_t zeros = 0;
    for (int draw = 0; draw < 256; ++draw) {
        const std::uint64_t value = random_u64();
        seen.insert(value);
        ones |= value;
        zeros |= ~value;
    }
    CHECK(seen.size() == 256);
    CHECK(ones == ~std::uint64_t{0});
    CHECK(zeros == ~std::uint64_t{0});
    const std::string nonce = make_nonce();
    CHECK(nonce.size() == 32);
    CHECK(nonce != make_nonce());
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
