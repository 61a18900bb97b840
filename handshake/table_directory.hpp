// The DC directory of a rendezvous table (protocol 3, handshake/README.md "The DC directory"):
// beside the table's JSON rows, one fixed-size record per rank (what a DC peer is addressed by,
// and its session), every rank's DC initiators sorted, by which a receive is told to come from
// that rank, and where each rank's row starts in the table's text. The server builds it once
// from the registered endpoints; the ranks of a host read it in place from the host's copy, so a
// rank reads the record of a peer when it first uses it and parses the row of a peer only when
// it asks for its endpoint. Little-endian throughout, whatever the host.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "rdmachan/endpoint.hpp"

namespace rdmachan::handshake {

inline constexpr std::size_t directory_header_size = 32;
inline constexpr std::size_t directory_record_size = 40;
inline constexpr std::size_t directory_sender_size = 16;

// One rank's record.
struct DirectoryRecord {
    Gid gid{};
    std::uint64_t key = 0;      // its DC target's access key
    std::uint64_t session = 0;  // the registering process
    std::uint32_t dctn = 0;     // its DC target number (24 bits)
    std::uint16_t lid = 0;
    DeviceKind device = DeviceKind::soft;
    bool has_target = false;      // it published a DC target (dc[0] is the one recorded)
    bool has_initiators = false;  // it published DC initiators
};

// What the directory is built from, per rank in rank order.
struct DirectoryEntry {
    DirectoryRecord record;
    std::vector<std::uint32_t> initiators;
};

DirectoryEntry directory_entry(const Endpoint& endpoint);

// The directory of `entries` (rank i at index i). `row_offsets`: empty, or world size + 1
// offsets into the table frame, row i spanning [row_offsets[i], row_offsets[i + 1] - 1) (the
// byte after each row is its separator).
std::string encode_directory(std::span<const DirectoryEntry> entries, std::span<const std::uint32_t> row_offsets);

// A directory read in place from bytes someone else owns, checked once: magic, counts against
// the world size, every section inside the bytes, row offsets rising inside a table of
// `table_size` bytes (when it has them), senders sorted. Throws rdmachan::Error naming the
// field that is wrong.
// How the table of senders orders a DC initiator: by LID, then initiator number (what a receive's
// completion names).
inline std::uint64_t dc_sender_key(std::uint16_t lid, std::uint32_t initiator) {
    return static_cast<std::uint64_t>(lid) << 32 | initiator;
}

class DirectoryView {
  public:
    DirectoryView() = default;
    DirectoryView(std::string_view bytes, std::uint32_t world_size, std::size_t table_size);

    std::uint32_t size() const { return ranks_; }
    DirectoryRecord record(std::uint32_t rank) const;
    // The rank whose initiator `initiator` on LID `lid` is: the first such rank by number.
    std::optional<std::uint32_t> sender(std::uint16_t lid, std::uint32_t initiator) const;
    // Two ranks that publish the same initiator on the same LID, if any (their receives could
    // not be told apart), with the initiator and LID.
    struct Collision {
        std::uint32_t first_rank = 0;
        std::uint32_t second_rank = 0;
        std::uint32_t initiator = 0;
        std::uint16_t lid = 0;
    };
    std::optional<Collision> first_collision() const;
    // "DC: rank A and rank B both publish DC initiator I on LID L: ...", the one wording of it.
    static std::string describe(const Collision& collision);
    bool has_rows() const { return offsets_ != nullptr; }
    // Row `rank`'s bytes in the table frame (has_rows()).
    std::pair<std::size_t, std::size_t> row(std::uint32_t rank) const;
    std::size_t bytes() const { return size_; }

  private:
    std::uint64_t sender_key_at(std::size_t index) const;
    const std::uint8_t* base_ = nullptr;
    std::size_t size_ = 0;
    std::uint32_t ranks_ = 0;
    std::uint32_t senders_ = 0;
    const std::uint8_t* offsets_ = nullptr;
    const std::uint8_t* records_ = nullptr;
    const std::uint8_t* sender_table_ = nullptr;
};

}  // namespace rdmachan::handshake
