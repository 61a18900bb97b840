// Host tests of the verbs provider: everything that needs no RDMA device. On this machine
// there is none, so the "no device" path is exercised for real.
#include <arpa/inet.h>
#include <doctest/doctest.h>

#include <cerrno>
#include <cstdlib>
#include <string>
#include <vector>

#include "transport/verbs/connection.hpp"
#include "transport/verbs/context.hpp"
#include "transport/verbs/device_list.hpp"
#include "transport/verbs/device_selection.hpp"
#include "transport/verbs/gid_selection.hpp"
#include "transport/verbs/mlx5_binding.hpp"
#include "transport/verbs/verbs_error.hpp"
#include "transport/verbs/work_request_translation.hpp"

using namespace rdmachan::verbs;
namespace mlx5 = rdmachan::mlx5;

namespace {

Gid ipv4_mapped(std::uint8_t a, std::uint8_t b, std::uint8_t c, std::uint8_t d) {
    Gid gid{};
    gid[10] = 0xff;
    gid[11] = 0xff;
    gid[12] = a;
    gid[13] = b;
    gid[14] = c;
    gid[15] = d;
    return gid;
}

Gid link_local(std::uint8_t last) {
    Gid gid{};
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[15] = last;
    return gid;
}

Gid global_ipv6(std::uint8_t last) {
    Gid gid{};
    gid[0] = 0x20;
    gid[1] = 0x01;
    gid[2] = 0x0d;
    gid[3] = 0xb8;
    gid[15] = last;
    return gid;
}

bool machine_has_rdma_devices() {
    DeviceList list;
    return !list.empty();
}

// The "no RDMA device" cases are registered skipped on a machine that has devices, so doctest
// (and its summary line) reports them as skipped rather than passed. Evaluated once, when the
// test cases are registered.
const bool kHasRdmaDevices = machine_has_rdma_devices();

}  // namespace

TEST_CASE("no RDMA device: the device list is empty, with a reason, and never crashes" *
          doctest::skip(kHasRdmaDevices)) {
    DeviceList list;
    CHECK(list.empty());
    CHECK(list.devices().empty());
    CHECK(list.names().empty());
    CHECK(list.find("rxe0") == nullptr);
    CHECK(list.empty_reason().find("ibv_get_device_list") != std::string::npos);
    // Moving and destroying an empty list must not call ibv_free_device_list(NULL).
    DeviceList moved = std::move(list);
    CHECK(moved.empty());
    DeviceList assigned;
    assigned = std::move(moved);
    CHECK(assigned.empty());
}

TEST_CASE("no RDMA device: opening a device by name fails naming it" * doctest::skip(kHasRdmaDevices)) {
    try {
        Context::open("mlx5_0");
        FAIL("Context::open succeeded without any device");
    } catch (const VerbsError& error) {
        const std::string message = error.what();
        CHECK(message.find("mlx5_0") != std::string::npos);
        CHECK(message.find("no such verbs device") != std::string::npos);
        CHECK(error.code() == ENODEV);
    }
}

TEST_CASE("no RDMA device: auto selection falls back to the software device and says why" *
          doctest::skip(kHasRdmaDevices)) {
    CHECK(discover_device_candidates().empty());
    const DeviceDecision decision = select_device_on_this_machine("auto");
    CHECK(decision.kind == DeviceKind::soft);
    CHECK(decision.device_name.empty());
    CHECK(decision.reason.find("no usable RDMA device") != std::string::npos);
    CHECK(decision.reason.find("no RDMA device on this machine") != std::string::npos);
    CHECK_THROWS_AS(select_device_on_this_machine("rxe0"), VerbsError);
}

