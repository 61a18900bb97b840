// The outcome of replaying one golden-vector case with the project's encoder or decoder.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

namespace rdmachan::golden {

struct CaseResult {
    enum class Kind { match, mismatch, unsupported };
    Kind kind = Kind::match;
    std::string detail;  // where the mismatch is, or why the case is unsupported

    static CaseResult matched() { return {Kind::match, {}}; }
    static CaseResult mismatch(std::string where) { return {Kind::mismatch, std::move(where)}; }
    static CaseResult unsupported(std::string why) { return {Kind::unsupported, std::move(why)}; }
};

// Send-queue cases of vectors.json (no "kind" field).
CaseResult check_send_case(const nlohmann::json& one_case);
// recv-vectors.json cases: "kind" is recv_wqe, srq_wqe or cqe.
CaseResult check_receive_case(const nlohmann::json& one_case);

}  // namespace rdmachan::golden
