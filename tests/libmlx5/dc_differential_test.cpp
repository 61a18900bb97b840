// DC initiator WQEs against libmlx5 itself: a DCI of the installed libmlx5 (mlx5dv_create_qp on
// the fake uverbs device, fake_uverbs.cpp) posts random chains through the ibv_wr_* API with
// mlx5dv_wr_set_dc_addr, to address handles libmlx5 built (random LIDs, SLs, static rates, path
// bits and GRHs); SendQueue, configured as a DC initiator, posts the same chains with the
// extended address vector make_dc_address_vector builds from the project's own base vector
// (transport/mlx5/address_vector.hpp, from the same LID, SL, rate and GRH). Every byte libmlx5
// wrote into the WQEs posted, the send doorbell record and the BlueFlame or doorbell register
// must agree, and each base vector must be, all 48 bytes, the one libmlx5's mlx5_create_ah
// built (mlx5dv_init_obj). A second case compares base vectors on a RoCE port (v1 and v2 GIDs,
// the MAC the fake kernel resolved, a GRH missing: refused by both).
//
// A request that may be refused (too many SGEs, inline data too large) is posted alone: on a
// refusal the ibv_wr_* API posts nothing of its batch, while our post takes the requests before
// the refused one. Both must refuse it for the same reason (libmlx5_refusals.hpp) or both take
// it. A full queue is not compared (send_differential_test.cpp says why). Not generated: an
// inline list of more buffers than max_send_sge, which ibv_wr_set_inline_data_list takes (it
// counts bytes only) and our post refuses, as ibv_post_send does. What a run reached is required
// by count (Coverage): each address-vector kind, each WQE layout (opcode with SGEs, inline data
// or none), each refusal, BlueFlame posts and ring wraps. The poison method is the send test's
// (differential_queues.hpp).
#include <doctest/doctest.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/coverage.hpp"
#include "tests/libmlx5/differential_queues.hpp"
#include "tests/libmlx5/fake_uverbs.hpp"
#include "tests/libmlx5/libmlx5_refusals.hpp"
#include "tools/golden_check/post_errno.hpp"
#include "transport/mlx5/address_vector.hpp"
#include "transport/mlx5/wqe_segments.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
using namespace rdmachan::libmlx5_instructions;

constexpr std::uint32_t kAddressHandles = 8;

struct Target {
    ibv_ah* handle = nullptr;
    std::array<std::uint8_t, mlx5::kAddressVectorSize> base{};  // ours, equal to libmlx5's
    const char* kind = "";
};

struct Dci {
    DifferentialQueues queues;
    ibv_qp_ex* qpx = nullptr;
    mlx5dv_qp_ex* dv = nullptr;
    std::vector<Target> targets;
    std::uint32_t cqes = 0;
};

// Random address-handle attributes for port 1: any LID, SL, static rate (every enum ibv_rate
// value and one past them) and source path bits; with a GRH when `global`, any GID, flow label,
// source GID index below `gid_indices`, hop limit and traffic class.
ibv_ah_attr random_address(std::mt19937_64& random, bool global, std::uint32_t gid_indices) {
    ibv_ah_attr address{};
    address.port_num = 1;
    address.dlid = static_cast<std::uint16_t>(random());
    address.sl = static_cast<std::uint8_t>(random() % 16);
    address.src_path_bits = static_cast<std::uint8_t>(random() % 128);
    address.static_rate = static_cast<std::uint8_t>(random() % (IBV_RATE_600_GBPS + 2));
    if (global) {
        address.is_global = 1;
        for (std::uint8_t& byte : address.grh.dgid.raw) byte = static_cast<std::uint8_t>(random());
        address.grh.flow_label = static_cast<std::uint32_t>(random() % (1 << 20));
        address.grh.sgid_index = static_cast<std::uint8_t>(random() % gid_indices);
        address.grh.hop_limit = static_cast<std::uint8_t>(random());
        address.grh.traffic_class = static_cast<std::uint8_t>(random());
    }
    return address;
}

