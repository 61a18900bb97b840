#include "handshake/table_directory.hpp"

#include <algorithm>
#include <cstring>

#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

constexpr std::array<char, 8> directory_magic = {'R', 'D', 'C', 'D', 'I', 'R', '0', '1'};
constexpr std::uint8_t has_target_flag = 1;
constexpr std::uint8_t has_initiators_flag = 2;

void put(std::string& out, std::uint64_t value, int bytes) {
    for (int i = 0; i < bytes; ++i) out.push_back(static_cast<char>(value >> (8 * i) & 0xff));
}

std::uint64_t get(const std::uint8_t* at, int bytes) {
    std::uint64_t value = 0;
    for (int i = bytes; i-- > 0;) value = value << 8 | at[i];
    return value;
}

std::string count_text(std::uint64_t value) { return std::to_string(value); }

}  // namespace

DirectoryEntry directory_entry(const Endpoint& endpoint) {
    DirectoryEntry entry;
    DirectoryRecord& record = entry.record;
    record.gid = endpoint.port.gid;
    record.lid = endpoint.port.lid;
    record.session = endpoint.session;
    record.device = endpoint.device;
    record.has_target = !endpoint.dc.empty();
    if (record.has_target) {
        record.dctn = endpoint.dc.front().dctn;
        record.key = endpoint.dc.front().dc_key;
    }
    record.has_initiators = !endpoint.dci.empty();
    entry.initiators = endpoint.dci;
    return entry;
}

std::string encode_directory(std::span<const DirectoryEntry> entries, std::span<const std::uint32_t> row_offsets) {
    if (!row_offsets.empty() && row_offsets.size() != entries.size() + 1)
        throw Error("DC directory: " + count_text(row_offsets.size()) + " row offsets for " + count_text(entries.size()) +
                    " ranks");
    struct Sender {
        std::uint64_t key;
        std::uint32_t rank;
    };
    std::vector<Sender> senders;
    for (std::uint32_t rank = 0; rank < entries.size(); ++rank) {
        for (std::uint32_t initiator : entries[rank].initiators)
            senders.push_back({dc_sender_key(entries[rank].record.lid, initiator), rank});
    }
    std::sort(senders.begin(), senders.end(), [](const Sender& left, const Sender& right) {
        return left.key != right.key ? left.key < right.key : left.rank < right.rank;
    });
    // A rank naming one initiator twice is one sender.
    senders.erase(std::unique(senders.begin(), senders.end(),
                              [](const Sender& left, const Sender& right) {
                                  return left.key == right.key && left.rank == right.rank;
                              }),
                  senders.end());
    const std::size_t offsets_at = directory_header_size;
    const std::size_t records_at = offsets_at + row_offsets.size() * 4;
    const std::size_t senders_at = records_at + entries.size() * directory_record_size;
    std::string out;
    out.reserve(senders_at + senders.size() * directory_sender_size);
    out.append(directory_magic.data(), directory_magic.size());
    put(out, entries.size(), 4);
    put(out, senders.size(), 4);
    put(out, row_offsets.empty() ? 0 : offsets_at, 4);
    put(out, records_at, 4);
    put(out, senders_at, 4);
    put(out, 0, 4);
    for (std::uint32_t offset : row_offsets) put(out, offset, 4);
    for (const DirectoryEntry& entry : entries) {
        const DirectoryRecord& record = entry.record;
        out.append(reinterpret_cast<const char*>(record.gid.data()), record.gid.size());
        put(out, record.key, 8);
        put(out, record.session, 8);
        put(out, record.dctn, 4);
        put(out, record.lid, 2);
        put(out, static_cast<std::uint8_t>(record.device), 1);
        put(out, (record.has_target ? has_target_flag : 0) | (record.has_initiators ? has_initiators_flag : 0), 1);
    }
    for (const Sender& sender : senders) {
        put(out, sender.key, 8);
        put(out, sender.rank, 4);
        put(out, 0, 4);
    }
    return out;
}

