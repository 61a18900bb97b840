// The emulated ConnectX refuses what the kernel and libmlx5 refuse, with their errno, before the
// software device is touched: ibv_modify_qp transitions and attribute masks (the kernel's QP
// state table for RC, mlx5's DCI and DCT rules), DC creation rules (mlx5dv_create_qp(3)),
// capability limits as ibv_query_device reports them, and memory registration access. Each
// refusal is also checked to leave the object usable.
#include <doctest/doctest.h>

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "tests/emulated_connectx/qp_state_rules.hpp"

namespace emulated = rdmachan::emulated;

namespace {

constexpr int kInitMask = IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
constexpr int kRtrMask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
                         IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
constexpr int kRtsMask = IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                         IBV_QP_MAX_QP_RD_ATOMIC;

struct Device {
    ibv_context* context = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
    ibv_srq* srq = nullptr;
    ibv_port_attr port{};

    Device() {
        int count = 0;
        ibv_device** list = ibv_get_device_list(&count);
        REQUIRE(count == 1);
        REQUIRE(std::strcmp(ibv_get_device_name(list[0]), "mlx5_0") == 0);
        REQUIRE(mlx5dv_is_supported(list[0]));
        context = ibv_open_device(list[0]);
        ibv_free_device_list(list);
        REQUIRE(context != nullptr);
        REQUIRE(ibv_query_port(context, 1, &port) == 0);
        pd = ibv_alloc_pd(context);
        REQUIRE(pd != nullptr);
        ibv_cq_init_attr_ex cq_attributes{};
        cq_attributes.cqe = 64;
        mlx5dv_cq_init_attr dv{};
        ibv_cq_ex* cq_ex = mlx5dv_create_cq(context, &cq_attributes, &dv);
        REQUIRE(cq_ex != nullptr);
        cq = ibv_cq_ex_to_cq(cq_ex);
        ibv_srq_init_attr srq_attributes{};
        srq_attributes.attr.max_wr = 16;
        srq_attributes.attr.max_sge = 1;
        srq = ibv_create_srq(pd, &srq_attributes);
        REQUIRE(srq != nullptr);
    }
    ~Device() {
        ibv_destroy_srq(srq);
        ibv_destroy_cq(cq);
        ibv_dealloc_pd(pd);
        ibv_close_device(context);
    }

    ibv_qp* create_rc(ibv_qp_cap cap = {16, 16, 1, 1, 0}) {
        ibv_qp_init_attr_ex attributes{};
        attributes.qp_type = IBV_QPT_RC;
        attributes.comp_mask = IBV_QP_INIT_ATTR_PD;
        attributes.pd = pd;
        attributes.send_cq = cq;
        attributes.recv_cq = cq;
        attributes.cap = cap;
        mlx5dv_qp_init_attr dv{};
        dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
        dv.create_flags = MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
        return mlx5dv_create_qp(context, &attributes, &dv);
    }
    ibv_qp* create_dc(mlx5dv_dc_type type, ibv_srq* shared, ibv_qp_type qp_type = IBV_QPT_DRIVER) {
        ibv_qp_init_attr_ex attributes{};
        attributes.qp_type = qp_type;
        attributes.comp_mask = IBV_QP_INIT_ATTR_PD;
        attributes.pd = pd;
        attributes.send_cq = cq;
        attributes.recv_cq = cq;
        attributes.srq = shared;
        if (type == MLX5DV_DCTYPE_DCI) attributes.cap = {16, 0, 1, 0, 0};
        mlx5dv_qp_init_attr dv{};
        dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
        dv.dc_init_attr.dc_type = type;
        if (type == MLX5DV_DCTYPE_DCT) dv.dc_init_attr.dct_access_key = 0x1234;
        return mlx5dv_create_qp(context, &attributes, &dv);
    }
    int to_init(ibv_qp* qp, int mask = kInitMask) {
        ibv_qp_attr attributes{};
        attributes.qp_state = IBV_QPS_INIT;
        attributes.port_num = 1;
        attributes.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ;
        return ibv_modify_qp(qp, &attributes, mask);
    }
    int to_rtr(ibv_qp* qp, std::uint32_t remote_qpn, int mask = kRtrMask) {
        ibv_qp_attr attributes{};
        attributes.qp_state = IBV_QPS_RTR;
        attributes.path_mtu = IBV_MTU_1024;
        attributes.dest_qp_num = remote_qpn;
        attributes.max_dest_rd_atomic = 1;
        attributes.min_rnr_timer = 12;
        attributes.ah_attr.dlid = port.lid;
        attributes.ah_attr.port_num = 1;
        return ibv_modify_qp(qp, &attributes, mask);
    }
    int to_rts(ibv_qp* qp, int mask = kRtsMask) {
        ibv_qp_attr attributes{};
        attributes.qp_state = IBV_QPS_RTS;
        attributes.timeout = 14;
        attributes.retry_cnt = 7;
        attributes.rnr_retry = 7;
        attributes.max_rd_atomic = 1;
        return ibv_modify_qp(qp, &attributes, mask);
    }
    ibv_qp_state state(ibv_qp* qp) {
        ibv_qp_attr attributes{};
        ibv_qp_init_attr init{};
        REQUIRE(ibv_query_qp(qp, &attributes, IBV_QP_STATE, &init) == 0);
        return attributes.qp_state;
    }
};

}  // namespace

