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

// The connecting device sends a hello; the accepting device answers it with a hello marked as
// the reply. Besides naming the devices, the pair settles the same-host path: the caller
// offers it with its host identity, its pid and the address of a word holding a random value;
// the answering device reads that word with process_vm_readv, and accepts only when it reads
// the value back (so cross-memory attach works and the pid is really the caller's).
struct Hello {
    std::uint8_t gid[16];
    std::uint16_t lid;
    std::uint8_t same_host_flags;  // HelloFlag bits
    std::uint8_t boot_id[16];
    std::uint32_t uid;
    std::uint64_t network_namespace;
    std::uint64_t pid_namespace;
    std::uint32_t pid;
    std::uint64_t probe_address;  // caller: where its probe word is
    std::uint64_t probe_value;    // caller: the word's value
    std::int32_t refusal;         // reply: errno of a refused cross-memory attach, else 0
    // reply: the descriptor, in the replying process, of the memfd holding its published table
    // (zero-hop writes, published_table.hpp), or -1
    std::int32_t published_table;
};

enum HelloFlag : std::uint8_t {
    kHelloReply = 1u << 0,           // the answer to a caller's hello
    kOffersSameHost = 1u << 1,       // caller: may use the same-host path (RDMACHAN_SOFT_TRANSPORT is not tcp)
    kSameHost = 1u << 2,             // reply: the caller is on this host (boot, user, namespaces)
    kCrossMemoryAttach = 1u << 3,    // reply: payloads may be moved by reference with process_vm_*
    // caller: an ACK completes every earlier plain RDMA write of its QP too, so the responder may
    // coalesce them (a device without this flag expects one ACK per request)
    kAcceptsCoalescedAcks = 1u << 4,
};

// A request whose payload is moved by cross-memory attach carries, instead of the bytes, where
// they are (write, send) or go (read) in the initiator's memory: one Segment per scatter/gather
// entry. The responder moves the bytes after its own checks, so a refused request moves none.
struct Segment {
    std::uint64_t address;
    std::uint64_t length;
};
inline constexpr std::uint32_t kMaxSegments = 32;

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
    std::uint8_t by_reference;  // 1: the payload is Segments in the initiator's memory (same host)
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
