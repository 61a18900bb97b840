// The PMIx bootstrap's keys and values (pmix_rows.hpp).
#include "handshake/pmix_rows.hpp"

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

std::string pmix_row_key(std::uint64_t sequence) { return "rdmachan." + std::to_string(sequence) + ".row"; }

std::string pmix_row_block_key(std::uint64_t sequence, std::uint32_t block) {
    return "rdmachan." + std::to_string(sequence) + ".row." + std::to_string(block);
}

std::string pmix_row_text(const handshake::TableRowText& row, std::span<const RcEntry* const> block) {
    std::string text;
    text.reserve(row.prefix.size() + row.suffix.size() + 2 + block.size() * 20);
    text.append(row.prefix).append("\n").append(row.suffix);
    if (block.empty()) return text;
    text.append("\n[");
    for (std::size_t position = 0; position < block.size(); ++position) {
        if (position != 0) text += ',';
        handshake::append_table_rc(text, block[position]);
    }
    text += ']';
    return text;
}

std::string pmix_row_for(std::string_view text, std::optional<std::uint32_t> position, std::uint32_t reader,
                         const std::string& what) {
    const std::size_t prefix_end = text.find('\n');
    const std::size_t suffix_end = prefix_end == std::string_view::npos ? prefix_end : text.find('\n', prefix_end + 1);
    if (prefix_end == std::string_view::npos || (position && suffix_end == std::string_view::npos)) {
        throw Error(what + " is not a table row in the form of this rdmachan (" +
                    (position ? "row start, row end and RC entries" : "row start and row end") +
                    ", one per line); is every rank the same version, in the same mode?");
    }
    const std::string_view prefix = text.substr(0, prefix_end);
    const std::string_view suffix = text.substr(prefix_end + 1, suffix_end - prefix_end - 1);
    std::string row;
    row.reserve(text.size());
    row.append(prefix);
    if (!position) {  // a third line, if any, is not this reader's
        row.append("[]").append(suffix);
        return row;
    }
    // The RC entries: `[e0,e1,...]`, each `[]` or `[qpn,psn]`; this rank's is entry `position`.
    const std::string_view entries = text.substr(suffix_end + 1);
    const auto malformed = [&] {
        return Error(what + ": its RC entries are not a JSON array of [] or [qpn, psn]: " +
                     std::string(entries.substr(0, 80)));
    };
    if (entries.size() < 2 || entries.front() != '[' || entries.back() != ']') throw malformed();
    std::size_t at = 1;
    for (std::uint32_t index = 0;; ++index) {
        if (at >= entries.size() - 1) {
            throw Error(what + " holds " + std::to_string(index) + " RC entries, none for rank " + std::to_string(reader) +
                        " (entry " + std::to_string(*position) + " of its block)");
        }
        if (entries[at] != '[') throw malformed();
        const std::size_t close = entries.find(']', at);
        if (close == std::string_view::npos || entries.substr(at + 1, close - at - 1).find('[') != std::string_view::npos)
            throw malformed();
        if (index == *position) {
            row.append(entries.substr(at, close + 1 - at)).append(suffix);
            return row;
        }
        at = close + 1;
        if (entries[at] == ',') {
            ++at;
            if (at == entries.size() - 1) throw malformed();  // a trailing comma
        } else if (at != entries.size() - 1) {
            throw malformed();
        }
    }
}

std::string pmix_common_row_key(std::uint64_t sequence, bool rc_mode) {
    return rc_mode ? pmix_row_block_key(sequence, 0) : pmix_row_key(sequence);
}

std::uint32_t pmix_rc_block_size(std::uint32_t world_size) {
    std::uint32_t size = 1;
    while (static_cast<std::uint64_t>(size) * size < world_size) ++size;
    return size;
}

}  // namespace rdmachan::detail
