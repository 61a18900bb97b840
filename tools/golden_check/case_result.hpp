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

// How the checker builds our side (mlx5-golden-check's options), set once before the cases run.
struct CheckOptions {
    // --scatter-to-cqe: our QP A is created with scatter-to-CQE, so a CQE in format 1 or 2 is
    // unpacked into the buffers of the WQE it completed, as libmlx5 unpacks it. The cases' buffer
    // addresses are the capture's; the checker posts scratch memory in their place and checks
    // the bytes each such completion put there against the CQE's data.
    bool scatter_to_cqe = false;
};
CheckOptions& check_options();

// Send-queue cases of vectors.json (no "kind" field).
CaseResult check_send_case(const nlohmann::json& one_case);
// recv-vectors.json cases: "kind" is recv_wqe, srq_wqe or cqe.
CaseResult check_receive_case(const nlohmann::json& one_case);

}  // namespace rdmachan::golden