// The same destination as the project's address-vector builder takes it.
mlx5::Destination destination_of(const ibv_ah_attr& address) {
    mlx5::Destination destination;
    destination.lid = address.dlid;
    destination.service_level = address.sl;
    destination.static_rate = address.static_rate;
    destination.source_path_bits = address.src_path_bits;
    destination.global = address.is_global != 0;
    std::memcpy(destination.route.destination_gid, address.grh.dgid.raw, 16);
    destination.route.flow_label = address.grh.flow_label;
    destination.route.source_gid_index = address.grh.sgid_index;
    destination.route.hop_limit = address.grh.hop_limit;
    destination.route.traffic_class = address.grh.traffic_class;
    return destination;
}

std::string hex(const std::uint8_t* bytes, std::size_t length) {
    std::string text;
    char piece[4];
    for (std::size_t i = 0; i < length; ++i) {
        std::snprintf(piece, sizeof piece, "%02x", bytes[i]);
        text += piece;
    }
    return text;
}

// libmlx5's base address vector of `handle` (mlx5dv_init_obj), compared with all 48 bytes of
// ours; empty when they agree, else both.
std::string compare_base(ibv_ah* handle, const std::uint8_t (&ours)[mlx5::kAddressVectorSize], std::size_t skip_from = 0,
                         std::size_t skip_to = 0) {
    mlx5dv_ah vector{};
    mlx5dv_obj object{};
    object.ah.in = handle;
    object.ah.out = &vector;
    if (mlx5dv_init_obj(&object, MLX5DV_OBJ_AH) != 0) return "mlx5dv_init_obj of an address handle failed";
    const auto* theirs = reinterpret_cast<const std::uint8_t*>(vector.av);
    for (std::size_t i = 0; i < mlx5::kAddressVectorSize; ++i)
        if ((i < skip_from || i >= skip_to) && theirs[i] != ours[i])
            return "address vectors differ at byte " + std::to_string(i) + ": libmlx5 " + hex(theirs, mlx5::kAddressVectorSize) +
                   ", ours " + hex(ours, mlx5::kAddressVectorSize);
    return {};
}

std::string open_dci(Dci& dci, std::mt19937_64& random, const ibv_qp_cap& wanted) {
    const std::string error = open_differential_dci(dci.queues, wanted);
    if (!error.empty()) return error;
    dci.qpx = ibv_qp_to_qp_ex(dci.queues.qp);
    dci.dv = mlx5dv_qp_ex_from_ibv_qp_ex(dci.qpx);
    if (dci.qpx == nullptr || dci.dv == nullptr) return "no ibv_qp_ex or mlx5dv_qp_ex for the DCI";
    // Address handles on an InfiniBand port, half of them with a GRH; each one's base vector is
    // built by the project and must be libmlx5's.
    for (std::uint32_t i = 0; i < kAddressHandles; ++i) {
        ibv_ah_attr address = random_address(random, i % 2 == 1, 4);
        Target target;
        target.handle = ibv_create_ah(dci.queues.device.pd, &address);
        if (target.handle == nullptr) return "ibv_create_ah failed";
        std::uint8_t ours[mlx5::kAddressVectorSize];
        if (!mlx5::make_address_vector(ours, destination_of(address))) return "our builder refused an InfiniBand address";
        const std::string difference = compare_base(target.handle, ours);
        if (!difference.empty()) return difference;
        std::memcpy(target.base.data(), ours, sizeof ours);
        target.kind = address.is_global != 0 ? "address vector: InfiniBand with a GRH" : "address vector: InfiniBand without a GRH";
        dci.targets.push_back(target);
    }
    return {};
}

constexpr const char* kKindNames[] = {"RDMA_WRITE", "RDMA_WRITE_WITH_IMM", "SEND", "SEND_WITH_IMM",
                                      "RDMA_READ", "ATOMIC_CMP_AND_SWP", "ATOMIC_FETCH_AND_ADD"};

// One random request in both forms. With `may_be_refused`, now and then one libmlx5 refuses: one
// SGE more than max_send_sge, or inline data past max_inline_data.
struct Request {
    mlx5::SendWorkRequest ours;
    std::vector<ibv_sge> elements;
    std::vector<ibv_data_buf> inline_buffers;
    std::vector<mlx5::ScatterGatherElement> our_elements;
    std::uint8_t address_vector[mlx5::kAddressVectorSize];
    std::uint32_t target = 0, dctn = 0;
    std::uint64_t key = 0;
    int kind = 0;
    std::uint64_t inline_total = 0;
    bool may_be_refused = false;

