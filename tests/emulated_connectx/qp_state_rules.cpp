#include "tests/emulated_connectx/qp_state_rules.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <utility>
#include <vector>

namespace rdmachan::emulated {
namespace {

struct Rule {
    bool valid = false;
    int required = 0;
    int optional = 0;
};

// Restated from the kernel's qp_state_table, RC column only (the only connected type here),
// with what mlx5's firmware command table refuses on top.
Rule reliable_connected_rule(ibv_qp_state current, ibv_qp_state next) {
    const bool to_reset_or_error = next == IBV_QPS_RESET || next == IBV_QPS_ERR;
    constexpr int kRtsOptional = IBV_QP_CUR_STATE | IBV_QP_ACCESS_FLAGS | IBV_QP_ALT_PATH | IBV_QP_PATH_MIG_STATE |
                                 IBV_QP_MIN_RNR_TIMER;
    switch (current) {
        case IBV_QPS_RESET:
            if (next == IBV_QPS_RESET) return {true, 0, 0};
            if (next == IBV_QPS_INIT) return {true, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS, 0};
            return {};  // RESET -> ERR is not in the table
        case IBV_QPS_INIT:
            if (to_reset_or_error) return {true, 0, 0};
            if (next == IBV_QPS_INIT) return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS};
            if (next == IBV_QPS_RTR) {
                return {true,
                        IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
                            IBV_QP_MIN_RNR_TIMER,
                        IBV_QP_ALT_PATH | IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX};
            }
            return {};
        case IBV_QPS_RTR:
            if (to_reset_or_error) return {true, 0, 0};
            if (next == IBV_QPS_RTS) {
                return {true, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC,
                        kRtsOptional};
            }
            return {};  // RTR -> RTR, also a modify without IBV_QP_STATE in RTR, is not in the table
        case IBV_QPS_RTS:
            if (to_reset_or_error) return {true, 0, 0};
            if (next == IBV_QPS_RTS) return {true, 0, kRtsOptional};
            return {};  // RTS -> SQD: in the core table, but mlx5 has no command for it
        case IBV_QPS_SQD:
            if (to_reset_or_error) return {true, 0, 0};
            if (next == IBV_QPS_RTS) return {true, 0, kRtsOptional};
            return {};  // SQD -> SQD: in the core table, but mlx5 has no command for it
        case IBV_QPS_SQE:
            if (to_reset_or_error) return {true, 0, 0};
            if (next == IBV_QPS_RTS) return {true, 0, 0};  // nothing optional for RC
            return {};
        case IBV_QPS_ERR:
            if (to_reset_or_error) return {true, 0, 0};
            return {};
        default:
            return {};
    }
}

// Restated from mlx5's modify_dci_qp_is_ok (IBV_QP_STATE is required: check_transition).
Rule dc_initiator_rule(ibv_qp_state current, ibv_qp_state next) {
    if (next == IBV_QPS_RESET) return {true, 0, 0};
    if (current == IBV_QPS_RESET && next == IBV_QPS_INIT) return {true, IBV_QP_PKEY_INDEX | IBV_QP_PORT, 0};
    if (current == IBV_QPS_INIT && next == IBV_QPS_INIT) return {true, 0, IBV_QP_PKEY_INDEX | IBV_QP_PORT};
    if (current == IBV_QPS_INIT && next == IBV_QPS_RTR) return {true, IBV_QP_PATH_MTU, IBV_QP_PKEY_INDEX | IBV_QP_AV};
    if (current == IBV_QPS_RTR && next == IBV_QPS_RTS) {
        return {true, IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC | IBV_QP_SQ_PSN,
                IBV_QP_MIN_RNR_TIMER};
    }
    if (current == IBV_QPS_RTS && next == IBV_QPS_RTS) return {true, 0, IBV_QP_MIN_RNR_TIMER};
    if (current != IBV_QPS_RESET && next == IBV_QPS_ERR) return {true, 0, 0};
    return {};
}

// Restated from mlx5_ib_modify_dct: the required attributes, and nothing else allowed.
Rule dc_target_rule(ibv_qp_state current, ibv_qp_state next) {
    if (current == IBV_QPS_RESET && next == IBV_QPS_INIT) {
        return {true, IBV_QP_ACCESS_FLAGS | IBV_QP_PKEY_INDEX | IBV_QP_PORT, 0};
    }
    if (current == IBV_QPS_INIT && next == IBV_QPS_RTR) return {true, IBV_QP_MIN_RNR_TIMER | IBV_QP_AV | IBV_QP_PATH_MTU, 0};
    return {};
}

}  // namespace

const char* to_string(QueuePairKind kind) {
    switch (kind) {
        case QueuePairKind::reliable_connected: return "RC";
        case QueuePairKind::dc_initiator: return "DCI";
        case QueuePairKind::dc_target: return "DCT";
    }
    return "?";
}

const char* state_name(ibv_qp_state state) {
    switch (state) {
        case IBV_QPS_RESET: return "RESET";
        case IBV_QPS_INIT: return "INIT";
        case IBV_QPS_RTR: return "RTR";
        case IBV_QPS_RTS: return "RTS";
        case IBV_QPS_SQD: return "SQD";
        case IBV_QPS_SQE: return "SQE";
        case IBV_QPS_ERR: return "ERR";
        default: return "unknown state";
    }
}