TEST_CASE("the state table: RC transitions and masks as the kernel's qp_state_table") {
    using emulated::QueuePairKind;
    const auto rc = QueuePairKind::reliable_connected;
    CHECK(emulated::check_transition(rc, IBV_QPS_RESET, IBV_QPS_INIT, kInitMask).error == 0);
    CHECK(emulated::check_transition(rc, IBV_QPS_INIT, IBV_QPS_RTR, kRtrMask).error == 0);
    CHECK(emulated::check_transition(rc, IBV_QPS_INIT, IBV_QPS_RTR, kRtrMask | IBV_QP_ACCESS_FLAGS).error == 0);
    CHECK(emulated::check_transition(rc, IBV_QPS_RTR, IBV_QPS_RTS, kRtsMask).error == 0);
    CHECK(emulated::check_transition(rc, IBV_QPS_RTS, IBV_QPS_ERR, IBV_QP_STATE).error == 0);
    CHECK(emulated::check_transition(rc, IBV_QPS_ERR, IBV_QPS_RESET, IBV_QP_STATE).error == 0);
    // Refusals, each with the kernel's EINVAL and a reason naming the states and attributes.
    const emulated::TransitionCheck skipped = emulated::check_transition(rc, IBV_QPS_RESET, IBV_QPS_RTR, kRtrMask);
    CHECK(skipped.error == EINVAL);
    CHECK(skipped.reason == "RC RESET -> RTR is not a valid transition");
    CHECK(emulated::check_transition(rc, IBV_QPS_RESET, IBV_QPS_ERR, IBV_QP_STATE).error == EINVAL);
    const emulated::TransitionCheck missing =
        emulated::check_transition(rc, IBV_QPS_INIT, IBV_QPS_RTR, kRtrMask & ~IBV_QP_MIN_RNR_TIMER);
    CHECK(missing.error == EINVAL);
    CHECK(missing.reason == "RC INIT -> RTR: required attributes missing from the mask: MIN_RNR_TIMER");
    const emulated::TransitionCheck extra =
        emulated::check_transition(rc, IBV_QPS_RESET, IBV_QPS_INIT, kInitMask | IBV_QP_SQ_PSN);
    CHECK(extra.error == EINVAL);
    CHECK(extra.reason == "RC RESET -> INIT: attributes not allowed in this transition: SQ_PSN");
    CHECK(emulated::check_transition(rc, IBV_QPS_INIT, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_CUR_STATE).error == EINVAL);
    // A modify without IBV_QP_STATE is checked as current -> current: RESET allows nothing,
    // RTS its optional attributes, RTR no such pair.
    CHECK(emulated::check_modify(rc, IBV_QPS_RESET, kInitMask & ~IBV_QP_STATE, IBV_QPS_INIT, IBV_QPS_RESET).check.error ==
          EINVAL);
    const emulated::ModifyCheck stay = emulated::check_modify(rc, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER, IBV_QPS_RESET, IBV_QPS_RESET);
    CHECK(stay.check.error == 0);
    CHECK(stay.next == IBV_QPS_RTS);
    CHECK(emulated::check_modify(rc, IBV_QPS_RTR, IBV_QP_MIN_RNR_TIMER, IBV_QPS_RESET, IBV_QPS_RESET).check.error == EINVAL);
    // SQE -> RTS is in the table and has a firmware command; RTS -> SQD has no mlx5 command.
    CHECK(emulated::check_transition(rc, IBV_QPS_SQE, IBV_QPS_RTS, IBV_QP_STATE).error == 0);
    CHECK(emulated::check_transition(rc, IBV_QPS_SQD, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER).error == 0);
    CHECK(emulated::check_transition(rc, IBV_QPS_RTS, IBV_QPS_SQD, IBV_QP_STATE).error == EINVAL);
    // The current state claimed by IBV_QP_CUR_STATE is the one checked.
    CHECK(emulated::check_modify(rc, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_CUR_STATE, IBV_QPS_RTS, IBV_QPS_RTR).check.error ==
          EINVAL);
    CHECK(emulated::check_modify(rc, IBV_QPS_RTS, IBV_QP_STATE, static_cast<ibv_qp_state>(IBV_QPS_ERR + 1), IBV_QPS_RESET)
              .check.error == EINVAL);
}

