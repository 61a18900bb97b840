// DC initiator WQEs against libmlx5 itself: a DCI of the installed libmlx5 (mlx5dv_create_qp on
// the fake uverbs device, fake_uverbs.cpp) posts random chains through the ibv_wr_* API with
// mlx5dv_wr_set_dc_addr, to address handles libmlx5 built (random LIDs, SLs, static rates and
// GRHs); SendQueue, configured as a DC initiator, posts the same chains with the extended
// address vector make_dc_address_vector builds from the same address handle's base vector
// (mlx5dv_init_obj), as the project's mlx5 DC provider does. Every byte libmlx5 wrote into the
// WQEs posted, the send doorbell record and the BlueFlame or doorbell register must agree.
//
// Only valid chains are posted: on a refusal the ibv_wr_* API rings nothing and keeps what it
// wrote, a contract of its own (the golden vectors pin it), while our post rings for what it
// accepted. The poison method is the send test's (differential_queues.hpp).
#include <doctest/doctest.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/differential_queues.hpp"
#include "tests/libmlx5/fake_device.hpp"
#include "transport/mlx5/send_queue.hpp"
#include "transport/mlx5/wqe_segments.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

constexpr std::uint32_t kAddressHandles = 8;

struct Target {
    ibv_ah* handle = nullptr;
    const std::uint8_t* base = nullptr;  // libmlx5's base address vector of the handle
};

struct Dci {
    FakeMlx5 device;
    ibv_qp* qp = nullptr;
    ibv_qp_ex* qpx = nullptr;
    mlx5dv_qp_ex* dv = nullptr;
    ibv_qp_cap caps{};
    std::vector<Target> targets;
    Memory their_send, our_send;
    std::uint32_t* their_doorbell_record = nullptr;
    std::uint8_t* their_blueflame = nullptr;
    std::uint32_t blueflame_size = 0, wqe_count = 0;
    std::vector<std::uint8_t> send_memory, register_memory;
    std::uint32_t our_doorbell_record[2] = {};
    std::uint8_t* our_blueflame = nullptr;
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    mlx5::SendQueue send;
    std::uint32_t cqes = 0;
};

Memory aligned(std::vector<std::uint8_t>& storage, std::size_t length) {
    storage.assign(length + 64, 0);
    const auto address = reinterpret_cast<std::uintptr_t>(storage.data());
    return {storage.data() + ((64 - address % 64) % 64), length};
}

