#include "tests/emulated_connectx/qp_state_walk.hpp"

#include <infiniband/mlx5dv.h>

#include <string>
#include <utility>
#include <vector>

#include "tests/emulated_connectx/qp_state_rules.hpp"

namespace rdmachan::emulated {
namespace {

constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kDciInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kDciRtrMask = IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV;
constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC;

// The masks tried in every (state, next state) pair: each transition's own mask for RC and for a
// DCI, the masks with a required attribute missing or one not allowed added, IBV_QP_CUR_STATE,
// the optional attributes of RTS -> RTS, and masks without IBV_QP_STATE (which the kernel checks
// as current -> current for RC and refuses for a DCI).
const std::vector<int>& masks() {
    static const std::vector<int> kMasks = {
        IBV_QP_STATE,
        kInitMask,
        kDciInitMask,
        kRtrMask,
        kDciRtrMask,
        IBV_QP_STATE | IBV_QP_PATH_MTU,
        kRtsMask,
        kRtsMask | IBV_QP_MIN_RNR_TIMER,
        IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER,
        IBV_QP_STATE | IBV_QP_CUR_STATE,
        kRtrMask & ~IBV_QP_MIN_RNR_TIMER,
        kInitMask | IBV_QP_SQ_PSN,
        IBV_QP_MIN_RNR_TIMER,
        IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS,
        0,
    };
    return kMasks;
}

// Port 1's LID, which an RC QP's address vector names (the QP itself: nothing is sent).
std::uint16_t port_lid = 0;

// Attribute values every case passes, valid on both emulations' port 1; the mask decides which
// the kernel reads.
ibv_qp_attr attributes_for(ibv_qp_state next, ibv_qp_state current, std::uint32_t qpn) {
    ibv_qp_attr attributes{};
    attributes.qp_state = next;
    attributes.cur_qp_state = current;
    attributes.port_num = 1;
    attributes.pkey_index = 0;
    attributes.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
    attributes.path_mtu = IBV_MTU_1024;
    attributes.dest_qp_num = qpn;
    attributes.rq_psn = 0;
    attributes.max_dest_rd_atomic = 1;
    attributes.min_rnr_timer = 12;
    attributes.ah_attr.dlid = port_lid;
    attributes.ah_attr.port_num = 1;
    attributes.timeout = 14;
    attributes.retry_cnt = 7;
    attributes.rnr_retry = 7;
    attributes.sq_psn = 0;
    attributes.max_rd_atomic = 1;
    return attributes;
}

int modify(ibv_qp* qp, ibv_qp_state next, ibv_qp_state current, int mask) {
    ibv_qp_attr attributes = attributes_for(next, current, qp->qp_num);
    return ibv_modify_qp(qp, &attributes, mask);
}

// RESET, then along the accepted path to `state`; false if a step was refused.
bool bring_to(ibv_qp* qp, QueuePairKind kind, ibv_qp_state state) {
    const bool dci = kind == QueuePairKind::dc_initiator;
    if (modify(qp, IBV_QPS_RESET, IBV_QPS_RESET, IBV_QP_STATE) != 0) return false;
    if (state == IBV_QPS_RESET) return true;
    if (modify(qp, IBV_QPS_INIT, IBV_QPS_RESET, dci ? kDciInitMask : kInitMask) != 0) return false;
    if (state == IBV_QPS_INIT) return true;
    if (state == IBV_QPS_ERR) return modify(qp, IBV_QPS_ERR, IBV_QPS_INIT, IBV_QP_STATE) == 0;
    if (modify(qp, IBV_QPS_RTR, IBV_QPS_INIT, dci ? kDciRtrMask : kRtrMask) != 0) return false;
    if (state == IBV_QPS_RTR) return true;
    return modify(qp, IBV_QPS_RTS, IBV_QPS_RTR, kRtsMask) == 0;
}

ibv_qp* create(QueuePairKind kind, ibv_context* context, ibv_pd* pd, ibv_cq* cq) {
    ibv_qp_init_attr_ex attributes{};
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD;
    attributes.pd = pd;
    attributes.send_cq = cq;
    attributes.recv_cq = cq;
    mlx5dv_qp_init_attr dv{};
    if (kind == QueuePairKind::reliable_connected) {
        attributes.qp_type = IBV_QPT_RC;
        attributes.cap = {16, 16, 1, 1, 0};
        dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
        dv.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
    } else {
        attributes.qp_type = IBV_QPT_DRIVER;
        attributes.cap = {16, 0, 1, 0, 0};
        attributes.comp_mask |= IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
        attributes.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_READ;
        dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
        dv.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
    }
    return mlx5dv_create_qp(context, &attributes, &dv);
}

}  // namespace

int walk_modify_cases(ibv_context* context, ibv_pd* pd, ibv_cq* cq, std::FILE* out) {
    const ibv_qp_state starts[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS, IBV_QPS_ERR};
    const ibv_qp_state nexts[] = {IBV_QPS_RESET, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QPS_RTS,
                                  IBV_QPS_SQD,   IBV_QPS_SQE,  IBV_QPS_ERR};
    ibv_port_attr port{};
    if (ibv_query_port(context, 1, &port) != 0) {
        std::fprintf(out, "port 1: not queried\n");
        return 0;
    }
    port_lid = port.lid;
    int cases = 0;
    for (const QueuePairKind kind : {QueuePairKind::reliable_connected, QueuePairKind::dc_initiator}) {
        ibv_qp* qp = create(kind, context, pd, cq);
        if (qp == nullptr) {
            std::fprintf(out, "%s: not created\n", to_string(kind));
            continue;
        }
        for (const ibv_qp_state start : starts) {
            for (const ibv_qp_state next : nexts) {
                for (const int mask : masks()) {
                    ++cases;
                    if (!bring_to(qp, kind, start)) {
                        std::fprintf(out, "%s: could not be brought to %s\n", to_string(kind), state_name(start));
                        continue;
                    }
                    const int result = modify(qp, next, start, mask);
                    std::fprintf(out, "%s %s -> %s mask %s: %d\n", to_string(kind), state_name(start), state_name(next),
                                 mask_names(mask).c_str(), result);
                }
            }
        }
        ibv_destroy_qp(qp);
    }
    return cases;
}

}  // namespace rdmachan::emulated