TEST_CASE("the state table: DCI and DCT as mlx5's modify_dci_qp_is_ok and mlx5_ib_modify_dct") {
    using emulated::QueuePairKind;
    const auto dci = QueuePairKind::dc_initiator;
    const auto dct = QueuePairKind::dc_target;
    CHECK(emulated::check_transition(dci, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT).error == 0);
    // A DCI takes no access flags: the RC mask is refused.
    CHECK(emulated::check_transition(dci, IBV_QPS_RESET, IBV_QPS_INIT, kInitMask).error == EINVAL);
    CHECK(emulated::check_transition(dci, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV).error == 0);
    CHECK(emulated::check_transition(dci, IBV_QPS_INIT, IBV_QPS_RTR, IBV_QP_STATE | IBV_QP_AV).error == EINVAL);
    CHECK(emulated::check_transition(dci, IBV_QPS_RTR, IBV_QPS_RTS, kRtsMask).error == 0);
    CHECK(emulated::check_transition(dci, IBV_QPS_RTS, IBV_QPS_RESET, IBV_QP_STATE).error == 0);
    CHECK(emulated::check_transition(dci, IBV_QPS_RESET, IBV_QPS_ERR, IBV_QP_STATE).error == EINVAL);
    // modify_dci_qp_is_ok requires IBV_QP_STATE even where RC would check current -> current.
    CHECK(emulated::check_modify(dci, IBV_QPS_RTS, IBV_QP_MIN_RNR_TIMER, IBV_QPS_RESET, IBV_QPS_RESET).check.error == EINVAL);
    CHECK(emulated::check_transition(dci, IBV_QPS_RTS, IBV_QPS_RTS, IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER).error == 0);
    CHECK(emulated::check_transition(dct, IBV_QPS_RESET, IBV_QPS_INIT, kInitMask).error == 0);
    CHECK(emulated::check_transition(dct, IBV_QPS_RESET, IBV_QPS_INIT, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT).error == EINVAL);
    CHECK(emulated::check_transition(dct, IBV_QPS_INIT, IBV_QPS_RTR,
                                     IBV_QP_STATE | IBV_QP_MIN_RNR_TIMER | IBV_QP_AV | IBV_QP_PATH_MTU).error == 0);
    // mlx5_ib_modify_dct allows nothing optional: RC's RTR mask is refused.
    CHECK(emulated::check_transition(dct, IBV_QPS_INIT, IBV_QPS_RTR, kRtrMask).error == EINVAL);
    const emulated::TransitionCheck dct_rts = emulated::check_transition(dct, IBV_QPS_RTR, IBV_QPS_RTS, kRtsMask);
    CHECK(dct_rts.error == EINVAL);
    CHECK(dct_rts.reason == "DCT RTR -> RTS is not a valid transition");
}

