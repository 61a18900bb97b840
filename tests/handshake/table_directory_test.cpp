// The DC directory of a rendezvous table (handshake/table_directory.hpp): what the server encodes
// a reader finds, record by record and initiator by initiator; every malformed directory is
// refused naming the field; two ranks sharing an initiator are found.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "handshake/table_directory.hpp"
#include "rdmachan/error.hpp"

using rdmachan::handshake::DirectoryEntry;
using rdmachan::handshake::DirectoryView;

namespace {

DirectoryEntry entry(std::uint32_t rank, std::vector<std::uint32_t> initiators, bool has_target = true) {
    DirectoryEntry made;
    made.record.gid[0] = 0xfe;
    made.record.gid[15] = static_cast<std::uint8_t>(rank);
    made.record.key = 0xdc00000000000000ull | rank;
    made.record.session = 0x5e55000000000000ull + rank;
    made.record.dctn = 0x100 + rank;
    made.record.lid = static_cast<std::uint16_t>(rank % 2 == 0 ? 7 : 9);  // two ranks per LID
    made.record.device = rdmachan::DeviceKind::mlx5;
    made.record.has_target = has_target;
    made.record.has_initiators = !initiators.empty();
    made.initiators = std::move(initiators);
    return made;
}

void put32(std::string& bytes, std::size_t at, std::uint32_t value) {
    for (int i = 0; i < 4; ++i) bytes[at + i] = static_cast<char>(value >> (8 * i) & 0xff);
}

}  // namespace

TEST_CASE("a directory read back gives every record, every initiator's rank and every row") {
    const std::vector<DirectoryEntry> entries = {entry(0, {0x30, 0x31}), entry(1, {0x30, 0x40}), entry(2, {0x50}, false),
                                                 entry(3, {})};
    const std::vector<std::uint32_t> rows = {2, 10, 30, 31, 41};
    const std::string bytes = rdmachan::handshake::encode_directory(entries, rows);
    const DirectoryView view(bytes, 4, 42);
    REQUIRE(view.size() == 4);
    for (std::uint32_t rank = 0; rank < 4; ++rank) {
        CAPTURE(rank);
        const auto record = view.record(rank);
        CHECK(record.gid == entries[rank].record.gid);
        CHECK(record.key == entries[rank].record.key);
        CHECK(record.session == entries[rank].record.session);
        CHECK(record.dctn == entries[rank].record.dctn);
        CHECK(record.lid == entries[rank].record.lid);
        CHECK(record.device == rdmachan::DeviceKind::mlx5);
        CHECK(record.has_target == entries[rank].record.has_target);
        CHECK(record.has_initiators == entries[rank].record.has_initiators);
        CHECK(view.row(rank) == std::pair<std::size_t, std::size_t>{rows[rank], rows[rank + 1] - 1});
    }
    // Initiator 0x30 is on LID 7 for rank 0 and on LID 9 for rank 1: two senders.
    CHECK(view.sender(7, 0x30) == 0u);
    CHECK(view.sender(9, 0x30) == 1u);
    CHECK(view.sender(7, 0x31) == 0u);
    CHECK(view.sender(9, 0x40) == 1u);
    CHECK(view.sender(7, 0x50) == 2u);
    CHECK_FALSE(view.sender(9, 0x31).has_value());
    CHECK_FALSE(view.sender(7, 0x99).has_value());
    CHECK_FALSE(view.first_collision().has_value());
    // Without row offsets (a directory built from endpoints) it has no rows.
    const std::string without_rows = rdmachan::handshake::encode_directory(entries, {});
    CHECK_FALSE(DirectoryView(without_rows, 4, 0).has_rows());
}

TEST_CASE("two ranks publishing one initiator on one LID are found") {
    const std::vector<DirectoryEntry> entries = {entry(0, {0x30}), entry(1, {0x44}), entry(2, {0x30})};
    const std::string bytes = rdmachan::handshake::encode_directory(entries, {});
    const auto collision = DirectoryView(bytes, 3, 0).first_collision();
    REQUIRE(collision.has_value());
    CHECK(collision->first_rank == 0);
    CHECK(collision->second_rank == 2);
    CHECK(collision->initiator == 0x30);
    CHECK(collision->lid == 7);
}

TEST_CASE("a malformed directory is refused naming the field") {
    const std::vector<DirectoryEntry> entries = {entry(0, {0x30}), entry(1, {0x44})};
    const std::vector<std::uint32_t> rows = {2, 10, 20};
    const std::string good = rdmachan::handshake::encode_directory(entries, rows);
    CHECK_NOTHROW(DirectoryView(good, 2, 21));
    auto refused = [&](const std::string& bytes, std::uint32_t world, std::size_t table, const char* why) {
        CAPTURE(why);
        CHECK_THROWS_WITH_AS(DirectoryView(bytes, world, table), doctest::Contains(why), rdmachan::Error);
    };
    refused(good.substr(0, 20), 2, 21, "less than its header");
    std::string magic = good;
    magic[0] = 'X';
    refused(magic, 2, 21, "field 'magic'");
    refused(good, 3, 21, "field 'ranks' = 2, the world has 3");
    refused(good.substr(0, good.size() - 1), 2, 21, "its fields describe");
    refused(good + "x", 2, 21, "its fields describe");
    refused(good, 2, 15, "field 'rows[2]' = 20");  // a row past the table's end
    std::string falling = good;
    put32(falling, 32 + 4, 1);  // rows[1] before rows[0]
    refused(falling, 2, 21, "field 'rows[1]' = 1");
    std::string records_moved = good;
    put32(records_moved, 20, 40);
    refused(records_moved, 2, 21, "field 'records_at'");
    std::string stranger = good;
    put32(stranger, good.size() - 8, 5);  // the last sender names rank 5 of 2
    refused(stranger, 2, 21, "field 'senders[1].rank' = 5");
    std::string unsorted = good;
    put32(unsorted, good.size() - 16, 0x99);  // the last sender's key now below the first's
    put32(unsorted, good.size() - 12, 0);
    refused(unsorted, 2, 21, "field 'senders' is not sorted at 1");
}
