// Placeholder until the receive-side checks land: every receive-side case is reported as
// unsupported, never as a match.
#include "tools/golden_check/case_result.hpp"

namespace rdmachan::golden {

CaseResult check_receive_case(const nlohmann::json&) {
    return CaseResult::unsupported("receive-side checks not built yet");
}

}  // namespace rdmachan::golden