TEST_CASE("ibv_modify_qp refuses with EINVAL and leaves the QP where it was") {
    Device device;
    ibv_qp* qp = device.create_rc();
    REQUIRE(qp != nullptr);
    CHECK(device.to_rtr(qp, qp->qp_num) == EINVAL);  // RESET -> RTR
    CHECK(device.state(qp) == IBV_QPS_RESET);
    CHECK(device.to_init(qp, kInitMask & ~IBV_QP_ACCESS_FLAGS) == EINVAL);
    CHECK(device.to_init(qp) == 0);
    CHECK(device.to_rtr(qp, qp->qp_num, kRtrMask & ~IBV_QP_DEST_QPN) == EINVAL);
    CHECK(device.state(qp) == IBV_QPS_INIT);
    CHECK(device.to_rtr(qp, qp->qp_num) == 0);
    CHECK(device.to_rts(qp, kRtsMask | IBV_QP_PATH_MTU) == EINVAL);
    CHECK(device.to_rts(qp) == 0);
    CHECK(device.state(qp) == IBV_QPS_RTS);
    ibv_qp_attr attributes{};
    attributes.qp_state = IBV_QPS_INIT;
    CHECK(ibv_modify_qp(qp, &attributes, IBV_QP_STATE) == EINVAL);  // RTS -> INIT
    attributes.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(qp, &attributes, IBV_QP_STATE) == 0);
    attributes.qp_state = IBV_QPS_RESET;
    CHECK(ibv_modify_qp(qp, &attributes, IBV_QP_STATE) == 0);
    CHECK(ibv_destroy_qp(qp) == 0);
}

TEST_CASE("ibv_modify_qp refuses attribute values the port does not have") {
    Device device;
    ibv_qp* qp = device.create_rc();
    REQUIRE(qp != nullptr);
    ibv_qp_attr attributes{};
    attributes.qp_state = IBV_QPS_INIT;
    attributes.port_num = 2;
    CHECK(ibv_modify_qp(qp, &attributes, kInitMask) == EINVAL);
    attributes.port_num = 1;
    attributes.pkey_index = 3;
    CHECK(ibv_modify_qp(qp, &attributes, kInitMask) == EINVAL);
    CHECK(device.state(qp) == IBV_QPS_RESET);
    CHECK(ibv_destroy_qp(qp) == 0);
}

