#include "handshake/frame.hpp"

#include <cstring>

#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

void put_u32(std::string& out, std::uint32_t value) {
    for (int shift = 24; shift >= 0; shift -= 8) out += static_cast<char>(value >> shift & 0xff);
}

std::uint32_t get_u32(const char* bytes) {
    std::uint32_t value = 0;
    for (int index = 0; index < 4; ++index)
        value = value << 8 | static_cast<std::uint8_t>(bytes[index]);
    return value;
}

}  // namespace

std::string encode_frame_header(std::size_t payload_size, std::size_t size_cap) {
    if (payload_size > size_cap)
        throw Error("frame of " + std::to_string(payload_size) +
                    " bytes is larger than the cap of " + std::to_string(size_cap) + " bytes");
    std::string header;
    put_u32(header, static_cast<std::uint32_t>(payload_size));
    return header;
}

std::string encode_frame(std::string_view payload, std::size_t size_cap) {
    std::string frame = encode_frame_header(payload.size(), size_cap);
    frame.reserve(frame_header_size + payload.size());
    frame.append(payload);
    return frame;
}

FrameDecoder::FrameDecoder(std::string peer, std::size_t size_cap)
    : peer_(std::move(peer)), size_cap_(size_cap) {}

void FrameDecoder::feed(std::span<const std::uint8_t> bytes) {
    // Drop consumed bytes before growing, so the buffer holds at most one frame plus a read.
    if (consumed_ > 0) {
        buffer_.erase(0, consumed_);
        consumed_ = 0;
    }
    buffer_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
}

std::optional<std::string> FrameDecoder::next_frame() {
    if (buffered() < frame_header_size) return std::nullopt;
    const std::uint32_t length = get_u32(buffer_.data() + consumed_);
    if (length > size_cap_)
        throw Error("frame from " + peer_ + " announces " + std::to_string(length) +
                    " bytes, more than the cap of " + std::to_string(size_cap_) + " bytes");
    if (buffered() < frame_header_size + length) {
        // Room for the whole frame at once (the length passed the cap): a frame of a megabyte
        // would otherwise be copied at every doubling of the buffer.
        buffer_.reserve(consumed_ + frame_header_size + length);
        return std::nullopt;
    }
    if (consumed_ == 0 && buffer_.size() == frame_header_size + length) {
        // The buffer holds exactly this frame: hand it over instead of copying it.
        std::string frame = std::move(buffer_);
        buffer_.clear();
        frame.erase(0, frame_header_size);
        return frame;
    }
    std::string frame = buffer_.substr(consumed_ + frame_header_size, length);
    consumed_ += frame_header_size + length;
    return frame;
}

void FrameDecoder::finish() const {
    if (buffered() == 0) return;
    if (buffered() < frame_header_size)
        throw Error("connection from " + peer_ + " ended inside a frame header (" +
                    std::to_string(buffered()) + " of 4 bytes)");
    const std::uint32_t length = get_u32(buffer_.data() + consumed_);
    throw Error("connection from " + peer_ + " ended inside a frame (" +
                std::to_string(buffered() - frame_header_size) + " of " + std::to_string(length) +
                " payload bytes)");
}

std::string encode_hello(std::string_view body, std::uint32_t version,
                         std::uint32_t min_compatible_version) {
    std::string payload(protocol_magic.begin(), protocol_magic.end());
    put_u32(payload, version);
    put_u32(payload, min_compatible_version);
    payload.append(body);
    return payload;
}

Hello decode_hello(std::string_view payload, const std::string& peer) {
    if (payload.size() < hello_header_size ||
        std::memcmp(payload.data(), protocol_magic.data(), protocol_magic.size()) != 0)
        throw Error("peer " + peer +
                    " is not speaking the rdmachan handshake protocol (bad magic in its first "
                    "frame of " +
                    std::to_string(payload.size()) + " bytes)");
    Hello hello;
    hello.version = get_u32(payload.data() + protocol_magic.size());
    hello.min_compatible_version = get_u32(payload.data() + protocol_magic.size() + 4);
    if (hello.min_compatible_version > protocol_version ||
        hello.version < protocol_min_compatible_version)
        throw Error(
            "peer " + peer + " speaks handshake protocol version " + std::to_string(hello.version) +
            " (compatible down to " + std::to_string(hello.min_compatible_version) +
            "), incompatible with this side's version " + std::to_string(protocol_version) +
            " (compatible down to " + std::to_string(protocol_min_compatible_version) + ")");
    hello.body = std::string(payload.substr(hello_header_size));
    return hello;
}

}  // namespace rdmachan::handshake