TEST_CASE("device selection rules over a fake device list") {
    const std::vector<DeviceCandidate> mixed = {
        {"rxe0", false, true, ""},
        {"mlx5_0", true, false, ""},  // no active port: skipped by auto
        {"mlx5_1", true, true, ""},
        {"bnxt_re0", false, true, ""},
    };
    SUBCASE("auto prefers a usable mlx5 device") {
        const DeviceDecision decision = select_device("auto", mixed);
        CHECK(decision.kind == DeviceKind::mlx5);
        CHECK(decision.device_name == "mlx5_1");
        CHECK(decision.reason.find("mlx5 direct data path") != std::string::npos);
    }
    SUBCASE("an empty request means auto") {
        CHECK(select_device("", mixed).device_name == "mlx5_1");
    }
    SUBCASE("auto without mlx5 takes the first usable verbs device") {
        const std::vector<DeviceCandidate> verbs_only = {{"rxe0", false, false, ""},
                                                         {"rxe1", false, true, ""}};
        const DeviceDecision decision = select_device("auto", verbs_only);
        CHECK(decision.kind == DeviceKind::verbs);
        CHECK(decision.device_name == "rxe1");
        CHECK(decision.reason.find("generic verbs") != std::string::npos);
    }
    SUBCASE("auto with only unusable devices falls back to soft, listing why each was skipped") {
        const std::vector<DeviceCandidate> broken = {
            {"mlx5_0", true, false, ""}, {"rxe0", false, true, "ibv_open_device failed: EACCES"}};
        const DeviceDecision decision = select_device("auto", broken);
        CHECK(decision.kind == DeviceKind::soft);
        CHECK(decision.reason.find("mlx5_0 (no ACTIVE port)") != std::string::npos);
        CHECK(decision.reason.find("EACCES") != std::string::npos);
    }
    SUBCASE("soft is honoured even when hardware exists") {
        const DeviceDecision decision = select_device("soft", mixed);
        CHECK(decision.kind == DeviceKind::soft);
        CHECK(decision.reason.find("requested explicitly") != std::string::npos);
    }
    SUBCASE("a named device is used with the data path it supports") {
        CHECK(select_device("rxe0", mixed).kind == DeviceKind::verbs);
        CHECK(select_device("mlx5_1", mixed).kind == DeviceKind::mlx5);
    }
    SUBCASE("a named device that does not exist is an error listing the alternatives") {
        try {
            select_device("mlx5_9", mixed);
            FAIL("expected an error");
        } catch (const VerbsError& error) {
            const std::string message = error.what();
            CHECK(message.find("'mlx5_9'") != std::string::npos);
            CHECK(message.find("rxe0") != std::string::npos);
            CHECK(message.find("bnxt_re0") != std::string::npos);
        }
    }
    SUBCASE("a named device without an active port is an error, not a silent fallback") {
        CHECK_THROWS_WITH_AS(select_device("mlx5_0", mixed), doctest::Contains("no ACTIVE port"),
                             VerbsError);
    }
}

TEST_CASE("RDMACHAN_DEVICE is read from the environment, auto when unset") {
    ::unsetenv("RDMACHAN_DEVICE");
    CHECK(device_request_from_environment() == "auto");
    ::setenv("RDMACHAN_DEVICE", "", 1);
    CHECK(device_request_from_environment() == "auto");
    ::setenv("RDMACHAN_DEVICE", "soft", 1);
    CHECK(device_request_from_environment() == "soft");
    ::unsetenv("RDMACHAN_DEVICE");
}

