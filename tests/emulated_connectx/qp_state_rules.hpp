// What the kernel accepts in ibv_modify_qp, as rules both emulations apply: the emulated ConnectX
// before it touches the software device, and the fake uverbs kernel behind the libmlx5 tests
// when it answers MODIFY_QP. Facts from the Linux kernel, restated (not copied), read from
// torvalds/linux as the search index holds it:
//  - RC: drivers/infiniband/core/verbs.c, qp_state_table and ib_modify_qp_is_ok, at commit
//    f4d8f354 (a v5.14 or later tree: port numbers are u32 there). The valid (current, next)
//    state pairs, and per pair the attributes required and allowed.
//  - What mlx5_ib_modify_qp adds (drivers/infiniband/hw/mlx5/qp.c, mainline v5.x-6.x): the
//    current state is attributes.cur_qp_state when IBV_QP_CUR_STATE is in the mask, else the
//    QP's; the next state is attributes.qp_state when IBV_QP_STATE is, else the current one (a
//    modify without IBV_QP_STATE is checked as current -> current). Its firmware command table
//    (optab in __mlx5_ib_modify_qp) has no RTS->SQD nor SQD->SQD command: EINVAL though the
//    core table allows them. SQD->RTS has one in the newer optab (MLX5_CMD_OP_SQD_RTS_QP; older
//    kernels refuse it too, but no QP reaches SQD on mlx5); SQE->RTS (SQERR2RTS) in all.
//  - DCI: mlx5's modify_dci_qp_is_ok (mainline v5.x-6.x form): IBV_QP_STATE always required;
//    any state -> RESET; INIT->RTR requires PATH_MTU and allows PKEY_INDEX and AV (v4.x allowed
//    only PKEY_INDEX).
//  - DCT: mlx5_ib_modify_dct: IBV_QP_STATE required, RESET->INIT and INIT->RTR only, nothing
//    optional.
#pragma once

#include <infiniband/verbs.h>

#include <string>

namespace rdmachan::emulated {

enum class QueuePairKind { reliable_connected, dc_initiator, dc_target };

const char* to_string(QueuePairKind kind);
const char* state_name(ibv_qp_state state);
std::string mask_names(int mask);

struct TransitionCheck {
    int error = 0;       // 0: accepted; else the errno the kernel returns (EINVAL)
    std::string reason;  // names the states and the missing or unexpected attributes
};

// The check of one (current, next) pair as the kernel makes it, `current` and `next` as the kernel
// derived them (check_modify). `mask` as passed to ibv_modify_qp.
TransitionCheck check_transition(QueuePairKind kind, ibv_qp_state current, ibv_qp_state next, int mask);

struct ModifyCheck {
    TransitionCheck check;
    ibv_qp_state next = IBV_QPS_RESET;  // the QP's state after the modify, when accepted
};

// One ibv_modify_qp as the kernel judges it: `state` is the QP's state, `qp_state` and
// `cur_qp_state` the attributes' fields (read only when their bit is in the mask). A state
// value past ERR in either field is EINVAL (ib_uverbs' modify_qp).
ModifyCheck check_modify(QueuePairKind kind, ibv_qp_state state, int mask, ibv_qp_state qp_state,
                         ibv_qp_state cur_qp_state);

}  // namespace rdmachan::emulated
