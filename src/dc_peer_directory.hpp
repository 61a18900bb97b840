// Where a DC multi-channel finds a peer it has not contacted yet: one fixed-size record per rank
// (its DC target's address and key) and, sorted, every rank's DC initiators, by which a receive
// is told to come from that rank. Made once at the handshake and never changed afterwards, so
// the engines of several threads may read one directory at once. DC routing builds a peer's
// state from its record when it first posts to the peer or first receives from it
// (src/dc_routing.hpp); a peer never contacted costs the engine nothing but its pointer.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/endpoint.hpp"

namespace rdmachan::detail {

// A rank's DC target: what an address vector is made of. Plain bytes, the same for every reader.
struct DcPeerRecord {
    std::array<std::uint8_t, 16> gid{};
    std::uint64_t key = 0;
    std::uint32_t dctn = 0;
    std::uint16_t lid = 0;
    DeviceKind device = DeviceKind::soft;
    bool present = false;  // false: no record (a rank the directory was not given)
};
static_assert(sizeof(DcPeerRecord) == 32, "the directory's per-rank cost (docs/SCALE.md)");

// One DC initiator of one rank: (LID << 32 | initiator number), sorted by it.
struct DcSender {
    std::uint64_t key = 0;
    std::uint32_t rank = 0;
};

inline std::uint64_t dc_sender_key(std::uint16_t lid, std::uint32_t initiator) {
    return static_cast<std::uint64_t>(lid) << 32 | initiator;
}

class DcPeerDirectory {
public:
    // Every rank's endpoint, this rank's included (it may send to itself), each with a DC target
    // and initiators (the caller checked: DcPairing::mismatch). Throws
    // rdmachan::Error starting with `me` and naming the two ranks whose initiators could not be
    // told apart.
    static std::shared_ptr<const DcPeerDirectory> from_endpoints(const std::vector<Endpoint>& table, const std::string& me);

    std::uint32_t size() const { return static_cast<std::uint32_t>(records_.size()); }
    // The rank's record, or null when it has none.
    const DcPeerRecord* record(std::uint32_t rank) const {
        if (rank >= records_.size() || !records_[rank].present) return nullptr;
        return &records_[rank];
    }
    // The rank whose initiator `initiator` on LID `lid` is, if any.
    std::optional<std::uint32_t> sender(std::uint16_t lid, std::uint32_t initiator) const;
    // What the directory holds, for the memory figures.
    std::size_t bytes() const {
        return records_.capacity() * sizeof(DcPeerRecord) + senders_.capacity() * sizeof(DcSender);
    }

private:
    std::vector<DcPeerRecord> records_;
    std::vector<DcSender> senders_;  // sorted by key, no key twice
};

}  // namespace rdmachan::detail