TEST_CASE("GID selection") {
    const std::vector<GidEntry> roce_table = {
        {0, link_local(1), GidType::roce_v1},
        {1, link_local(1), GidType::roce_v2},
        {2, ipv4_mapped(10, 0, 0, 1), GidType::roce_v1},
        {3, ipv4_mapped(10, 0, 0, 1), GidType::roce_v2},
        {4, global_ipv6(7), GidType::roce_v2},
    };
    SUBCASE("Ethernet prefers RoCE v2 IPv4-mapped") {
        const GidChoice choice = select_gid(roce_table, LinkLayer::ethernet);
        CHECK(choice.entry.index == 3);
        CHECK(choice.reason.find("IPv4-mapped") != std::string::npos);
    }
    SUBCASE("then RoCE v2 routable IPv6, then RoCE v2 link-local, then RoCE v1") {
        std::vector<GidEntry> table = roce_table;
        table.erase(table.begin() + 3);
        CHECK(select_gid(table, LinkLayer::ethernet).entry.index == 4);
        table.pop_back();
        CHECK(select_gid(table, LinkLayer::ethernet).entry.index == 1);
        table.erase(table.begin() + 1);
        const GidChoice v1 = select_gid(table, LinkLayer::ethernet);
        CHECK(v1.entry.index == 0);
        CHECK(v1.reason.find("RoCE v1") != std::string::npos);
    }
    SUBCASE("an override wins when the entry exists") {
        CHECK(select_gid(roce_table, LinkLayer::ethernet, 1u).entry.index == 1);
        CHECK_THROWS_WITH_AS(select_gid(roce_table, LinkLayer::ethernet, 9u),
                             doctest::Contains("index 9"), VerbsError);
    }
    SUBCASE("InfiniBand takes the lowest valid index") {
        const std::vector<GidEntry> ib_table = {{0, link_local(5), GidType::infiniband},
                                                {1, global_ipv6(5), GidType::infiniband}};
        CHECK(select_gid(ib_table, LinkLayer::infiniband).entry.index == 0);
    }
    SUBCASE("an Ethernet port without RoCE addresses is an error") {
        const std::vector<GidEntry> empty_entries = {{0, Gid{}, GidType::roce_v2}};
        CHECK_THROWS_WITH_AS(select_gid(empty_entries, LinkLayer::ethernet),
                             doctest::Contains("no RoCE GID"), VerbsError);
        CHECK_THROWS_AS(select_gid({}, LinkLayer::infiniband), VerbsError);
    }
    SUBCASE("GID text form matches sysfs") {
        CHECK(to_string(ipv4_mapped(169, 254, 77, 1)) == "0000:0000:0000:0000:0000:ffff:a9fe:4d01");
        CHECK(is_ipv4_mapped(ipv4_mapped(1, 2, 3, 4)));
        CHECK_FALSE(is_ipv4_mapped(link_local(1)));
        CHECK(is_ipv6_link_local(link_local(1)));
        CHECK_FALSE(is_ipv6_link_local(global_ipv6(1)));
    }
}

TEST_CASE("RC connect attributes: INIT, RTR and RTS carry exactly the required fields") {
    ConnectionParameters parameters;
    parameters.port_num = 2;
    parameters.path_mtu = 1024;
    parameters.send_psn = 0x123456;
    parameters.pkey_index = 3;
    parameters.use_global_routing = true;
    parameters.source_gid_index = 1;
    parameters.timeout = 18;
    parameters.retry_count = 6;
    parameters.rnr_retry = 5;
    parameters.min_rnr_timer = 9;
    parameters.max_read_atomic = 4;
    parameters.max_dest_read_atomic = 8;
    RcEndpoint remote;
    remote.qpn = 0x2a;
    remote.psn = 0xabcdef;
    remote.lid = 0;
    remote.gid = ipv4_mapped(169, 254, 77, 2);

    const QueuePairTransition init = make_init_transition(parameters);
    CHECK(init.attributes.qp_state == IBV_QPS_INIT);
    CHECK(init.attributes.port_num == 2);
    CHECK(init.attributes.pkey_index == 3);
    CHECK(init.attributes.qp_access_flags == parameters.access_flags);
    CHECK(init.mask == (IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS));

    const QueuePairTransition rtr = make_ready_to_receive_transition(parameters, remote);
    CHECK(rtr.attributes.qp_state == IBV_QPS_RTR);
    CHECK(rtr.attributes.path_mtu == IBV_MTU_1024);
    CHECK(rtr.attributes.dest_qp_num == 0x2a);
    CHECK(rtr.attributes.rq_psn == 0xabcdef);
    CHECK(rtr.attributes.max_dest_rd_atomic == 8);
    CHECK(rtr.attributes.min_rnr_timer == 9);
    CHECK(rtr.attributes.ah_attr.port_num == 2);
    CHECK(rtr.attributes.ah_attr.is_global == 1);
    CHECK(rtr.attributes.ah_attr.grh.sgid_index == 1);
    CHECK(rtr.attributes.ah_attr.grh.dgid.raw[15] == 2);
    CHECK(rtr.attributes.ah_attr.grh.dgid.raw[10] == 0xff);
    CHECK(rtr.mask == (IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
                       IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER));

    const QueuePairTransition rts = make_ready_to_send_transition(parameters);
    CHECK(rts.attributes.qp_state == IBV_QPS_RTS);
    CHECK(rts.attributes.sq_psn == 0x123456);
    CHECK(rts.attributes.timeout == 18);
    CHECK(rts.attributes.retry_cnt == 6);
    CHECK(rts.attributes.rnr_retry == 5);
    CHECK(rts.attributes.max_rd_atomic == 4);
    CHECK(rts.mask == (IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
                       IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC));

    SUBCASE("InfiniBand without GRH addresses the peer by LID only") {
        parameters.use_global_routing = false;
        remote.lid = 0x17;
        const QueuePairTransition ib = make_ready_to_receive_transition(parameters, remote);
        CHECK(ib.attributes.ah_attr.is_global == 0);
        CHECK(ib.attributes.ah_attr.dlid == 0x17);
    }
    SUBCASE("bad values are rejected naming the transition and the value") {
        ConnectionParameters bad = parameters;
        bad.port_num = 0;
        CHECK_THROWS_WITH_AS(make_init_transition(bad),
                             doctest::Contains("RESET->INIT: port_num 0"), VerbsError);
        bad = parameters;
        bad.path_mtu = 1500;
        CHECK_THROWS_WITH_AS(make_ready_to_receive_transition(bad, remote),
                             doctest::Contains("path MTU 1500"), VerbsError);
        bad = parameters;
        bad.send_psn = 0x1000000;
        CHECK_THROWS_WITH_AS(make_ready_to_send_transition(bad), doctest::Contains("0x1000000"),
                             VerbsError);
        RcEndpoint bad_remote = remote;
        bad_remote.psn = 0x2000000;
        CHECK_THROWS_WITH_AS(make_ready_to_receive_transition(parameters, bad_remote),
                             doctest::Contains("remote PSN"), VerbsError);
    }
}

