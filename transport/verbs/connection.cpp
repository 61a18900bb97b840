#include "transport/verbs/connection.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

namespace {

constexpr std::uint32_t kPsnMask = 0xffffff;

void require_port(const ConnectionParameters& parameters, const char* transition) {
    if (parameters.port_num == 0) {
        throw VerbsError(
            fmt::format("{}: port_num 0 is not a port (ports are numbered from 1)", transition),
            EINVAL);
    }
}

void require_psn(std::uint32_t psn, const char* which, const char* transition) {
    if (psn > kPsnMask)
        throw VerbsError(fmt::format("{}: {} {:#x} exceeds 24 bits", transition, which, psn),
                         EINVAL);
}

}  // namespace

QueuePairTransition make_init_transition(const ConnectionParameters& parameters) {
    require_port(parameters, "RESET->INIT");
    QueuePairTransition transition;
    transition.attributes.qp_state = IBV_QPS_INIT;
    transition.attributes.pkey_index = parameters.pkey_index;
    transition.attributes.port_num = parameters.port_num;
    transition.attributes.qp_access_flags = parameters.access_flags;
    transition.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return transition;
}

QueuePairTransition make_ready_to_receive_transition(const ConnectionParameters& parameters,
                                                     const RcEndpoint& remote) {
    require_port(parameters, "INIT->RTR");
    require_psn(remote.psn, "remote PSN", "INIT->RTR");
    const int mtu = mtu_from_bytes(parameters.path_mtu);
    if (mtu == 0) {
        throw VerbsError(
            fmt::format("INIT->RTR: path MTU {} is not one of 256, 512, 1024, 2048, 4096",
                        parameters.path_mtu),
            EINVAL);
    }
    QueuePairTransition transition;
    ibv_qp_attr& attributes = transition.attributes;
    attributes.qp_state = IBV_QPS_RTR;
    attributes.path_mtu = static_cast<ibv_mtu>(mtu);
    attributes.dest_qp_num = remote.qpn;
    attributes.rq_psn = remote.psn;
    attributes.max_dest_rd_atomic = parameters.max_dest_read_atomic;
    attributes.min_rnr_timer = parameters.min_rnr_timer;
    attributes.ah_attr.port_num = parameters.port_num;
    attributes.ah_attr.sl = parameters.service_level;
    attributes.ah_attr.dlid = remote.lid;
    if (parameters.use_global_routing) {
        attributes.ah_attr.is_global = 1;
        std::memcpy(attributes.ah_attr.grh.dgid.raw, remote.gid.data(), remote.gid.size());
        attributes.ah_attr.grh.sgid_index = parameters.source_gid_index;
        attributes.ah_attr.grh.hop_limit = parameters.hop_limit;
        attributes.ah_attr.grh.traffic_class = parameters.traffic_class;
    }
    transition.mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                      IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    return transition;
}

QueuePairTransition make_ready_to_send_transition(const ConnectionParameters& parameters) {
    require_psn(parameters.send_psn, "send PSN", "RTR->RTS");
    QueuePairTransition transition;
    ibv_qp_attr& attributes = transition.attributes;
    attributes.qp_state = IBV_QPS_RTS;
    attributes.timeout = parameters.timeout;
    attributes.retry_cnt = parameters.retry_count;
    attributes.rnr_retry = parameters.rnr_retry;
    attributes.sq_psn = parameters.send_psn;
    attributes.max_rd_atomic = parameters.max_read_atomic;
    transition.mask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC;
    return transition;
}

}  // namespace rdmachan::verbs