std::string open_dci(Dci& dci, std::mt19937_64& random, const ibv_qp_cap& wanted) {
    std::string error;
    dci.device = open_fake_mlx5(1024, error);
    if (!error.empty()) return error;
    ibv_qp_init_attr_ex attributes{};
    attributes.qp_type = IBV_QPT_DRIVER;
    attributes.send_cq = dci.device.cq;
    attributes.recv_cq = dci.device.cq;
    attributes.pd = dci.device.pd;
    attributes.cap = wanted;
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attributes.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
                                IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
                                IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
    mlx5dv_qp_init_attr dc{};
    dc.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
    dc.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
    dci.qp = mlx5dv_create_qp(dci.device.context, &attributes, &dc);
    if (dci.qp == nullptr) return "mlx5dv_create_qp of a DCI failed";
    dci.caps = attributes.cap;
    ibv_qp_attr state{};
    state.qp_state = IBV_QPS_INIT;
    state.port_num = 1;
    if (ibv_modify_qp(dci.qp, &state, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) != 0) return "DCI to INIT failed";
    state = {};
    state.qp_state = IBV_QPS_RTR;
    state.path_mtu = IBV_MTU_4096;
    state.ah_attr.port_num = 1;
    if (ibv_modify_qp(dci.qp, &state, IBV_QP_STATE | IBV_QP_PATH_MTU | IBV_QP_AV) != 0) return "DCI to RTR failed";
    state = {};
    state.qp_state = IBV_QPS_RTS;
    state.timeout = 14;
    state.retry_cnt = 7;
    state.rnr_retry = 7;
    state.max_rd_atomic = 1;
    if (ibv_modify_qp(dci.qp, &state,
                      IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                          IBV_QP_MAX_QP_RD_ATOMIC) != 0)
        return "DCI to RTS failed";
    dci.qpx = ibv_qp_to_qp_ex(dci.qp);
    dci.dv = mlx5dv_qp_ex_from_ibv_qp_ex(dci.qpx);
    if (dci.qpx == nullptr || dci.dv == nullptr) return "no ibv_qp_ex or mlx5dv_qp_ex for the DCI";

    // Address handles as libmlx5 builds them for an InfiniBand port: random LIDs, SLs, static
    // rates, source path bits, and half of them with a GRH.
    for (std::uint32_t i = 0; i < kAddressHandles; ++i) {
        ibv_ah_attr address{};
        address.port_num = 1;
        address.dlid = static_cast<std::uint16_t>(1 + random() % 0xbfff);
        address.sl = static_cast<std::uint8_t>(random() % 16);
        address.src_path_bits = static_cast<std::uint8_t>(random() % 8);
        address.static_rate = static_cast<std::uint8_t>(random() % 8);
        if (i % 2 == 1) {
            address.is_global = 1;
            for (std::uint8_t& byte : address.grh.dgid.raw) byte = static_cast<std::uint8_t>(random());
            address.grh.flow_label = static_cast<std::uint32_t>(random() % (1 << 20));
            address.grh.hop_limit = static_cast<std::uint8_t>(random());
            address.grh.traffic_class = static_cast<std::uint8_t>(random());
        }
        Target target;
        target.handle = ibv_create_ah(dci.device.pd, &address);
        if (target.handle == nullptr) return "ibv_create_ah failed";
        mlx5dv_ah vector{};
        mlx5dv_obj object{};
        object.ah.in = target.handle;
        object.ah.out = &vector;
        if (mlx5dv_init_obj(&object, MLX5DV_OBJ_AH) != 0) return "mlx5dv_init_obj of an address handle failed";
        target.base = reinterpret_cast<const std::uint8_t*>(vector.av);
        dci.targets.push_back(target);
    }

    mlx5dv_qp layout{};
    mlx5dv_obj object{};
    object.qp.in = dci.qp;
    object.qp.out = &layout;
    if (mlx5dv_init_obj(&object, MLX5DV_OBJ_QP) != 0 || layout.sq.stride != 64) return "mlx5dv_init_obj of the DCI failed";
    dci.wqe_count = layout.sq.wqe_cnt;
    dci.their_send = {static_cast<std::uint8_t*>(layout.sq.buf), static_cast<std::size_t>(layout.sq.wqe_cnt) * 64};
    dci.their_doorbell_record = reinterpret_cast<std::uint32_t*>(layout.dbrec);
    dci.their_blueflame = static_cast<std::uint8_t*>(layout.bf.reg);
    dci.blueflame_size = layout.bf.size;
    dci.our_send = aligned(dci.send_memory, dci.their_send.length);
    dci.our_blueflame = aligned(dci.register_memory, 2 * static_cast<std::size_t>(layout.bf.size)).bytes;
    dci.wr_ids.assign(layout.sq.wqe_cnt, 0);
    dci.wqe_ends.assign(layout.sq.wqe_cnt, 0);
    mlx5::SendQueueRing ring;
    ring.buffer = dci.our_send.bytes;
    ring.wqe_count = layout.sq.wqe_cnt;
    ring.qpn = dci.qp->qp_num;
    ring.doorbell_record = dci.our_doorbell_record;
    ring.blueflame_register = dci.our_blueflame;
    ring.blueflame_size = layout.bf.size;
    mlx5::SendQueueConfig config;
    config.max_sge = dci.caps.max_send_sge;
    config.max_inline_data = dci.caps.max_inline_data;
    config.dc_initiator = true;
    dci.send = mlx5::SendQueue(ring, {dci.wr_ids.data(), dci.wqe_ends.data(), 0, 0, nullptr}, config);
    return {};
}

// One random request in both forms, always one the queue takes.
struct Request {
    mlx5::SendWorkRequest ours;
    std::vector<ibv_sge> elements;
    std::vector<ibv_data_buf> inline_buffers;
    std::vector<mlx5::ScatterGatherElement> our_elements;
    std::uint8_t address_vector[mlx5::kAddressVectorSize];
    std::uint32_t target = 0, dctn = 0;
    std::uint64_t key = 0;
    int kind = 0;
};