TEST_CASE("work requests translate to ibv_send_wr field by field") {
    mlx5::SendWorkRequest request;
    request.wr_id = 77;
    request.flags = mlx5::kSendSignaled | mlx5::kSendFence;
    SUBCASE("write with immediate: remote address, rkey, immediate in network order") {
        request.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
        request.remote_addr = 0x1000;
        request.rkey = 0x55;
        request.immediate = 0x01020304;
        ibv_send_wr out{};
        REQUIRE(to_ibv_send_wr(request, out));
        CHECK(out.opcode == IBV_WR_RDMA_WRITE_WITH_IMM);
        CHECK(out.wr_id == 77);
        CHECK(out.send_flags == (IBV_SEND_SIGNALED | IBV_SEND_FENCE));
        CHECK(out.wr.rdma.remote_addr == 0x1000);
        CHECK(out.wr.rdma.rkey == 0x55);
        CHECK(out.imm_data == htonl(0x01020304));
    }
    SUBCASE("compare and swap: both operands and the remote word") {
        request.opcode = mlx5::SendOpcode::atomic_compare_and_swap;
        request.remote_addr = 0x2000;
        request.rkey = 9;
        request.compare_add = 5;
        request.swap = 6;
        ibv_send_wr out{};
        REQUIRE(to_ibv_send_wr(request, out));
        CHECK(out.opcode == IBV_WR_ATOMIC_CMP_AND_SWP);
        CHECK(out.wr.atomic.remote_addr == 0x2000);
        CHECK(out.wr.atomic.rkey == 9);
        CHECK(out.wr.atomic.compare_add == 5);
        CHECK(out.wr.atomic.swap == 6);
    }
    SUBCASE("send with invalidate carries the rkey to invalidate") {
        request.opcode = mlx5::SendOpcode::send_with_invalidate;
        request.immediate = 0xabc;
        ibv_send_wr out{};
        REQUIRE(to_ibv_send_wr(request, out));
        CHECK(out.invalidate_rkey == 0xabc);
    }
    SUBCASE("a DC address vector cannot go through the RC verbs path") {
        const std::uint8_t address_vector[48] = {};
        request.dc_address_vector = address_vector;
        ibv_send_wr out{};
        CHECK_FALSE(to_ibv_send_wr(request, out));
    }
}

