// The DC control plane's attribute sets, checked field by field against mlx5-facts.md §2 (the
// masks UCX and the kernel use); they run for real only on a ConnectX, so this is where a wrong
// mask is caught.
#include <doctest/doctest.h>

#include "transport/verbs/dc_connection.hpp"
#include "transport/verbs/mlx5_dc.hpp"
#include "transport/verbs/verbs_error.hpp"

using namespace rdmachan::verbs;

namespace {

ConnectionParameters dc_parameters() {
    ConnectionParameters parameters;
    parameters.port_num = 1;
    parameters.path_mtu = 4096;
    parameters.send_psn = 0x654321;
    parameters.pkey_index = 2;
    parameters.use_global_routing = true;
    parameters.source_gid_index = 3;
    parameters.hop_limit = 32;
    parameters.traffic_class = 106;
    parameters.service_level = 4;
    parameters.timeout = 16;
    parameters.retry_count = 5;
    parameters.rnr_retry = 6;
    parameters.min_rnr_timer = 11;
    parameters.max_read_atomic = 2;
    return parameters;
}

}  // namespace

TEST_CASE("DC initiator: INIT, RTR and RTS carry exactly the DCI fields") {
    const ConnectionParameters parameters = dc_parameters();
    const QueuePairTransition init = make_dc_initiator_init_transition(parameters);
    CHECK(init.attributes.qp_state == IBV_QPS_INIT);
    CHECK(init.attributes.port_num == 1);
    CHECK(init.attributes.pkey_index == 2);
    CHECK(init.attributes.qp_access_flags == 0);  // a DCI only sends
    CHECK(init.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT));

    const QueuePairTransition rtr = make_dc_initiator_ready_to_receive_transition(parameters);
    CHECK(rtr.attributes.qp_state == IBV_QPS_RTR);
    CHECK(rtr.attributes.path_mtu == IBV_MTU_4096);
    CHECK(rtr.attributes.ah_attr.port_num == 1);
    CHECK(rtr.attributes.ah_attr.sl == 4);
    CHECK(rtr.attributes.dest_qp_num == 0);  // no remote: the target comes with each WQE
    CHECK(rtr.mask == (IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV));

    const QueuePairTransition rts = make_dc_initiator_ready_to_send_transition(parameters);
    CHECK(rts.attributes.qp_state == IBV_QPS_RTS);
    CHECK(rts.attributes.sq_psn == 0x654321);
    CHECK(rts.attributes.timeout == 16);
    CHECK(rts.attributes.retry_cnt == 5);
    CHECK(rts.attributes.rnr_retry == 6);
    CHECK(rts.attributes.max_rd_atomic == 2);
    CHECK(rts.mask == (IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_MAX_QP_RD_ATOMIC));
}

TEST_CASE("DC target: INIT with access flags, RTR with the RNR timer and its own addressing, no RTS") {
    const ConnectionParameters parameters = dc_parameters();
    const QueuePairTransition init = make_dc_target_init_transition(parameters);
    CHECK(init.attributes.qp_state == IBV_QPS_INIT);
    CHECK(init.attributes.qp_access_flags == parameters.access_flags);
    CHECK(init.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));

    const QueuePairTransition rtr = make_dc_target_ready_to_receive_transition(parameters);
    CHECK(rtr.attributes.qp_state == IBV_QPS_RTR);
    CHECK(rtr.attributes.min_rnr_timer == 11);
    CHECK(rtr.attributes.path_mtu == IBV_MTU_4096);
    CHECK(rtr.attributes.ah_attr.is_global == 1);
    CHECK(rtr.attributes.ah_attr.grh.sgid_index == 3);
    CHECK(rtr.attributes.ah_attr.grh.hop_limit == 32);
    CHECK(rtr.attributes.ah_attr.grh.traffic_class == 106);
    CHECK(rtr.mask == (IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER | IBV_QP_AV | IBV_QP_PATH_MTU));

    SUBCASE("InfiniBand without GRH leaves the GRH fields out") {
        ConnectionParameters infiniband = parameters;
        infiniband.use_global_routing = false;
        const QueuePairTransition plain = make_dc_target_ready_to_receive_transition(infiniband);
        CHECK(plain.attributes.ah_attr.is_global == 0);
        CHECK(plain.attributes.ah_attr.grh.hop_limit == 0);
    }
}

TEST_CASE("DC transitions reject bad values naming the object, the transition and the value") {
    ConnectionParameters bad = dc_parameters();
    bad.port_num = 0;
    CHECK_THROWS_WITH_AS(make_dc_initiator_init_transition(bad), doctest::Contains("DCI RESET->INIT: port_num 0"),
                         VerbsError);
    CHECK_THROWS_WITH_AS(make_dc_target_init_transition(bad), doctest::Contains("DCT RESET->INIT: port_num 0"),
                         VerbsError);
    bad = dc_parameters();
    bad.path_mtu = 9000;
    CHECK_THROWS_WITH_AS(make_dc_initiator_ready_to_receive_transition(bad), doctest::Contains("DCI INIT->RTR: path MTU 9000"),
                         VerbsError);
    CHECK_THROWS_WITH_AS(make_dc_target_ready_to_receive_transition(bad), doctest::Contains("DCT INIT->RTR: path MTU 9000"),
                         VerbsError);
    bad = dc_parameters();
    bad.send_psn = 0x1000000;
    CHECK_THROWS_WITH_AS(make_dc_initiator_ready_to_send_transition(bad), doctest::Contains("send PSN 0x1000000"),
                         VerbsError);
}

TEST_CASE("a DCI is created with only the send operations the data path posts") {
    const std::uint64_t operations = dc_initiator_send_operations();
    CHECK((operations & IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM) != 0);
    CHECK((operations & IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD) != 0);
    CHECK((operations & IBV_QP_EX_WITH_BIND_MW) == 0);  // would reserve room in every WQE
    CHECK((operations & IBV_QP_EX_WITH_LOCAL_INV) == 0);
    CHECK((operations & IBV_QP_EX_WITH_TSO) == 0);
}
