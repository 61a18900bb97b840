// The fast path for reading a rendezvous table: a scanner for exactly the canonical text the
// server writes (no whitespace, strings of printable ASCII without escapes, plain unsigned
// integers). It allocates only the Endpoints it fills. Anything else — valid JSON written
// differently, or invalid input — makes it give up, and the caller parses the frame with
// nlohmann::json (parse_table_row), whose errors name the row and the field. At thousands of
// ranks the DOM parse was most of the rendezvous' CPU time (docs/SCALE.md).
#include <charconv>
#include <string_view>

#include "handshake/hex.hpp"
#include "handshake/rendezvous_table.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::handshake {
namespace {

class Scanner {
  public:
    explicit Scanner(std::string_view text) : text_(text) {}

    bool literal(std::string_view expected) {
        if (text_.substr(position_, expected.size()) != expected) return false;
        position_ += expected.size();
        return true;
    }
    bool peek(char expected) const { return position_ < text_.size() && text_[position_] == expected; }
    bool at_end() const { return position_ == text_.size(); }

    // A plain unsigned integer: digits, no leading zero unless it is 0, no overflow.
    bool number(std::uint64_t& value, std::uint64_t maximum) {
        const char* begin = text_.data() + position_;
        const char* end = text_.data() + text_.size();
        if (begin == end || *begin < '0' || *begin > '9') return false;
        if (*begin == '0' && begin + 1 < end && begin[1] >= '0' && begin[1] <= '9') return false;
        const auto [stop, error] = std::from_chars(begin, end, value);
        if (error != std::errc() || value > maximum) return false;
        if (stop < end && (*stop == '.' || *stop == 'e' || *stop == 'E')) return false;
        position_ += static_cast<std::size_t>(stop - begin);
        return true;
    }
    template <typename Integer>
    bool number_as(Integer& value, std::uint64_t maximum) {
        std::uint64_t wide = 0;
        if (!number(wide, maximum)) return false;
        value = static_cast<Integer>(wide);
        return true;
    }
    // A string of printable ASCII other than '"' and '\\' (so its JSON text is its value).
    bool string(std::string_view& value) {
        if (!literal("\"")) return false;
        const std::size_t begin = position_;
        while (position_ < text_.size()) {
            const char c = text_[position_];
            if (c == '"') {
                value = text_.substr(begin, position_ - begin);
                ++position_;
                return true;
            }
            if (c == '\\' || static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) > 0x7e) return false;
            ++position_;
        }
        return false;
    }
    bool hex64(std::uint64_t& value) {
        std::string_view text;
        return string(text) && parse_hex_u64(text, value);
    }

  private:
    std::string_view text_;
    std::size_t position_ = 0;
};

constexpr std::uint64_t max_24_bits = (1u << 24) - 1;

bool scan_row(Scanner& in, Endpoint& endpoint, std::uint32_t recipient) {
    std::string_view text;
    if (!in.literal("[") || !in.number_as(endpoint.rank, UINT32_MAX) || !in.literal(",") ||
        !in.hex64(endpoint.session) || !in.literal(",") || !in.string(text))
        return false;
    if (text == "soft") endpoint.device = DeviceKind::soft;
    else if (text == "verbs") endpoint.device = DeviceKind::verbs;
    else if (text == "mlx5") endpoint.device = DeviceKind::mlx5;
    else return false;
    if (!in.literal(",") || !in.number_as(endpoint.port.lid, 0xffff) || !in.literal(",") || !in.string(text) ||
        text.size() != 32 || !from_hex(text, endpoint.port.gid.data(), endpoint.port.gid.size()) ||
        !in.literal(",") || !in.number_as(endpoint.port.gid_index, 0xff) || !in.literal(",") || !in.string(text))
        return false;
    if (text == "infiniband") endpoint.port.link_layer = LinkLayer::infiniband;
    else if (text == "ethernet") endpoint.port.link_layer = LinkLayer::ethernet;
    else return false;
    if (!in.literal(",") || !in.number_as(endpoint.port.mtu, 4096) || !in.literal(",[")) return false;
    if (!in.peek(']')) {
        RcEntry entry{recipient, 0, 0};
        if (!in.number_as(entry.qpn, max_24_bits) || !in.literal(",") || !in.number_as(entry.psn, max_24_bits))
            return false;
        endpoint.rc.push_back(entry);
    }
    if (!in.literal("],[")) return false;
    while (!in.peek(']')) {
        if (!endpoint.dc.empty() && !in.literal(",")) return false;
        DcEntry entry;
        if (endpoint.dc.size() == endpoint_max_dc_entries || !in.literal("[") ||
            !in.number_as(entry.dctn, max_24_bits) || !in.literal(",") || !in.hex64(entry.dc_key) || !in.literal("]"))
            return false;
        endpoint.dc.push_back(entry);
    }
    if (!in.literal("],[")) return false;
    while (!in.peek(']')) {
        if (!endpoint.dci.empty() && !in.literal(",")) return false;
        std::uint32_t initiator = 0;
        if (endpoint.dci.size() == endpoint_max_dc_entries || !in.number_as(initiator, max_24_bits)) return false;
        endpoint.dci.push_back(initiator);
    }
    if (!in.literal("],[")) return false;
    while (!in.peek(']')) {
        if (!endpoint.regions.empty() && !in.literal(",")) return false;
        RemoteRegion region;
        if (endpoint.regions.size() == endpoint_max_regions || !in.literal("[") || !in.string(text) ||
            !in.literal(",") || !in.number(region.addr, UINT64_MAX) || !in.literal(",") ||
            !in.number(region.length, UINT64_MAX) || !in.literal(",") || !in.number_as(region.rkey, UINT32_MAX) ||
            !in.literal("]"))
            return false;
        if (!endpoint.regions.emplace(std::string(text), region).second) return false;
    }
    return in.literal("]]");
}

}  // namespace

bool scan_table(std::string_view frame, std::uint32_t world_size, std::uint32_t recipient,
                std::vector<Endpoint>& table) {
    Scanner in(frame);
    std::vector<Endpoint> rows(world_size);
    if (!in.literal(R"({"type":"table","rows":[)")) return false;
    for (std::uint32_t index = 0; index < world_size; ++index) {
        if (index != 0 && !in.literal(",")) return false;
        if (!scan_row(in, rows[index], recipient) || rows[index].rank != index) return false;
        try {
            validate(rows[index]);
        } catch (const Error&) {
            return false;  // the full parse names the field
        }
    }
    if (!in.literal("]}") || !in.at_end()) return false;
    table = std::move(rows);
    return true;
}

}  // namespace rdmachan::handshake