TEST_CASE("ibv_wc translates to Completion with the same status and opcode numbers") {
    static_assert(static_cast<int>(mlx5::CompletionStatus::remote_access_error) ==
                  IBV_WC_REM_ACCESS_ERR);
    static_assert(static_cast<int>(mlx5::CompletionStatus::general_error) == IBV_WC_GENERAL_ERR);
    static_assert(static_cast<int>(mlx5::CompletionOpcode::receive_rdma_with_immediate) ==
                  IBV_WC_RECV_RDMA_WITH_IMM);
    static_assert(static_cast<int>(mlx5::CompletionOpcode::atomic_fetch_and_add) ==
                  IBV_WC_FETCH_ADD);
    ibv_wc wc{};
    wc.wr_id = 5;
    wc.status = IBV_WC_SUCCESS;
    wc.opcode = IBV_WC_RECV_RDMA_WITH_IMM;
    wc.byte_len = 64;
    wc.imm_data = htonl(0xdeadbeef);
    wc.wc_flags = IBV_WC_WITH_IMM | IBV_WC_GRH;
    wc.qp_num = 0x11;
    wc.src_qp = 0x12;
    const mlx5::Completion completion = from_ibv_wc(wc);
    CHECK(completion.wr_id == 5);
    CHECK(completion.status == mlx5::CompletionStatus::success);
    CHECK(completion.opcode == mlx5::CompletionOpcode::receive_rdma_with_immediate);
    CHECK(completion.immediate == 0xdeadbeef);
    CHECK((completion.flags & mlx5::kCompletionWithImmediate) != 0);
    CHECK((completion.flags & mlx5::kCompletionGrh) != 0);
    CHECK(completion.is_receive);
    CHECK(completion.qp_num == 0x11);
    CHECK(completion.src_qp == 0x12);
    wc.status = IBV_WC_REM_ACCESS_ERR;
    wc.vendor_err = 0x88;
    const mlx5::Completion failed = from_ibv_wc(wc);
    CHECK(failed.status == mlx5::CompletionStatus::remote_access_error);
    CHECK(failed.vendor_error == 0x88);
    CHECK_FALSE(failed.is_receive);
}

TEST_CASE("mlx5dv structs map to the ring descriptors") {
    alignas(64) static std::uint8_t send_and_receive[8192];
    alignas(64) static std::uint8_t blueflame[512];
    alignas(64) static std::uint8_t cq_buffer[4096];
    static __be32 doorbell[2];
    mlx5dv_qp qp{};
    qp.dbrec = doorbell;
    qp.rq.buf = send_and_receive;
    qp.rq.wqe_cnt = 16;
    qp.rq.stride = 32;
    qp.sq.buf = send_and_receive + 512;
    qp.sq.wqe_cnt = 64;
    qp.sq.stride = 64;
    qp.bf.reg = blueflame;
    qp.bf.size = 256;
    const Mlx5QueuePairRings rings = rings_from_mlx5dv(qp, 0x1234);
    CHECK(rings.send.buffer == send_and_receive + 512);
    CHECK(rings.send.wqe_count == 64);
    CHECK(rings.send.qpn == 0x1234);
    CHECK(static_cast<void*>(rings.send.doorbell_record) == static_cast<void*>(doorbell));
    CHECK(rings.send.blueflame_register == blueflame);
    CHECK(rings.send.blueflame_size == 256);
    CHECK(rings.receive.buffer == send_and_receive);
    CHECK(rings.receive.wqe_count == 16);
    CHECK(rings.receive.stride == 32);
    CHECK(static_cast<void*>(rings.receive.doorbell_record) == static_cast<void*>(doorbell));

    SUBCASE("no BlueFlame register: size 0 means 8-byte doorbells") {
        qp.bf.size = 0;
        CHECK(rings_from_mlx5dv(qp, 1).send.blueflame_size == 0);
    }
    SUBCASE("a QP on an SRQ has no receive ring") {
        qp.rq.wqe_cnt = 0;
        qp.rq.stride = 0;
        qp.rq.buf = nullptr;
        const Mlx5QueuePairRings srq_rings = rings_from_mlx5dv(qp, 1);
        CHECK(srq_rings.receive.wqe_count == 0);
        CHECK(srq_rings.receive.buffer == nullptr);
    }
    SUBCASE("unsupported layouts are refused") {
        qp.sq.stride = 128;
        CHECK_THROWS_WITH_AS(rings_from_mlx5dv(qp, 0x99), doctest::Contains("send stride 128"),
                             VerbsError);
        qp.sq.stride = 64;
        qp.sq.wqe_cnt = 48;
        CHECK_THROWS_WITH_AS(rings_from_mlx5dv(qp, 0x99), doctest::Contains("not a power of two"),
                             VerbsError);
    }

    mlx5dv_cq cq{};
    cq.buf = cq_buffer;
    cq.dbrec = doorbell;
    cq.cqe_cnt = 32;
    cq.cqe_size = 128;
    cq.cqn = 0x77;
    alignas(64) std::uint8_t uar_page[64] = {};
    cq.cq_uar = uar_page;
    const mlx5::CompletionQueueRing cq_ring = ring_from_mlx5dv(cq);
    CHECK(cq_ring.uar == uar_page);  // the page whose CQ doorbell (at 0x20) an arm writes
    CHECK(cq_ring.buffer == cq_buffer);
    CHECK(cq_ring.cqe_count == 32);
    CHECK(cq_ring.cqe_size == 128);
    CHECK(cq_ring.cqn == 0x77);
    CHECK(static_cast<void*>(cq_ring.doorbell_record) == static_cast<void*>(doorbell));
    cq.cqe_size = 96;
    CHECK_THROWS_AS(ring_from_mlx5dv(cq), VerbsError);

    mlx5dv_srq srq{};
    srq.buf = cq_buffer;
    srq.dbrec = doorbell;
    srq.stride = 64;
    srq.comp_mask = MLX5DV_SRQ_MASK_SRQN;
    srq.srqn = 0x42;
    const mlx5::SharedReceiveQueueRing srq_ring = ring_from_mlx5dv(srq, 128);
    CHECK(srq_ring.buffer == cq_buffer);
    CHECK(srq_ring.wqe_count == 128);
    CHECK(srq_ring.stride == 64);
    CHECK(srq_ring.srqn == 0x42);
    CHECK_THROWS_AS(ring_from_mlx5dv(srq, 100), VerbsError);
}

