#include "tools/golden_check/capture/libmlx5_queues.hpp"

#include <atomic>
#include <cstring>
#include <stdexcept>

#include "tests/libmlx5/fake_uverbs.hpp"
#include "tools/golden_check/capture/capture_memory.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::golden::capture {
namespace {

namespace mlx5 = rdmachan::mlx5;
using nlohmann::json;

// The golden README's receive SGEs ("Inputs").
constexpr ibv_sge kReceiveSges[] = {
    {0x00007f1122334450, 0x1000, 0x0a0b0c0d},
    {0x00007f5566778890, 0x2000, 0x1a1b1c1d},
    {0x00007f99aabbccd0, 0x300, 0x2a2b2c2d},
    {0x00007fa1a2a3a4a0, 0x40, 0x3a3b3c3d},
};

std::vector<ibv_sge> sges_of(const ReceiveSpec& spec) {
    if (spec.sges > 4) throw std::runtime_error("at most four receive SGEs");
    return std::vector<ibv_sge>(kReceiveSges, kReceiveSges + spec.sges);
}

// A chain of receive work requests and the storage they point into.
struct ReceiveChain {
    std::vector<std::vector<ibv_sge>> sges;
    std::vector<ibv_recv_wr> wrs;
    explicit ReceiveChain(const std::vector<ReceiveSpec>& list) {
        sges.reserve(list.size());
        wrs.resize(list.size());
        for (std::size_t i = 0; i < list.size(); ++i) {
            sges.push_back(sges_of(list[i]));
            wrs[i].wr_id = list[i].wr_id;
            wrs[i].sg_list = sges.back().data();
            wrs[i].num_sge = static_cast<int>(list[i].sges);
            wrs[i].next = i + 1 < list.size() ? &wrs[i + 1] : nullptr;
        }
    }
};

json post_step(const char* op, const std::vector<ReceiveSpec>& list, int result,
               const ibv_recv_wr* bad, const ReceiveChain& chain) {
    json step = {{"op", op}, {"wr_list", json::array()}, {"return_code", result}};
    for (const ReceiveSpec& spec : list) step["wr_list"].push_back(receive_json(spec));
    step["bad_wr_index"] = bad == nullptr ? json(nullptr) : json(bad - chain.wrs.data());
    return step;
}

}  // namespace

json receive_json(const ReceiveSpec& spec) {
    json wr = {
        {"wr_id", hex_number(spec.wr_id)}, {"num_sge", spec.sges}, {"sg_list", json::array()}};
    for (const ibv_sge& sge : sges_of(spec)) {
        wr["sg_list"].push_back({{"addr", hex_number(sge.addr)},
                                 {"length", hex_number(sge.length)},
                                 {"lkey", hex_number(sge.lkey)}});
    }
    return wr;
}

Libmlx5Queues::Libmlx5Queues(std::uint32_t cq_entries) {
    std::string error;
    device_ = rdmachan::libmlx5_instructions::open_fake_mlx5(cq_entries, error);
    if (!error.empty()) throw std::runtime_error(error);
    mlx5dv_obj object{};
    object.cq.in = device_.cq;
    object.cq.out = &cq_;
    if (mlx5dv_init_obj(&object, MLX5DV_OBJ_CQ) != 0)
        throw std::runtime_error("mlx5dv_init_obj of the CQ failed");
}

QueuePair& Libmlx5Queues::add_queue_pair(std::uint32_t max_recv_wr, std::uint32_t max_recv_sge,
                                         ibv_srq* srq) {
    ibv_qp_cap caps{};
    caps.max_send_wr = 16;
    caps.max_send_sge = 4;
    caps.max_recv_wr = srq != nullptr ? 0 : max_recv_wr;
    caps.max_recv_sge = srq != nullptr ? 0 : max_recv_sge;
    std::string error;
    auto* queue_pair = new QueuePair;  // lives as long as the process: the fake device does too
    queue_pair->qp =
        rdmachan::libmlx5_instructions::create_rts_queue_pair(device_, caps, error, false, srq);
    if (queue_pair->qp == nullptr) throw std::runtime_error(error);
    queue_pair->user_index = rdmachan::libmlx5_instructions::fake_kernel().user_index;
    mlx5dv_obj object{};
    object.qp.in = queue_pair->qp;
    object.qp.out = &queue_pair->dv;
    if (mlx5dv_init_obj(&object, MLX5DV_OBJ_QP) != 0)
        throw std::runtime_error("mlx5dv_init_obj of a QP failed");
    queue_pairs_.push_back(queue_pair);
    return *queue_pair;
}