    bool inline_data() const { return (ours.flags & mlx5::kSendInline) != 0; }
    // The WQE layout: the opcode, and inline data, SGEs or no data.
    std::string layout() const {
        return std::string("layout: ") + kKindNames[kind] +
               (inline_data() ? ", inline" : ours.num_sge == 0 ? ", no data" : ", SGEs");
    }
};

void build(Request& request, std::mt19937_64& random, const Dci& dci, const std::vector<std::uint8_t>& payload,
           bool may_be_refused) {
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
    const std::uint32_t max_sge = dci.queues.caps.max_send_sge, max_inline = dci.queues.caps.max_inline_data;
    std::uint32_t count = atomic ? 1 : static_cast<std::uint32_t>(below(max_sge + 1));
    // Refusable now and then: one SGE too many, or inline data up to 24 bytes too long.
    const bool too_many = may_be_refused && !inline_data && below(30) == 0;
    const bool too_long = may_be_refused && inline_data && below(10) == 0;
    if (too_many) count = max_sge + 1;
    if (too_long && count == 0) count = 1;
    request.may_be_refused = too_many || too_long;
    const std::uint32_t inline_limit = too_long ? max_inline + 1 + static_cast<std::uint32_t>(below(24)) : max_inline;
    std::uint32_t inline_total = 0;
    for (std::uint32_t i = 0; i < count; ++i) {
        std::uint32_t length = atomic ? 8 : static_cast<std::uint32_t>(below(inline_data ? inline_limit / count + 1 : 5000));
        if (inline_data && inline_total + length > inline_limit) length = inline_limit - inline_total;
        // The last buffer makes up a refusable total.
        if (too_long && i + 1 == count) length = inline_limit - inline_total;
        inline_total += length;
        const std::uint64_t offset = below(payload.size() - length + 1);
        const std::uint64_t address = inline_data ? reinterpret_cast<std::uintptr_t>(payload.data()) + offset : random() & 0xffffffffffffull;
        request.elements.push_back({address, length, static_cast<std::uint32_t>(random())});
        request.inline_buffers.push_back({reinterpret_cast<void*>(address), length});
        request.our_elements.push_back({address, length, request.elements.back().lkey});
    }
    if (inline_data) ours.flags |= mlx5::kSendInline;
    request.inline_total = inline_total;
    ours.sg_list = request.our_elements.empty() ? nullptr : request.our_elements.data();
    ours.num_sge = count;
    request.target = static_cast<std::uint32_t>(below(kAddressHandles));
    request.dctn = static_cast<std::uint32_t>(random() & 0xffffff);
    request.key = random();
    mlx5::make_dc_address_vector(request.address_vector, dci.targets[request.target].base.data(), request.dctn, request.key);
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
    const QueueLimits limits{queues.caps.max_send_wr, queues.caps.max_send_sge, queues.caps.max_inline_data};
    std::vector<std::uint8_t> payload(8192);
    for (std::uint8_t& byte : payload) byte = static_cast<std::uint8_t>(random());
    Coverage coverage;
    for (std::uint32_t call = 0; call < calls; ++call) {
        CAPTURE(call);
        // A request that may be refused is posted alone: the ibv_wr_* API then takes nothing.
        std::uint32_t count = 1 + static_cast<std::uint32_t>(random() % 4);
        std::vector<Request> requests(count);
        std::vector<mlx5::SendWorkRequest> ours;
        std::string description;
        for (std::uint32_t i = 0; i < count; ++i) {
            Request& request = requests[i];
            build(request, random, dci, payload, i == 0);
            ours.push_back(request.ours);
            description += " kind " + std::to_string(request.kind) + " sge " + std::to_string(request.ours.num_sge) + " flags " +
                           std::to_string(request.ours.flags >> 24) + (request.inline_data() ? " inline" : "");
            if (request.may_be_refused) count = 1;
        }
        requests.resize(count);
        ours.resize(count);
        CAPTURE(description);
        const auto value = static_cast<std::uint8_t>(random());
        poison_send_side(queues, value);
        const std::uint32_t first_wqebb = queues.send.tracking().producer_index;
        Refusal expected{count, mlx5::PostResult::ok};
        const Request& first = requests.front();
        const mlx5::PostResult reason =
            libmlx5_builder_refusal(first.ours.num_sge, first.inline_data(), first.inline_total, 0, 0, limits);
        if (reason != mlx5::PostResult::ok) expected = {0, reason};

        ibv_wr_start(dci.qpx);
        for (const Request& request : requests) post_theirs(dci, request);
        const int their_result = ibv_wr_complete(dci.qpx);
        std::uint32_t posted = 0;
        const mlx5::PostResult our_result = queues.send.post(ours.data(), count, &posted);
        const std::string derivation =
            check_derivation(expected, their_result, their_result == 0 ? count : 0, count, rdmachan::golden::send_errno_of);
        REQUIRE_MESSAGE(derivation.empty(), derivation);
        const std::string refusal = refusal_difference(expected, our_result, posted);
        REQUIRE_MESSAGE(refusal.empty(), refusal);
        // A refusal rings nothing on either side: the doorbell records agree and no WQE is posted.
        const std::string difference = send_side_difference(queues, first_wqebb, value, their_result == 0);
        REQUIRE_MESSAGE(difference.empty(), difference);
        if (their_result != 0) {
            coverage.count(std::string("refusal: ") + reason_name(expected.reason));
            continue;
        }
        for (const Request& request : requests) {
            coverage.count(request.layout());
            coverage.count(dci.targets[request.target].kind);
        }
        if (blueflame_written(queues, value)) coverage.count("BlueFlame post");
        if (crosses_ring_end(queues, first_wqebb, queues.send.tracking().producer_index)) coverage.count("ring wrap");
        REQUIRE(retire_posted(queues, dci.cqes, first_wqebb, count));
    }
    MESSAGE(calls, " random chains on wqe_cnt ", queues.send_wqe_count, ", max_send_sge ", queues.caps.max_send_sge,
            ", max_inline_data ", queues.caps.max_inline_data, " to ", kAddressHandles, " address handles: ", coverage.summary());
    // The coverage claimed above, by count: every opcode with SGEs, those that carry data also
    // inline and with none, both address-vector kinds, both refusals, BlueFlame, ring wraps.
    std::vector<std::pair<std::string, std::uint32_t>> minimums = {
        {"address vector: InfiniBand without a GRH", calls / 10},
        {"address vector: InfiniBand with a GRH", calls / 10},
        {"refusal: too many SGEs", calls / 400},
        {"refusal: inline too large", calls / 400},
        {"BlueFlame post", calls / 20},
        {"ring wrap", calls / 400},
    };
    for (int kind = 0; kind < 7; ++kind) {
        minimums.push_back({std::string("layout: ") + kKindNames[kind] + ", SGEs", calls / 40});
        if (kind < 4) {
            minimums.push_back({std::string("layout: ") + kKindNames[kind] + ", inline", calls / 40});
            minimums.push_back({std::string("layout: ") + kKindNames[kind] + ", no data", calls / 100});
        }
    }
    const std::string missing = coverage.shortfalls(minimums);
    CHECK_MESSAGE(missing.empty(), missing);
}