TEST_CASE("CQE compression is refused by name where mlx5dv_query_device's caps lack it") {
    mlx5dv_cqe_comp_caps caps{};
    SUBCASE("no compression at all: max_num 0") {
        caps.supported_format = MLX5DV_CQE_RES_FORMAT_HASH;
        const std::string refusal = cqe_compression_refusal(caps, MLX5DV_CQE_RES_FORMAT_HASH, "mlx5_0");
        CHECK(refusal.find("cqe_compression: device 'mlx5_0' does not compress CQEs") != std::string::npos);
    }
    SUBCASE("compression without the asked format") {
        caps.max_num = 64;
        caps.supported_format = MLX5DV_CQE_RES_FORMAT_HASH | MLX5DV_CQE_RES_FORMAT_CSUM;
        const std::string refusal = cqe_compression_refusal(caps, MLX5DV_CQE_RES_FORMAT_CSUM_STRIDX, "mlx5_1");
        CHECK(refusal.find("cqe_compression: device 'mlx5_1' has no mini-CQE format 0x4") != std::string::npos);
        CHECK(refusal.find("supported_format 0x3") != std::string::npos);
    }
    SUBCASE("compression with the format: no refusal") {
        caps.max_num = 64;
        caps.supported_format = MLX5DV_CQE_RES_FORMAT_CSUM;
        CHECK(cqe_compression_refusal(caps, MLX5DV_CQE_RES_FORMAT_CSUM, "mlx5_0").empty());
    }
}

TEST_CASE("verbs error helpers name the call, the object and the code") {
    CHECK_NOTHROW(check_return_code(0, "ibv_modify_qp", "QP 0x1"));
    try {
        check_return_code(EINVAL, "ibv_modify_qp", "QP 0x1 on rxe0");
        FAIL("expected an error");
    } catch (const VerbsError& error) {
        const std::string message = error.what();
        CHECK(message.find("ibv_modify_qp") != std::string::npos);
        CHECK(message.find("QP 0x1 on rxe0") != std::string::npos);
        CHECK(message.find("EINVAL") != std::string::npos);
        CHECK(error.code() == EINVAL);
    }
    // Providers that return -errno are reported with the same code.
    CHECK_THROWS_WITH_AS(check_return_code(-ETIMEDOUT, "ibv_modify_qp", "QP"),
                         doctest::Contains("ETIMEDOUT"), VerbsError);
    errno = EFAULT;
    CHECK_THROWS_WITH_AS(throw_from_errno("ibv_reg_mr", "region 0x0"), doctest::Contains("EFAULT"),
                         VerbsError);
}
