// Framing: lengths in network byte order, the size cap, hello magic and versions, truncated
// streams and garbage.
#include "handshake/frame.hpp"

#include <doctest/doctest.h>

#include <random>

#include "rdmachan/error.hpp"

using namespace rdmachan::handshake;

namespace {

std::span<const std::uint8_t> bytes_of(const std::string& text) {
    return {reinterpret_cast<const std::uint8_t*>(text.data()), text.size()};
}

}  // namespace

TEST_CASE("frames carry a big-endian length and split across arbitrary reads") {
    const std::string frame = encode_frame("hello");
    REQUIRE(frame.size() == 9);
    CHECK(frame.substr(0, 4) == std::string("\0\0\0\5", 4));
    const std::string large(0x010203, 'x');
    CHECK(encode_frame(large).substr(0, 4) == std::string("\0\1\2\3", 4));

    std::string stream = encode_frame("first") + encode_frame("") + encode_frame(large);
    FrameDecoder decoder("peer A", 1 << 20);
    std::vector<std::string> frames;
    std::mt19937 random(42);
    for (std::size_t offset = 0; offset < stream.size();) {
        const std::size_t take = std::min<std::size_t>(1 + random() % 5000, stream.size() - offset);
        decoder.feed(bytes_of(stream.substr(offset, take)));
        offset += take;
        while (auto frame = decoder.next_frame()) frames.push_back(*frame);
    }
    REQUIRE(frames.size() == 3);
    CHECK(frames[0] == "first");
    CHECK(frames[1].empty());
    CHECK(frames[2] == large);
    CHECK_NOTHROW(decoder.finish());
}

TEST_CASE("an oversized frame is refused from its header, naming the peer") {
    FrameDecoder decoder("rank 3 at 127.0.0.1:5000", 1024);
    decoder.feed(bytes_of(std::string("\x00\x00\x04\x01", 4)));
    CHECK_THROWS_WITH_AS(decoder.next_frame(),
                         "frame from rank 3 at 127.0.0.1:5000 announces 1025 bytes, more than the "
                         "cap of 1024 bytes",
                         rdmachan::Error);
    FrameDecoder garbage("peer B", unauthenticated_frame_size_cap);
    garbage.feed(bytes_of("GET / HTTP/1.1\r\n"));
    CHECK_THROWS_WITH_AS(garbage.next_frame(), doctest::Contains("peer B announces"),
                         rdmachan::Error);
    CHECK_THROWS_AS(encode_frame(std::string(2000, 'x'), 1024), rdmachan::Error);
}

TEST_CASE("a stream ending inside a frame is an error naming the peer") {
    FrameDecoder header_cut("peer C", 1024);
    header_cut.feed(bytes_of(std::string("\0\0", 2)));
    CHECK_FALSE(header_cut.next_frame().has_value());
    CHECK_THROWS_WITH_AS(header_cut.finish(),
                         "connection from peer C ended inside a frame header (2 of 4 bytes)",
                         rdmachan::Error);
    FrameDecoder payload_cut("peer D", 1024);
    payload_cut.feed(bytes_of(encode_frame("abcdef").substr(0, 7)));
    CHECK_FALSE(payload_cut.next_frame().has_value());
    CHECK_THROWS_WITH_AS(payload_cut.finish(),
                         "connection from peer D ended inside a frame (3 of 6 payload bytes)",
                         rdmachan::Error);
}

TEST_CASE("hello frames check the magic and both sides' versions") {
    const Hello hello = decode_hello(encode_hello("{\"a\":1}"), "peer E");
    CHECK(hello.version == protocol_version);
    CHECK(hello.min_compatible_version == protocol_min_compatible_version);
    CHECK(hello.body == "{\"a\":1}");

    // A newer peer that can still talk to version 3, and an older one of version 2, are accepted.
    CHECK(decode_hello(encode_hello("{}", 4, 3), "peer F").version == 4);
    CHECK(decode_hello(encode_hello("{}", 2, 2), "peer F2").version == 2);

    CHECK_THROWS_WITH_AS(decode_hello(encode_hello("{}", 5, 4), "peer G"),
                         "peer peer G speaks handshake protocol version 5 (compatible down to 4), "
                         "incompatible with this side's version 3 (compatible down to 2)",
                         rdmachan::Error);
    // Version 1 (every rank received the whole table) is refused, naming both versions.
    CHECK_THROWS_WITH_AS(decode_hello(encode_hello("{}", 1, 1), "peer old"),
                         "peer peer old speaks handshake protocol version 1 (compatible down to 1), "
                         "incompatible with this side's version 3 (compatible down to 2)",
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(decode_hello(encode_hello("{}", 0, 0), "peer H"),
                         doctest::Contains("version 0"), rdmachan::Error);
    CHECK_THROWS_WITH_AS(decode_hello("RDMACHAX\0\0\0\1\0\0\0\1{}", "peer I"),
                         doctest::Contains("peer I is not speaking the rdmachan handshake"),
                         rdmachan::Error);
    CHECK_THROWS_WITH_AS(decode_hello("RDMA", "peer J"), doctest::Contains("bad magic"),
                         rdmachan::Error);
}