DirectoryView::DirectoryView(std::string_view bytes, std::uint32_t world_size, std::size_t table_size)
    : base_(reinterpret_cast<const std::uint8_t*>(bytes.data())), size_(bytes.size()) {
    const auto fail = [](const std::string& why) { throw Error("DC directory: " + why); };
    if (size_ < directory_header_size) fail("it has " + count_text(size_) + " bytes, less than its header");
    if (std::memcmp(base_, directory_magic.data(), directory_magic.size()) != 0) fail("field 'magic' is not RDCDIR01");
    ranks_ = static_cast<std::uint32_t>(get(base_ + 8, 4));
    senders_ = static_cast<std::uint32_t>(get(base_ + 12, 4));
    const std::uint64_t offsets_at = get(base_ + 16, 4);
    const std::uint64_t records_at = get(base_ + 20, 4);
    const std::uint64_t senders_at = get(base_ + 24, 4);
    if (ranks_ != world_size)
        fail("field 'ranks' = " + count_text(ranks_) + ", the world has " + count_text(world_size));
    const std::uint64_t offsets_end = offsets_at == 0 ? directory_header_size : offsets_at + (ranks_ + 1ull) * 4;
    if (offsets_at != 0 && offsets_at != directory_header_size)
        fail("field 'offsets_at' = " + count_text(offsets_at) + " is not right after the header");
    if (records_at != offsets_end) fail("field 'records_at' = " + count_text(records_at) + ", expected " + count_text(offsets_end));
    const std::uint64_t records_end = records_at + static_cast<std::uint64_t>(ranks_) * directory_record_size;
    if (senders_at != records_end) fail("field 'senders_at' = " + count_text(senders_at) + ", expected " + count_text(records_end));
    const std::uint64_t end = senders_at + static_cast<std::uint64_t>(senders_) * directory_sender_size;
    if (end != size_) fail("it has " + count_text(size_) + " bytes, its fields describe " + count_text(end));
    offsets_ = offsets_at == 0 ? nullptr : base_ + offsets_at;
    records_ = base_ + records_at;
    sender_table_ = base_ + senders_at;
    if (offsets_ != nullptr) {
        std::uint64_t previous = 0;
        for (std::uint32_t index = 0; index <= ranks_; ++index) {
            const std::uint64_t offset = get(offsets_ + index * 4ull, 4);
            if (offset > table_size || (index != 0 && offset <= previous))
                fail("field 'rows[" + count_text(index) + "]' = " + count_text(offset) +
                     " is not after the previous row and inside the table's " + count_text(table_size) + " bytes");
            previous = offset;
        }
    }
    for (std::uint32_t index = 0; index < senders_; ++index) {
        const std::uint64_t rank = get(sender_table_ + index * directory_sender_size + 8, 4);
        if (rank >= ranks_) fail("field 'senders[" + count_text(index) + "].rank' = " + count_text(rank) + " is not a rank");
        if (index != 0 && sender_key_at(index) < sender_key_at(index - 1))
            fail("field 'senders' is not sorted at " + count_text(index));
    }
}

std::string DirectoryView::describe(const Collision& collision) {
    return "DC: rank " + std::to_string(collision.first_rank) + " and rank " + std::to_string(collision.second_rank) +
           " both publish DC initiator " + std::to_string(collision.initiator) + " on LID " +
           std::to_string(collision.lid) + ": their receives could not be told apart";
}

std::uint64_t DirectoryView::sender_key_at(std::size_t index) const {
    return get(sender_table_ + index * directory_sender_size, 8);
}

DirectoryRecord DirectoryView::record(std::uint32_t rank) const {
    DirectoryRecord record;
    const std::uint8_t* at = records_ + static_cast<std::size_t>(rank) * directory_record_size;
    std::memcpy(record.gid.data(), at, record.gid.size());
    record.key = get(at + 16, 8);
    record.session = get(at + 24, 8);
    record.dctn = static_cast<std::uint32_t>(get(at + 32, 4));
    record.lid = static_cast<std::uint16_t>(get(at + 36, 2));
    const auto device = static_cast<std::uint8_t>(at[38]);
    record.device = device <= static_cast<std::uint8_t>(DeviceKind::mlx5) ? static_cast<DeviceKind>(device) : DeviceKind::verbs;
    record.has_target = (at[39] & has_target_flag) != 0;
    record.has_initiators = (at[39] & has_initiators_flag) != 0;
    return record;
}

std::optional<std::uint32_t> DirectoryView::sender(std::uint16_t lid, std::uint32_t initiator) const {
    const std::uint64_t key = dc_sender_key(lid, initiator);
    std::size_t low = 0;
    std::size_t high = senders_;
    while (low < high) {
        const std::size_t middle = low + (high - low) / 2;
        if (sender_key_at(middle) < key) {
            low = middle + 1;
        } else {
            high = middle;
        }
    }
    if (low == senders_ || sender_key_at(low) != key) return std::nullopt;
    return static_cast<std::uint32_t>(get(sender_table_ + low * directory_sender_size + 8, 4));
}

std::optional<DirectoryView::Collision> DirectoryView::first_collision() const {
    for (std::uint32_t index = 1; index < senders_; ++index) {
        const std::uint64_t key = sender_key_at(index);
        if (key != sender_key_at(index - 1)) continue;
        Collision collision;
        collision.first_rank = static_cast<std::uint32_t>(get(sender_table_ + (index - 1) * directory_sender_size + 8, 4));
        collision.second_rank = static_cast<std::uint32_t>(get(sender_table_ + index * directory_sender_size + 8, 4));
        collision.initiator = static_cast<std::uint32_t>(key);
        collision.lid = static_cast<std::uint16_t>(key >> 32);
        return collision;
    }
    return std::nullopt;
}

std::pair<std::size_t, std::size_t> DirectoryView::row(std::uint32_t rank) const {
    const std::size_t begin = get(offsets_ + rank * 4ull, 4);
    const std::size_t end = get(offsets_ + (rank + 1ull) * 4, 4) - 1;
    return {begin, end};
}

}  // namespace rdmachan::handshake