// The fake port as a RoCE port for one case: its link layer Ethernet (libmlx5 reads it when the
// device is opened), and the sysfs tree kept while address handles are made (libibverbs reads a
// GID's type from it), GID 0 of type RoCE v1 and GID 1 of type RoCE v2. Both undone when the
// case ends, also on a failure.
class FakeRocePort {
  public:
    FakeRocePort() { fake_kernel().link_layer = IBV_LINK_LAYER_ETHERNET; }
    ~FakeRocePort() {
        fake_kernel().link_layer = IBV_LINK_LAYER_INFINIBAND;
        if (!sysfs_.empty()) std::filesystem::remove_all(sysfs_);
    }
    FakeRocePort(const FakeRocePort&) = delete;
    FakeRocePort& operator=(const FakeRocePort&) = delete;
    void keep_sysfs() {
        sysfs_ = make_fake_sysfs();
        std::ofstream(sysfs_ / "class/infiniband/mlx5_0/ports/1/gid_attrs/types/1") << "RoCE v2\n";
    }

  private:
    std::filesystem::path sysfs_;
};

// `count` random address handles made by libmlx5 on the fake port, each one's base vector built
// by the project from the same attributes and compared, all 48 bytes. On a RoCE port, one in
// ten has no GRH, which both refuse; the MAC is the one the fake kernel resolved; a RoCE v2 GID
// with flow label 0 gets a UDP source port libmlx5 draws at random, so those two bytes are only
// checked to be in its range. `roce_port`: the RoCE port, or nullptr for an InfiniBand one.
void compare_address_vectors(FakeRocePort* roce_port, std::uint64_t seed, std::uint32_t count) {
    const bool roce = roce_port != nullptr;
    std::mt19937_64 random(seed);
    std::string error;
    const FakeMlx5 device = open_fake_mlx5(4, error);
    REQUIRE_MESSAGE(error.empty(), error);
    // The tree went once the device was open; a RoCE address handle reads it again.
    if (roce) roce_port->keep_sysfs();
    Coverage coverage;
    for (std::uint32_t i = 0; i < count; ++i) {
        CAPTURE(i);
        const bool global = roce ? random() % 10 != 0 : random() % 2 == 0;
        ibv_ah_attr address = random_address(random, global, roce ? 2 : 4);
        const bool roce_v2 = roce && global && address.grh.sgid_index == 1;
        if (roce_v2 && random() % 4 == 0) address.grh.flow_label = 0;
        ibv_ah* handle = ibv_create_ah(device.pd, &address);
        mlx5::Destination destination = destination_of(address);
        destination.ethernet = roce;
        destination.roce_v2 = roce_v2;
        std::memcpy(destination.mac, fake_kernel().address_handle_mac, sizeof destination.mac);
        std::uint8_t ours[mlx5::kAddressVectorSize];
        const bool built = mlx5::make_address_vector(ours, destination);
        if (handle == nullptr || !built) {
            REQUIRE_MESSAGE((handle == nullptr && !built && roce && !global), "libmlx5 made the address handle: ", handle != nullptr,
                            ", ours built its vector: ", built);
            coverage.count("RoCE without a GRH, refused by both");
            continue;
        }
        const bool random_port = roce_v2 && address.grh.flow_label == 0;
        const std::string difference = random_port ? compare_base(handle, ours, mlx5::kAvRlid, mlx5::kAvRlid + 2) : compare_base(handle, ours);
        REQUIRE_MESSAGE(difference.empty(), difference);
        if (random_port) {
            mlx5dv_ah vector{};
            mlx5dv_obj object{};
            object.ah.in = handle;
            object.ah.out = &vector;
            REQUIRE(mlx5dv_init_obj(&object, MLX5DV_OBJ_AH) == 0);
            const auto* theirs = reinterpret_cast<const std::uint8_t*>(vector.av);
            REQUIRE(theirs[mlx5::kAvRlid] >= 0xc0);
        }
        coverage.count(!roce ? (global ? "InfiniBand with a GRH" : "InfiniBand without a GRH")
                       : !roce_v2 ? "RoCE v1"
                       : random_port ? "RoCE v2, flow label 0"
                                     : "RoCE v2");
        REQUIRE(ibv_destroy_ah(handle) == 0);
    }
    MESSAGE(count, " address vectors on ", std::string(roce ? "a RoCE" : "an InfiniBand"), " port: ", coverage.summary());
    const std::string missing =
        roce ? coverage.shortfalls({{"RoCE v1", count / 4}, {"RoCE v2", count / 4}, {"RoCE v2, flow label 0", count / 20},
                                    {"RoCE without a GRH, refused by both", count / 20}})
             : coverage.shortfalls({{"InfiniBand with a GRH", count / 4}, {"InfiniBand without a GRH", count / 4}});
    CHECK_MESSAGE(missing.empty(), missing);
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

TEST_CASE("the project's address vectors are libmlx5's, on InfiniBand and RoCE ports, with and without a GRH") {
    compare_address_vectors(nullptr, 23, 5000);
    FakeRocePort roce;
    compare_address_vectors(&roce, 24, 5000);
}