void build(Request& request, std::mt19937_64& random, const Dci& dci, const std::vector<std::uint8_t>& payload) {
    auto below = [&](std::uint64_t bound) { return bound == 0 ? 0 : random() % bound; };
    request.kind = static_cast<int>(below(7));
    const bool atomic = request.kind >= 5;
    const bool read = request.kind == 4;
    mlx5::SendWorkRequest& ours = request.ours;
    static constexpr mlx5::SendOpcode kOpcodes[] = {
        mlx5::SendOpcode::rdma_write, mlx5::SendOpcode::rdma_write_with_immediate, mlx5::SendOpcode::send,
        mlx5::SendOpcode::send_with_immediate, mlx5::SendOpcode::rdma_read, mlx5::SendOpcode::atomic_compare_and_swap,
        mlx5::SendOpcode::atomic_fetch_and_add};
    ours.opcode = kOpcodes[request.kind];
    ours.wr_id = random();
    ours.flags = (below(3) == 0 ? mlx5::kSendSignaled : 0) | (below(4) == 0 ? mlx5::kSendSolicited : 0) |
                 (below(6) == 0 ? mlx5::kSendFence : 0);
    ours.remote_addr = atomic ? random() & ~7ull : random();
    ours.rkey = static_cast<std::uint32_t>(random());
    ours.immediate = static_cast<std::uint32_t>(random());
    ours.compare_add = random();
    ours.swap = random();
    const bool inline_data = !atomic && !read && below(3) == 0;
    std::uint32_t count = atomic ? 1 : static_cast<std::uint32_t>(below(dci.caps.max_send_sge + 1));
    std::uint32_t inline_total = 0;
    for (std::uint32_t i = 0; i < count; ++i) {
        std::uint32_t length = atomic ? 8 : static_cast<std::uint32_t>(below(inline_data ? dci.caps.max_inline_data / count + 1 : 5000));
        if (inline_data && inline_total + length > dci.caps.max_inline_data) length = dci.caps.max_inline_data - inline_total;
        inline_total += length;
        const std::uint64_t offset = below(payload.size() - length + 1);
        const std::uint64_t address = inline_data ? reinterpret_cast<std::uintptr_t>(payload.data()) + offset : random() & 0xffffffffffffull;
        request.elements.push_back({address, length, static_cast<std::uint32_t>(random())});
        request.inline_buffers.push_back({reinterpret_cast<void*>(address), length});
        request.our_elements.push_back({address, length, request.elements.back().lkey});
    }
    if (inline_data) ours.flags |= mlx5::kSendInline;
    ours.sg_list = request.our_elements.empty() ? nullptr : request.our_elements.data();
    ours.num_sge = count;
    request.target = static_cast<std::uint32_t>(below(kAddressHandles));
    request.dctn = static_cast<std::uint32_t>(random() & 0xffffff);
    request.key = random();
    mlx5::make_dc_address_vector(request.address_vector, dci.targets[request.target].base, request.dctn, request.key);
    ours.dc_address_vector = request.address_vector;
}

// The same request through libmlx5's ibv_wr_* API.
void post_theirs(Dci& dci, const Request& request) {
    ibv_qp_ex* qpx = dci.qpx;
    const mlx5::SendWorkRequest& ours = request.ours;
    qpx->wr_id = ours.wr_id;
    qpx->wr_flags = ((ours.flags & mlx5::kSendSignaled) != 0 ? IBV_SEND_SIGNALED : 0) |
                    ((ours.flags & mlx5::kSendSolicited) != 0 ? IBV_SEND_SOLICITED : 0) |
                    ((ours.flags & mlx5::kSendFence) != 0 ? IBV_SEND_FENCE : 0) |
                    ((ours.flags & mlx5::kSendInline) != 0 ? IBV_SEND_INLINE : 0);
    // ibv_wr takes the immediate as the bytes that go on the wire.
    const __be32 immediate = __builtin_bswap32(ours.immediate);
    switch (request.kind) {
        case 0: ibv_wr_rdma_write(qpx, ours.rkey, ours.remote_addr); break;
        case 1: ibv_wr_rdma_write_imm(qpx, ours.rkey, ours.remote_addr, immediate); break;
        case 2: ibv_wr_send(qpx); break;
        case 3: ibv_wr_send_imm(qpx, immediate); break;
        case 4: ibv_wr_rdma_read(qpx, ours.rkey, ours.remote_addr); break;
        case 5: ibv_wr_atomic_cmp_swp(qpx, ours.rkey, ours.remote_addr, ours.compare_add, ours.swap); break;
        default: ibv_wr_atomic_fetch_add(qpx, ours.rkey, ours.remote_addr, ours.compare_add); break;
    }
    mlx5dv_wr_set_dc_addr(dci.dv, dci.targets[request.target].handle, request.dctn, request.key);
    if ((ours.flags & mlx5::kSendInline) != 0) {
        ibv_wr_set_inline_data_list(qpx, request.inline_buffers.size(), request.inline_buffers.data());
    } else {
        ibv_wr_set_sge_list(qpx, request.elements.size(), request.elements.data());
    }
}

void retire_all(Dci& dci, std::uint32_t first_wqebb, std::uint32_t wqes) {
    std::uint32_t start = first_wqebb, last = first_wqebb;
    for (std::uint32_t i = 0; i < wqes; ++i) {
        last = start;
        const std::uint8_t* ctrl = dci.their_send.bytes + static_cast<std::size_t>(start & (dci.wqe_count - 1)) * 64;
        start += ((ctrl[7] & 0x3f) * 16 + 63) / 64;
    }
    const std::uint8_t* ctrl = dci.their_send.bytes + static_cast<std::size_t>(last & (dci.wqe_count - 1)) * 64;
    write_requester_cqe(dci.cqes++, dci.qp->qp_num, ctrl[3], last);
    ibv_wc completion{};
    REQUIRE(ibv_poll_cq(dci.device.cq, 1, &completion) == 1);
    dci.send.tracking().consumer_index = dci.send.tracking().producer_index;
}

