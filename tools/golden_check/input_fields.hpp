// Which input fields of a golden case the checker reproduces. A case is judged only on the
// state it describes: an input field the checker does not reproduce, if non-zero, makes the
// case "unsupported: <field> not reproduced" instead of a match or mismatch on another state.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <string>
#include <vector>

#include "tools/golden_check/case_result.hpp"

namespace rdmachan::golden {

// Paths are dotted from the case's top level ("inputs.setup.pre_polled_cqes"); "[]" stands for
// every element of an array ("inputs.wr_list[].sg_list[].addr"); a path ending in ".*" covers a
// whole subtree. Every path listed is one the checker reads and reproduces, or one whose value
// it checks against what it reproduces (see the lists in send_cases.cpp, receive_cases.cpp and
// completion_case.cpp).
using ReproducedFields = std::vector<std::string>;

// True if a value would change the state it describes: a non-zero number, true, a non-empty
// string other than "0"/"0x0", an array or object with any such element.
bool is_non_zero(const nlohmann::json& value);

// The first leaf under `value` (named `path`) that is non-zero and not covered by `reproduced`.
std::optional<std::string> first_unreproduced_field(const nlohmann::json& value, const std::string& path,
                                                    const ReproducedFields& reproduced);

// "unsupported: <field> not reproduced" for the first input field of `one_case` that is
// non-zero and not in `reproduced`; nothing if there is none.
std::optional<CaseResult> unreproduced(const nlohmann::json& one_case, const ReproducedFields& reproduced);

// "unsupported: <field> not reproduced: <why>", for a field read but not one this tool can rebuild.
std::optional<CaseResult> unreproduced_value(const std::string& field, const std::string& why);

}  // namespace rdmachan::golden
