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
    DifferentialQueues queues;
    ibv_qp_ex* qpx = nullptr;
    mlx5dv_qp_ex* dv = nullptr;
    std::vector<Target> targets;
    std::uint32_t cqes = 0;
};

std::string open_dci(Dci& dci, std::mt19937_64& random, const ibv_qp_cap& wanted) {
    const std::string error = open_differential_dci(dci.queues, wanted);
    if (!error.empty()) return error;
    dci.qpx = ibv_qp_to_qp_ex(dci.queues.qp);
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
        target.handle = ibv_create_ah(dci.queues.device.pd, &address);
        if (target.handle == nullptr) return "ibv_create_ah failed";
        mlx5dv_ah vector{};
        mlx5dv_obj object{};
        object.ah.in = target.handle;
        object.ah.out = &vector;
        if (mlx5dv_init_obj(&object, MLX5DV_OBJ_AH) != 0) return "mlx5dv_init_obj of an address handle failed";
        target.base = reinterpret_cast<const std::uint8_t*>(vector.av);
        dci.targets.push_back(target);
    }
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
    std::uint32_t count = atomic ? 1 : static_cast<std::uint32_t>(below(dci.queues.caps.max_send_sge + 1));
    std::uint32_t inline_total = 0;
    for (std::uint32_t i = 0; i < count; ++i) {
        std::uint32_t length = atomic ? 8 : static_cast<std::uint32_t>(below(inline_data ? dci.queues.caps.max_inline_data / count + 1 : 5000));
        if (inline_data && inline_total + length > dci.queues.caps.max_inline_data) length = dci.queues.caps.max_inline_data - inline_total;
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

void run(const ibv_qp_cap& wanted, std::uint64_t seed, std::uint32_t calls) {
    std::mt19937_64 random(seed);
    Dci dci;
    const std::string error = open_dci(dci, random, wanted);
    REQUIRE_MESSAGE(error.empty(), error);
    DifferentialQueues& queues = dci.queues;
    INFO("DCI: wqe_cnt ", queues.send_wqe_count, ", max_send_sge ", queues.caps.max_send_sge, ", max_inline_data ",
         queues.caps.max_inline_data, "; seed ", seed);
    std::vector<std::uint8_t> payload(8192);
    for (std::uint8_t& byte : payload) byte = static_cast<std::uint8_t>(random());
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
        poison_send_side(queues, value);
        const std::uint32_t first_wqebb = queues.send.tracking().producer_index;

        ibv_wr_start(dci.qpx);
        for (const Request& request : requests) post_theirs(dci, request);
        REQUIRE(ibv_wr_complete(dci.qpx) == 0);
        std::uint32_t posted = 0;
        REQUIRE(queues.send.post(ours.data(), count, &posted) == mlx5::PostResult::ok);
        REQUIRE(posted == count);
        const std::string difference = send_side_difference(queues, first_wqebb, value, true);
        REQUIRE_MESSAGE(difference.empty(), difference);
        if (count == 1 && queues.their_blueflame[0] != value && queues.their_blueflame[16] != value) ++blueflame_calls;
        REQUIRE(retire_posted(queues, dci.cqes, first_wqebb, count));
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