void run(const ibv_qp_cap& wanted, std::uint64_t seed, std::uint32_t calls) {
    std::mt19937_64 random(seed);
    Dci dci;
    const std::string error = open_dci(dci, random, wanted);
    REQUIRE_MESSAGE(error.empty(), error);
    INFO("DCI: wqe_cnt ", dci.wqe_count, ", max_send_sge ", dci.caps.max_send_sge, ", max_inline_data ", dci.caps.max_inline_data,
         "; seed ", seed);
    std::vector<std::uint8_t> payload(8192);
    for (std::uint8_t& byte : payload) byte = static_cast<std::uint8_t>(random());
    const std::size_t register_bytes = 2 * static_cast<std::size_t>(dci.blueflame_size);
    std::uint32_t blueflame_calls = 0;
    for (std::uint32_t call = 0; call < calls; ++call) {
        CAPTURE(call);
        const std::uint32_t count = 1 + static_cast<std::uint32_t>(random() % 4);
        std::vector<Request> requests(count);
        std::vector<mlx5::SendWorkRequest> ours;
        std::string description;
        for (Request& request : requests) {
            build(request, random, dci, payload);
            ours.push_back(request.ours);
            description += " kind " + std::to_string(request.kind) + " sge " + std::to_string(request.ours.num_sge) + " flags " +
                           std::to_string(request.ours.flags >> 24) + ((request.ours.flags & mlx5::kSendInline) != 0 ? " inline" : "");
        }
        CAPTURE(description);
        const auto value = static_cast<std::uint8_t>(random());
        std::memset(dci.their_send.bytes, value, dci.their_send.length);
        std::memset(dci.our_send.bytes, value, dci.our_send.length);
        std::memset(dci.their_blueflame, value, register_bytes);
        std::memset(dci.our_blueflame, value, register_bytes);
        const std::uint32_t first_wqebb = dci.send.tracking().producer_index;

        ibv_wr_start(dci.qpx);
        for (const Request& request : requests) post_theirs(dci, request);
        REQUIRE(ibv_wr_complete(dci.qpx) == 0);
        std::uint32_t posted = 0;
        REQUIRE(dci.send.post(ours.data(), count, &posted) == mlx5::PostResult::ok);
        REQUIRE(posted == count);
        REQUIRE(dci.their_doorbell_record[1] == dci.our_doorbell_record[1]);
        long ring_difference = -1;
        for (std::uint32_t wqebb = first_wqebb; wqebb != dci.send.tracking().producer_index && ring_difference < 0; ++wqebb) {
            const std::size_t at = static_cast<std::size_t>(wqebb & (dci.wqe_count - 1)) * 64;
            const long difference = first_difference(dci.their_send.bytes + at, dci.our_send.bytes + at, 64, value);
            if (difference >= 0) ring_difference = static_cast<long>(at) + difference;
        }
        INFO("WQEBB ", ring_difference / 64, " byte ", ring_difference % 64, ": libmlx5 ",
             ring_difference < 0 ? std::string() : hex_around(dci.their_send.bytes, ring_difference, dci.their_send.length),
             ", ours ", ring_difference < 0 ? std::string() : hex_around(dci.our_send.bytes, ring_difference, dci.our_send.length));
        REQUIRE(ring_difference < 0);
        const long register_difference = first_difference(dci.their_blueflame, dci.our_blueflame, register_bytes, value);
        INFO("register byte ", register_difference);
        REQUIRE(register_difference < 0);
        if (count == 1 && dci.their_blueflame[0] != value && dci.their_blueflame[16] != value) ++blueflame_calls;
        retire_all(dci, first_wqebb, count);
    }
    MESSAGE(calls, " random chains to ", kAddressHandles, " address handles; ", blueflame_calls,
            " single WQEs checked in the BlueFlame register");
}

}  // namespace

TEST_CASE("DC initiator WQEs, address vectors included, are what the installed libmlx5 writes") {
    ibv_qp_cap caps{};
    caps.max_send_wr = 64;
    caps.max_send_sge = 4;
    caps.max_inline_data = 128;
    run(caps, 21, 20000);
    caps.max_send_wr = 8;
    caps.max_send_sge = 1;
    caps.max_inline_data = 32;
    run(caps, 22, 20000);
}