ibv_srq* Libmlx5Queues::add_shared_receive_queue(std::uint32_t max_wr, std::uint32_t max_sge) {
    ibv_srq_init_attr attributes{};
    attributes.attr.max_wr = max_wr;
    attributes.attr.max_sge = max_sge;
    srq_ = ibv_create_srq(device_.pd, &attributes);
    if (srq_ == nullptr) throw std::runtime_error("ibv_create_srq failed");
    return srq_;
}

mlx5dv_srq Libmlx5Queues::shared_receive_view() const {
    // mlx5dv_init_obj copies head and tail: read again after every call that moves them.
    mlx5dv_srq view{};
    mlx5dv_obj object{};
    object.srq.in = srq_;
    object.srq.out = &view;
    if (mlx5dv_init_obj(&object, MLX5DV_OBJ_SRQ) != 0)
        throw std::runtime_error("mlx5dv_init_obj of the SRQ failed");
    return view;
}

json Libmlx5Queues::post_receives(const QueuePair& qp, const std::vector<ReceiveSpec>& list) {
    ReceiveChain chain(list);
    ibv_recv_wr* bad = nullptr;
    const int result = ibv_post_recv(qp.qp, chain.wrs.data(), &bad);
    return post_step("ibv_post_recv", list, result, bad, chain);
}

json Libmlx5Queues::post_shared_receives(const std::vector<ReceiveSpec>& list) {
    ReceiveChain chain(list);
    ibv_recv_wr* bad = nullptr;
    const int result = ibv_post_srq_recv(srq_, chain.wrs.data(), &bad);
    return post_step("ibv_post_srq_recv", list, result, bad, chain);
}

json Libmlx5Queues::post_send(const QueuePair& qp, std::uint64_t wr_id) {
    ibv_sge sge{0x00007f1122334450, 0x40, 0x0a0b0c0d};
    ibv_send_wr wr{};
    wr.wr_id = wr_id;
    wr.opcode = IBV_WR_SEND;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    ibv_send_wr* bad = nullptr;
    const int result = ibv_post_send(qp.qp, &wr, &bad);
    json sg = {{"addr", hex_number(sge.addr)},
               {"length", hex_number(sge.length)},
               {"lkey", hex_number(sge.lkey)}};
    return {{"op", "ibv_post_send"},
            {"wr_list", json::array({{{"wr_id", hex_number(wr_id)},
                                      {"opcode", "IBV_WR_SEND"},
                                      {"send_flags", static_cast<int>(IBV_SEND_SIGNALED)},
                                      {"sg_list", json::array({sg})}}})},
            {"return_code", result}};
}