std::string mask_names(int mask) {
    static const std::vector<std::pair<int, const char*>> kNames = {
        {IBV_QP_STATE, "STATE"}, {IBV_QP_CUR_STATE, "CUR_STATE"}, {IBV_QP_EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"},
        {IBV_QP_ACCESS_FLAGS, "ACCESS_FLAGS"}, {IBV_QP_PKEY_INDEX, "PKEY_INDEX"}, {IBV_QP_PORT, "PORT"},
        {IBV_QP_QKEY, "QKEY"}, {IBV_QP_AV, "AV"}, {IBV_QP_PATH_MTU, "PATH_MTU"}, {IBV_QP_TIMEOUT, "TIMEOUT"},
        {IBV_QP_RETRY_CNT, "RETRY_CNT"}, {IBV_QP_RNR_RETRY, "RNR_RETRY"}, {IBV_QP_RQ_PSN, "RQ_PSN"},
        {IBV_QP_MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"}, {IBV_QP_ALT_PATH, "ALT_PATH"},
        {IBV_QP_MIN_RNR_TIMER, "MIN_RNR_TIMER"}, {IBV_QP_SQ_PSN, "SQ_PSN"},
        {IBV_QP_MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"}, {IBV_QP_PATH_MIG_STATE, "PATH_MIG_STATE"},
        {IBV_QP_CAP, "CAP"}, {IBV_QP_DEST_QPN, "DEST_QPN"}, {IBV_QP_RATE_LIMIT, "RATE_LIMIT"}};
    std::string names;
    int rest = mask;
    for (const auto& [bit, name] : kNames) {
        if ((mask & bit) == 0) continue;
        if (!names.empty()) names += '|';
        names += name;
        rest &= ~bit;
    }
    if (rest != 0) names += fmt::format("{}{:#x}", names.empty() ? "" : "|", rest);
    return names.empty() ? "0" : names;
}

TransitionCheck check_transition(QueuePairKind kind, ibv_qp_state current, ibv_qp_state next, int mask) {
    // RC checks a modify without IBV_QP_STATE as current -> current; mlx5's DC checks require it.
    if (kind != QueuePairKind::reliable_connected && (mask & IBV_QP_STATE) == 0) {
        return {EINVAL, fmt::format("{} modify without IBV_QP_STATE (mask {})", to_string(kind), mask_names(mask))};
    }
    // ib_modify_qp_is_ok: CUR_STATE only from RTR, RTS, SQD, SQE.
    if ((mask & IBV_QP_CUR_STATE) != 0 && current != IBV_QPS_RTR && current != IBV_QPS_RTS && current != IBV_QPS_SQD &&
        current != IBV_QPS_SQE) {
        return {EINVAL, fmt::format("{} {} -> {}: IBV_QP_CUR_STATE is allowed only from RTR, RTS, SQD or SQE",
                                    to_string(kind), state_name(current), state_name(next))};
    }
    const Rule rule = kind == QueuePairKind::reliable_connected ? reliable_connected_rule(current, next)
                      : kind == QueuePairKind::dc_initiator      ? dc_initiator_rule(current, next)
                                                                 : dc_target_rule(current, next);
    if (!rule.valid) {
        return {EINVAL, fmt::format("{} {} -> {} is not a valid transition", to_string(kind), state_name(current),
                                    state_name(next))};
    }
    const int missing = rule.required & ~mask;
    if (missing != 0) {
        return {EINVAL, fmt::format("{} {} -> {}: required attributes missing from the mask: {}", to_string(kind),
                                    state_name(current), state_name(next), mask_names(missing))};
    }
    const int unexpected = mask & ~(rule.required | rule.optional | IBV_QP_STATE);
    if (unexpected != 0) {
        return {EINVAL, fmt::format("{} {} -> {}: attributes not allowed in this transition: {}", to_string(kind),
                                    state_name(current), state_name(next), mask_names(unexpected))};
    }
    return {};
}

ModifyCheck check_modify(QueuePairKind kind, ibv_qp_state state, int mask, ibv_qp_state qp_state,
                         ibv_qp_state cur_qp_state) {
    const bool has_state = (mask & IBV_QP_STATE) != 0;
    const bool has_current = (mask & IBV_QP_CUR_STATE) != 0;
    if ((has_state && qp_state > IBV_QPS_ERR) || (has_current && cur_qp_state > IBV_QPS_ERR)) {
        return {{EINVAL, fmt::format("{}: a state value past ERR (mask {})", to_string(kind), mask_names(mask))}, state};
    }
    // mlx5_ib_modify_dct takes the QP's own state; the RC and DCI paths take the caller's claim.
    const ibv_qp_state current = has_current && kind != QueuePairKind::dc_target ? cur_qp_state : state;
    const ibv_qp_state next = has_state ? qp_state : current;
    return {check_transition(kind, current, next, mask), next};
}

}  // namespace rdmachan::emulated
