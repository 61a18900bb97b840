#include "tools/golden_check/input_fields.hpp"

namespace rdmachan::golden {
namespace {

bool covered(const std::string& path, const ReproducedFields& reproduced) {
    for (const std::string& field : reproduced) {
        if (field == path) return true;
        if (field.size() >= 2 && field.compare(field.size() - 2, 2, ".*") == 0) {
            const std::string prefix = field.substr(0, field.size() - 1);  // keeps the dot
            if (path.compare(0, prefix.size(), prefix) == 0) return true;
            if (path == field.substr(0, field.size() - 2)) return true;
        }
    }
    return false;
}

}  // namespace

bool is_non_zero(const nlohmann::json& value) {
    if (value.is_null()) return false;
    if (value.is_boolean()) return value.get<bool>();
    if (value.is_number_unsigned()) return value.get<std::uint64_t>() != 0;
    if (value.is_number_integer()) return value.get<std::int64_t>() != 0;
    if (value.is_number_float()) return value.get<double>() != 0.0;
    if (value.is_string()) {
        const std::string text = value.get<std::string>();
        return !text.empty() && text.find_first_not_of("0x") != std::string::npos;
    }
    for (const auto& element : value) {
        if (is_non_zero(element)) return true;
    }
    return false;
}

std::optional<std::string> first_unreproduced_field(const nlohmann::json& value, const std::string& path,
                                                    const ReproducedFields& reproduced) {
    if (covered(path, reproduced)) return std::nullopt;
    if (value.is_object()) {
        for (const auto& [key, element] : value.items()) {
            std::optional<std::string> found = first_unreproduced_field(element, path + "." + key, reproduced);
            if (found.has_value()) return found;
        }
        return std::nullopt;
    }
    if (value.is_array()) {
        for (const auto& element : value) {
            std::optional<std::string> found = first_unreproduced_field(element, path + "[]", reproduced);
            if (found.has_value()) return found;
        }
        return std::nullopt;
    }
    if (is_non_zero(value)) return path;
    return std::nullopt;
}

std::optional<CaseResult> unreproduced(const nlohmann::json& one_case, const ReproducedFields& reproduced) {
    std::optional<std::string> field = first_unreproduced_field(one_case.at("inputs"), "inputs", reproduced);
    if (!field.has_value()) return std::nullopt;
    return CaseResult::unsupported(*field + " not reproduced");
}

std::optional<CaseResult> unreproduced_value(const std::string& field, const std::string& why) {
    return CaseResult::unsupported(field + " not reproduced: " + why);
}

}  // namespace rdmachan::golden
