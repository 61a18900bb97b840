// The software device's wire protocol between devices (TCP). Every frame is a fixed header
// followed by an optional payload; integers are little-endian on the wire (both ends are this
// same code on little-endian hosts, asserted in byte_order.hpp). A frame from the network is
// never trusted: its length is bounded and every field is checked by the receiver.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

namespace rdmachan::soft::wire {

inline constexpr std::uint32_t kMagic = 0x52444d53;  // "RDMS"
inline constexpr std::uint32_t kMaxPayload = 64u << 20;  // largest message the device carries

enum class FrameType : std::uint8_t {
    hello = 1,     // first frame of a connection: who is calling (gid, lid)
    request = 2,   // initiator → target: one RDMA operation
    response = 3,  // target → initiator: ACK (with read data / atomic result), RNR or NAK
};

enum class ResponseKind : std::uint8_t { ack = 0, receiver_not_ready = 1, negative = 2 };

#pragma pack(push, 1)
struct FrameHeader {
    std::uint32_t magic;
    std::uint32_t payload_length;  // bytes after the fixed part of the frame
    FrameType type;
};

struct Hello {
    std::uint8_t gid[16];
    std::uint16_t lid;
};

struct Request {
    std::uint32_t source_qpn;
    std::uint32_t destination_qpn;
    std::uint32_t psn;
    std::uint8_t opcode;  // the WQE opcode (mlx5 numbering)
    std::uint8_t solicited;
    std::uint64_t remote_addr;
    std::uint32_t rkey;
    std::uint32_t immediate;  // immediate data (host order) or rkey to invalidate
    std::uint32_t length;     // bytes to write/send (payload follows) or to read
    std::uint64_t compare_add;
    std::uint64_t swap;
    std::uint8_t dc_flags;    // RequestDcFlag bits; 0 for RC
    std::uint64_t dc_key;     // DC: the key from the initiator's address vector
};

enum RequestDcFlag : std::uint8_t {
    kDcRequest = 1u << 0,        // from a DCI to a DCT
    kDcConnect = 1u << 1,        // the DCI's first request to this DCT since it (re)connected: sets the PSN
    kDcGlobalRoute = 1u << 2,    // the address vector carried a GRH
    // A copy sent again after a transport timeout: the first may have been executed, so a
    // retransmitted connect must not restart the PSN sequence of a DCI the DCT already knows.
    kDcRetransmission = 1u << 3,
};

struct Response {
    std::uint32_t destination_qpn;  // the initiator's QP
    std::uint32_t psn;
    ResponseKind kind;
    std::uint8_t syndrome;          // for negative: the initiator's error CQE syndrome
    std::uint8_t rnr_timer;         // for receiver_not_ready: the responder's min_rnr_timer
};
#pragma pack(pop)

template <typename Body>
std::vector<std::uint8_t> frame(FrameType type, const Body& body, const void* payload = nullptr,
                                std::uint32_t payload_length = 0) {
    std::vector<std::uint8_t> bytes(sizeof(FrameHeader) + sizeof(Body) + payload_length);
    const FrameHeader header{kMagic, payload_length, type};
    std::memcpy(bytes.data(), &header, sizeof header);
    std::memcpy(bytes.data() + sizeof header, &body, sizeof body);
    if (payload_length != 0) std::memcpy(bytes.data() + sizeof header + sizeof body, payload, payload_length);
    return bytes;
}

// Size of the fixed part of a frame of this type, or 0 for an unknown type.
inline std::size_t body_size(FrameType type) {
    switch (type) {
        case FrameType::hello: return sizeof(Hello);
        case FrameType::request: return sizeof(Request);
        case FrameType::response: return sizeof(Response);
    }
    return 0;
}

}  // namespace rdmachan::soft::wire