json Libmlx5Queues::write_and_poll(const std::vector<CqeSpec>& cqes, std::uint32_t ne,
                                   std::uint8_t poison, std::vector<ibv_wc>& wc) {
    json step = {{"op", "ibv_poll_cq"}, {"cqes_written", json::array()}, {"ne", ne}};
    for (std::size_t i = 0; i < cqes.size(); ++i) {
        const CqeSpec& spec = cqes[i];
        const std::uint32_t index = consumer_index_ + static_cast<std::uint32_t>(i);
        std::uint8_t* entry = static_cast<std::uint8_t*>(cq_.buf) +
                              static_cast<std::size_t>(index & (cq_.cqe_cnt - 1)) * cq_.cqe_size;
        std::uint8_t* cqe = entry + (cq_.cqe_size - 64);
        std::memset(entry, 0, cq_.cqe_size - 1);
        const bool error =
            spec.opcode == mlx5::kCqeRequesterError || spec.opcode == mlx5::kCqeResponderError;
        if (!error && spec.opcode != mlx5::kCqeRequester) {
            mlx5::store_big32(cqe + mlx5::kCqeFlagsRemoteQpn, 0x0500beef);
            mlx5::store_big16(cqe + mlx5::kCqeSlid, 0x0a0b);
            cqe[mlx5::kCqeMlPath] = 0x85;
            mlx5::store_big32(cqe + mlx5::kCqeImmediateInvalidatePkey, spec.immediate);
        }
        if (error) {
            cqe[mlx5::kCqeSyndrome] = spec.syndrome;
            cqe[mlx5::kCqeVendorSyndrome] = spec.vendor_syndrome;
        } else {
            mlx5::store_big32(cqe + mlx5::kCqeByteCount, spec.byte_count);
        }
        rdmachan::libmlx5_instructions::name_cqe(cqe, spec.user_index, spec.sop_drop_qpn,
                                                 spec.wqe_counter);
        const std::uint8_t owner = (index / cq_.cqe_cnt) & 1;
        std::atomic_ref<std::uint8_t>(cqe[mlx5::kCqeOpOwn])
            .store(static_cast<std::uint8_t>(spec.opcode << 4 | owner), std::memory_order_release);
        step["cqes_written"].push_back(cqe_written(index));
    }
    wc.assign(ne, ibv_wc{});
    std::memset(wc.data(), poison, wc.size() * sizeof(ibv_wc));
    const int result = ibv_poll_cq(device_.cq, static_cast<int>(ne), wc.data());
    if (result > 0) consumer_index_ += static_cast<std::uint32_t>(result);
    step["return_code"] = result;
    step["wc"] = json::array();
    for (int i = 0; i < result; ++i)
        step["wc"].push_back({{"index", i}, {"fields", completion_fields(wc[i], poison)}});
    return step;
}

json Libmlx5Queues::cq_inputs() const {
    return {{"cqn", hex_number(cq_.cqn)},
            {"ncqe", cq_.cqe_cnt},
            {"cqe_size", cq_.cqe_size},
            {"ibv_cq.cqe", device_.cq->cqe},
            {"cqe_version", 1}};
}

json Libmlx5Queues::cqe_written(std::uint32_t index) const {
    const std::uint32_t slot = index & (cq_.cqe_cnt - 1);
    const std::uint8_t* entry =
        static_cast<const std::uint8_t*>(cq_.buf) + static_cast<std::size_t>(slot) * cq_.cqe_size;
    return {{"cq_index", index},
            {"slot", slot},
            {"cqe_size", cq_.cqe_size},
            {"entry_hex", hex(entry, cq_.cqe_size)}};
}

json receive_queue_geometry(const QueuePair& qp) {
    std::uint32_t shift = 0;
    while ((1u << shift) < qp.dv.rq.stride) ++shift;
    const auto rq = reinterpret_cast<std::uintptr_t>(qp.dv.rq.buf);
    const auto sq = reinterpret_cast<std::uintptr_t>(qp.dv.sq.buf);
    const std::uint32_t max_gs = qp.dv.rq.stride / 16;
    return {{"qp_num", hex_number(qp.qp->qp_num)},
            {"user_index", qp.user_index},
            {"wqe_cnt", qp.dv.rq.wqe_cnt},
            {"wqe_shift", shift},
            {"stride_bytes", qp.dv.rq.stride},
            {"max_gs", max_gs},
            {"qp_state_max_gs", max_gs},
            {"max_post", qp.dv.rq.wqe_cnt},
            {"rq_offset_in_qp_buf", 0},
            {"sq_offset_in_qp_buf", sq - rq},
            {"wq_sig", 0}};
}

}  // namespace rdmachan::golden::capture
