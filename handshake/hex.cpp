#include "handshake/hex.hpp"

namespace rdmachan::handshake {
namespace {

constexpr char digits[] = "0123456789abcdef";

int digit_value(char character) {
    if (character >= '0' && character <= '9') return character - '0';
    if (character >= 'a' && character <= 'f') return character - 'a' + 10;
    if (character >= 'A' && character <= 'F') return character - 'A' + 10;
    return -1;
}

}  // namespace

std::string to_hex(const std::uint8_t* bytes, std::size_t size) {
    std::string text;
    text.reserve(size * 2);
    for (std::size_t index = 0; index < size; ++index) {
        text += digits[bytes[index] >> 4];
        text += digits[bytes[index] & 0xf];
    }
    return text;
}

bool from_hex(std::string_view text, std::uint8_t* bytes, std::size_t size) {
    if (text.size() != size * 2) return false;
    for (std::size_t index = 0; index < size; ++index) {
        const int high = digit_value(text[2 * index]);
        const int low = digit_value(text[2 * index + 1]);
        if (high < 0 || low < 0) return false;
        bytes[index] = static_cast<std::uint8_t>(high << 4 | low);
    }
    return true;
}

std::string to_hex_u64(std::uint64_t value) {
    std::string text(16, '0');
    for (int index = 15; index >= 0; --index, value >>= 4) text[index] = digits[value & 0xf];
    return text;
}

bool parse_hex_u64(std::string_view text, std::uint64_t& value) {
    if (text.empty() || text.size() > 16) return false;
    std::uint64_t result = 0;
    for (char character : text) {
        const int digit = digit_value(character);
        if (digit < 0) return false;
        result = result << 4 | static_cast<std::uint64_t>(digit);
    }
    value = result;
    return true;
}

}  // namespace rdmachan::handshake