TEST_CASE("DC creation follows mlx5dv_create_qp(3) and the DC transitions are enforced") {
    Device device;
    errno = 0;
    CHECK(device.create_dc(MLX5DV_DCTYPE_DCT, nullptr) == nullptr);  // a DCT needs an SRQ
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(device.create_dc(MLX5DV_DCTYPE_DCI, nullptr, IBV_QPT_RC) == nullptr);  // DC needs IBV_QPT_DRIVER
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(device.create_dc(MLX5DV_DCTYPE_DCI, device.srq) == nullptr);  // a DCI has no receive side
    CHECK(errno == EINVAL);
    ibv_qp_init_attr_ex attributes{};
    attributes.qp_type = IBV_QPT_DRIVER;
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attributes.send_ops_flags = IBV_QP_EX_WITH_BIND_MW;
    attributes.pd = device.pd;
    attributes.send_cq = device.cq;
    attributes.recv_cq = device.cq;
    attributes.cap = {16, 0, 1, 0, 0};
    mlx5dv_qp_init_attr dv{};
    dv.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
    dv.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
    errno = 0;
    CHECK(mlx5dv_create_qp(device.context, &attributes, &dv) == nullptr);
    CHECK(errno == EOPNOTSUPP);

    ibv_qp* target = device.create_dc(MLX5DV_DCTYPE_DCT, device.srq);
    REQUIRE(target != nullptr);
    ibv_qp_attr init{};
    init.qp_state = IBV_QPS_INIT;
    init.port_num = 1;
    CHECK(ibv_modify_qp(target, &init, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL);  // access flags required
    init.qp_access_flags = IBV_ACCESS_REMOTE_WRITE;
    CHECK(ibv_modify_qp(target, &init, kInitMask) == 0);
    ibv_qp_attr ready{};
    ready.qp_state = IBV_QPS_RTR;
    ready.path_mtu = IBV_MTU_1024;
    ready.min_rnr_timer = 12;
    ready.ah_attr.port_num = 1;
    CHECK(ibv_modify_qp(target, &ready, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV) == EINVAL);  // min_rnr_timer required
    CHECK(ibv_modify_qp(target, &ready, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV | IBV_QP_MIN_RNR_TIMER) == 0);
    CHECK(target->qp_num != 0);
    ibv_qp_attr error_state{};
    error_state.qp_state = IBV_QPS_ERR;
    CHECK(ibv_modify_qp(target, &error_state, IBV_QP_STATE) == EINVAL);  // mlx5_ib_modify_dct has no other transition
    CHECK(ibv_destroy_qp(target) == 0);

    ibv_qp* initiator = device.create_dc(MLX5DV_DCTYPE_DCI, nullptr);
    REQUIRE(initiator != nullptr);
    CHECK(device.to_init(initiator) == EINVAL);  // the RC INIT mask carries access flags
    CHECK(device.to_init(initiator, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == 0);
    CHECK(ibv_destroy_qp(initiator) == 0);
}

TEST_CASE("capability limits: what ibv_query_device reports is the most a QP, CQ or SRQ gets") {
    Device device;
    ibv_device_attr limits{};
    REQUIRE(ibv_query_device(device.context, &limits) == 0);
    const std::uint32_t max_wr = static_cast<std::uint32_t>(limits.max_qp_wr);
    const std::uint32_t max_sge = static_cast<std::uint32_t>(limits.max_sge);
    errno = 0;
    CHECK(device.create_rc({max_wr + 1, 16, 1, 1, 0}) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(device.create_rc({16, 16, max_sge + 1, 1, 0}) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(device.create_rc({16, max_wr + 1, 1, 1, 0}) == nullptr);
    CHECK(errno == EINVAL);
    errno = 0;
    CHECK(device.create_rc({16, 16, 1, 1, 4096}) == nullptr);  // inline above the device's
    CHECK(errno == EINVAL);
    ibv_qp* at_limit = device.create_rc({max_wr, 16, max_sge, 1, 0});
    CHECK(at_limit != nullptr);
    if (at_limit != nullptr) ibv_destroy_qp(at_limit);

    ibv_cq_init_attr_ex cq_attributes{};
    cq_attributes.cqe = static_cast<std::uint32_t>(limits.max_cqe) + 1;
    errno = 0;
    CHECK(mlx5dv_create_cq(device.context, &cq_attributes, nullptr) == nullptr);
    CHECK(errno == EINVAL);
    ibv_srq_init_attr srq_attributes{};
    srq_attributes.attr.max_wr = static_cast<std::uint32_t>(limits.max_srq_wr) + 1;
    srq_attributes.attr.max_sge = 1;
    errno = 0;
    CHECK(ibv_create_srq(device.pd, &srq_attributes) == nullptr);
    CHECK(errno == EINVAL);
}

TEST_CASE("memory registration: remote write or atomic without local write is refused, as the kernel does") {
    Device device;
    std::vector<char> buffer(4096);
    // As ints: verbs.h's ibv_reg_mr macro masks the flags with an enumerator of another enum
    // (IBV_ACCESS_OPTIONAL_RANGE), which Clang flags as a deprecated enum-enum operation.
    const int remote_write_only = IBV_ACCESS_REMOTE_WRITE;
    const int local_and_remote_write = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE;
    errno = 0;
    CHECK(ibv_reg_mr(device.pd, buffer.data(), buffer.size(), remote_write_only) == nullptr);
    CHECK(errno == EINVAL);
    ibv_mr* region = ibv_reg_mr(device.pd, buffer.data(), buffer.size(), local_and_remote_write);
    REQUIRE(region != nullptr);
    CHECK(region->lkey != 0);
    CHECK(ibv_dereg_mr(region) == 0);
}

TEST_CASE("mlx5dv_init_obj hands out the software device's rings") {
    Device device;
    ibv_qp* qp = device.create_rc();
    REQUIRE(qp != nullptr);
    mlx5dv_qp dv_qp{};
    mlx5dv_cq dv_cq{};
    mlx5dv_obj object{};
    object.qp.in = qp;
    object.qp.out = &dv_qp;
    object.cq.in = device.cq;
    object.cq.out = &dv_cq;
    REQUIRE(mlx5dv_init_obj(&object, MLX5DV_OBJ_QP | MLX5DV_OBJ_CQ) == 0);
    CHECK(dv_qp.sq.stride == 64);
    CHECK(dv_qp.sq.wqe_cnt >= 16);
    CHECK(dv_qp.rq.wqe_cnt >= 16);
    CHECK(dv_qp.bf.size > 0);
    CHECK(dv_qp.dbrec != nullptr);
    CHECK(dv_cq.cqe_cnt >= 64);
    CHECK(dv_cq.cqe_size == 64);
    CHECK(mlx5dv_init_obj(&object, MLX5DV_OBJ_DM) == EOPNOTSUPP);
    CHECK(ibv_destroy_qp(qp) == 0);
}
