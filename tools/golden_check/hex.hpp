// Hex strings as the golden vectors write them.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace rdmachan::golden {

inline std::vector<std::uint8_t> bytes_from_hex(const std::string& hex) {
    if (hex.size() % 2 != 0) throw std::runtime_error("odd-length hex string: " + hex.substr(0, 40));
    std::vector<std::uint8_t> bytes(hex.size() / 2);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
        bytes[i] = static_cast<std::uint8_t>(std::stoul(hex.substr(2 * i, 2), nullptr, 16));
    }
    return bytes;
}

// A number written either as a JSON number or as a "0x..." string.
inline std::uint64_t number(const nlohmann::json& value) {
    if (value.is_number_unsigned() || value.is_number_integer()) return value.get<std::uint64_t>();
    if (value.is_string()) return std::stoull(value.get<std::string>(), nullptr, 0);
    throw std::runtime_error("expected a number, got " + value.dump());
}

inline std::uint64_t number_or(const nlohmann::json& object, const char* key, std::uint64_t fallback) {
    return object.contains(key) && !object.at(key).is_null() ? number(object.at(key)) : fallback;
}

}  // namespace rdmachan::golden
