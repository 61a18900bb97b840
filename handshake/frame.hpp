// Framing for the handshake's TCP streams: each frame is a 4-byte length in network byte order
// followed by that many payload bytes. The first frame each side sends is a hello: a magic, the
// protocol version and the oldest version it can talk to, then a JSON body.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace rdmachan::handshake {

// Version 2: the rendezvous table carries, per peer, only the RC entry that peer made for the
// receiving rank (version 1 sent every peer's whole endpoint, O(N^2) bytes per rank). Version 3:
// the ranks of a host share one copy of the table (handshake/host_table.hpp); a version-3 server
// still serves version-2 clients their own tables.
inline constexpr std::uint32_t protocol_version = 3;
inline constexpr std::uint32_t protocol_min_compatible_version = 2;
inline constexpr std::array<std::uint8_t, 8> protocol_magic = {'R', 'D', 'M', 'A',
                                                               'C', 'H', 'A', 'N'};
inline constexpr std::size_t frame_header_size = 4;
inline constexpr std::size_t hello_header_size = protocol_magic.size() + 8;
// Until a peer has proven the job token it may not make us buffer more than this.
inline constexpr std::size_t unauthenticated_frame_size_cap = 64 * 1024;
// An endpoint table for thousands of ranks fits well below this.
inline constexpr std::size_t authenticated_frame_size_cap = 64 * 1024 * 1024;

// Throws rdmachan::Error if the payload is larger than `size_cap`.
std::string encode_frame(std::string_view payload,
                         std::size_t size_cap = authenticated_frame_size_cap);
// Just the 4-byte header of a frame of `payload_size` bytes (same check).
std::string encode_frame_header(std::size_t payload_size,
                                std::size_t size_cap = authenticated_frame_size_cap);

// Splits a byte stream into frames. `peer` names the other side in every error.
class FrameDecoder {
  public:
    FrameDecoder(std::string peer, std::size_t size_cap);

    void set_size_cap(std::size_t size_cap) { size_cap_ = size_cap; }
    void set_peer(std::string peer) { peer_ = std::move(peer); }
    void feed(std::span<const std::uint8_t> bytes);
    // The next complete frame, if one is buffered. Throws rdmachan::Error when a header
    // announces a frame larger than the cap (before any of it is buffered).
    std::optional<std::string> next_frame();
    // Call when the stream ended: throws rdmachan::Error if a partial frame is buffered.
    void finish() const;
    std::size_t buffered() const { return buffer_.size() - consumed_; }
    const std::string& peer() const { return peer_; }

  private:
    std::string peer_;
    std::size_t size_cap_;
    std::string buffer_;
    std::size_t consumed_ = 0;
};

struct Hello {
    std::uint32_t version = 0;
    std::uint32_t min_compatible_version = 0;
    std::string body;  // JSON text
};

std::string encode_hello(std::string_view body, std::uint32_t version = protocol_version,
                         std::uint32_t min_compatible_version = protocol_min_compatible_version);
// Checks the magic and that the versions are compatible with ours; errors name the peer and
// both sides' versions.
Hello decode_hello(std::string_view payload, const std::string& peer);

}  // namespace rdmachan::handshake
