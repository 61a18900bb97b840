// What the kernel accepts in ibv_modify_qp, as rules the emulated ConnectX applies before it
// touches the software device. Facts from the Linux kernel, restated (not copied):
//  - RC: drivers/infiniband/core/verbs.c, qp_state_table and ib_modify_qp_is_ok (v5.x-6.x):
//    the valid (current, next) state pairs, and per pair the attributes required and allowed
//    for the QP type; mlx5_ib_modify_qp refuses with EINVAL when the check fails.
//  - DCI: drivers/infiniband/hw/mlx5/qp.c, modify_dci_qp_is_ok.
//  - DCT: drivers/infiniband/hw/mlx5/qp.c, mlx5_ib_modify_dct: RESET->INIT and INIT->RTR only.
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

// `mask` as passed to ibv_modify_qp; the next state is attributes.qp_state when IBV_QP_STATE is
// in the mask (the kernel refuses a mask without it: a modify that changes no state is not one
// the project makes, and for DCT the kernel requires it).
TransitionCheck check_transition(QueuePairKind kind, ibv_qp_state current, ibv_qp_state next, int mask);

}  // namespace rdmachan::emulated
