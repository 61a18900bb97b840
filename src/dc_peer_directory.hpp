// Where a DC multi-channel finds a peer it has not contacted yet: the fixed world's DC directory
// (handshake/table_directory.hpp), one fixed-size record per rank (its DC target's address and
// key, its session) and every rank's DC initiators, sorted, by which a receive is told to come
// from that rank. Made once at the handshake and never changed afterwards, so the engines of
// several threads may read one directory at once. Through the rendezvous it is read in place
// from the table the ranks of a host share; from an endpoint table it is built here. DC routing
// makes a peer's state from its record when it first posts to the peer or first receives from
// it (src/dc_routing.hpp); a peer never contacted costs the engine nothing but its pointer.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "handshake/table_directory.hpp"
#include "rdmachan/endpoint.hpp"

namespace rdmachan::detail {

using DcPeerRecord = handshake::DirectoryRecord;

class DcPeerDirectory {
public:
    DcPeerDirectory() = default;
    DcPeerDirectory(const DcPeerDirectory&) = delete;  // its view points into its own bytes
    DcPeerDirectory& operator=(const DcPeerDirectory&) = delete;
    // Every rank's endpoint, this rank's included (it may send to itself), each with a DC target
    // and initiators (the caller checked: DcPairing::mismatch). Throws rdmachan::Error starting
    // with `me` and naming the two ranks whose initiators could not be told apart.
    static std::shared_ptr<const DcPeerDirectory> from_endpoints(const std::vector<Endpoint>& table, const std::string& me);
    // A directory in bytes `owner` keeps alive (a rendezvous table), for a world of `world`
    // ranks. Throws rdmachan::Error starting with `me` and naming what is wrong: the directory's
    // form, a rank that published no DC target or no initiators (not in DC mode), or two ranks
    // whose initiators could not be told apart.
    static std::shared_ptr<const DcPeerDirectory> from_bytes(std::string_view bytes, std::size_t table_size,
                                                             std::shared_ptr<const void> owner, std::uint32_t world,
                                                             const std::string& me);

    std::uint32_t size() const { return view_.size(); }
    // The rank's record, or nothing when it has no DC target.
    std::optional<DcPeerRecord> record(std::uint32_t rank) const {
        if (rank >= view_.size()) return std::nullopt;
        DcPeerRecord record = view_.record(rank);
        if (!record.has_target) return std::nullopt;
        return record;
    }
    // The rank whose initiator `initiator` on LID `lid` is, if any.
    std::optional<std::uint32_t> sender(std::uint16_t lid, std::uint32_t initiator) const {
        return view_.sender(lid, initiator);
    }
    // Bytes this rank holds for it (0 when the bytes are a table the host's ranks share).
    std::size_t bytes_owned() const { return owned_.capacity(); }

private:
    // Checks what every DC peer needs of every rank.
    void check(const std::string& me) const;
    std::string owned_;                  // built here, or
    std::shared_ptr<const void> owner_;  // someone else's bytes
    handshake::DirectoryView view_;
};

}  // namespace rdmachan::detail
