#include "transport/verbs/dc_connection.hpp"

#include <fmt/format.h>

#include <cerrno>

#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

namespace {

void require_port(const ConnectionParameters& parameters, const char* who, const char* transition) {
    if (parameters.port_num == 0) {
        throw VerbsError(fmt::format("{} {}: port_num 0 is not a port (ports are numbered from 1)", who, transition),
                         EINVAL);
    }
}

ibv_mtu require_mtu(const ConnectionParameters& parameters, const char* who) {
    const int mtu = mtu_from_bytes(parameters.path_mtu);
    if (mtu == 0) {
        throw VerbsError(fmt::format("{} INIT->RTR: path MTU {} is not one of 256, 512, 1024, 2048, 4096", who,
                                     parameters.path_mtu),
                         EINVAL);
    }
    return static_cast<ibv_mtu>(mtu);
}

}  // namespace

QueuePairTransition make_dc_initiator_init_transition(const ConnectionParameters& parameters) {
    require_port(parameters, "DCI", "RESET->INIT");
    QueuePairTransition transition;
    transition.attributes.qp_state = IBV_QPS_INIT;
    transition.attributes.pkey_index = parameters.pkey_index;
    transition.attributes.port_num = parameters.port_num;
    transition.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT;
    return transition;
}

QueuePairTransition make_dc_initiator_ready_to_receive_transition(const ConnectionParameters& parameters) {
    require_port(parameters, "DCI", "INIT->RTR");
    QueuePairTransition transition;
    ibv_qp_attr& attributes = transition.attributes;
    attributes.qp_state = IBV_QPS_RTR;
    attributes.path_mtu = require_mtu(parameters, "DCI");
    attributes.ah_attr.port_num = parameters.port_num;
    attributes.ah_attr.sl = parameters.service_level;
    attributes.ah_attr.is_global = parameters.use_global_routing ? 1 : 0;
    transition.mask = IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV;
    return transition;
}

QueuePairTransition make_dc_initiator_ready_to_send_transition(const ConnectionParameters& parameters) {
    if (parameters.send_psn > 0xffffff) {
        throw VerbsError(fmt::format("DCI RTR->RTS: send PSN {:#x} exceeds 24 bits", parameters.send_psn), EINVAL);
    }
    QueuePairTransition transition;
    ibv_qp_attr& attributes = transition.attributes;
    attributes.qp_state = IBV_QPS_RTS;
    attributes.sq_psn = parameters.send_psn;
    attributes.timeout = parameters.timeout;
    attributes.retry_cnt = parameters.retry_count;
    attributes.rnr_retry = parameters.rnr_retry;
    attributes.max_rd_atomic = parameters.max_read_atomic;
    transition.mask = IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                      IBV_QP_MAX_QP_RD_ATOMIC;
    return transition;
}

QueuePairTransition make_dc_target_init_transition(const ConnectionParameters& parameters) {
    require_port(parameters, "DCT", "RESET->INIT");
    QueuePairTransition transition;
    transition.attributes.qp_state = IBV_QPS_INIT;
    transition.attributes.pkey_index = parameters.pkey_index;
    transition.attributes.port_num = parameters.port_num;
    transition.attributes.qp_access_flags = parameters.access_flags;
    transition.mask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
    return transition;
}

QueuePairTransition make_dc_target_ready_to_receive_transition(const ConnectionParameters& parameters) {
    require_port(parameters, "DCT", "INIT->RTR");
    QueuePairTransition transition;
    ibv_qp_attr& attributes = transition.attributes;
    attributes.qp_state = IBV_QPS_RTR;
    attributes.path_mtu = require_mtu(parameters, "DCT");
    attributes.min_rnr_timer = parameters.min_rnr_timer;
    attributes.ah_attr.port_num = parameters.port_num;
    attributes.ah_attr.sl = parameters.service_level;
    if (parameters.use_global_routing) {
        attributes.ah_attr.is_global = 1;
        attributes.ah_attr.grh.sgid_index = parameters.source_gid_index;
        attributes.ah_attr.grh.hop_limit = parameters.hop_limit;
        attributes.ah_attr.grh.traffic_class = parameters.traffic_class;
    }
    transition.mask = IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER | IBV_QP_AV | IBV_QP_PATH_MTU;
    return transition;
}

}  // namespace rdmachan::verbs
