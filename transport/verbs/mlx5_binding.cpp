#include "transport/verbs/mlx5_binding.hpp"

#include <fmt/format.h>

#include <cerrno>

#include "common/logger.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

namespace {

constexpr std::uint32_t kSendQueueStride = 64;  // one WQEBB (mlx5-facts.md §3)

bool is_power_of_two(std::uint32_t value) {
    return value != 0 && (value & (value - 1)) == 0;
}

void require_power_of_two(std::uint32_t value, const char* what, std::uint32_t number) {
    if (!is_power_of_two(value)) {
        throw VerbsError(
            fmt::format("mlx5 ring mapping: {} {} of queue {:#x} is not a power of two", what,
                        value, number),
            EINVAL);
    }
}

}  // namespace

Mlx5QueuePairRings rings_from_mlx5dv(const mlx5dv_qp& qp, std::uint32_t qpn) {
    if (qp.sq.wqe_cnt != 0 && qp.sq.stride != kSendQueueStride) {
        throw VerbsError(
            fmt::format("mlx5 ring mapping: send stride {} of QP {:#x}, the data path needs 64",
                        qp.sq.stride, qpn),
            EINVAL);
    }
    if (qp.sq.wqe_cnt != 0) require_power_of_two(qp.sq.wqe_cnt, "send wqe_cnt", qpn);
    if (qp.rq.wqe_cnt != 0) {
        require_power_of_two(qp.rq.wqe_cnt, "receive wqe_cnt", qpn);
        require_power_of_two(qp.rq.stride, "receive stride", qpn);
    }
    Mlx5QueuePairRings rings;
    // dbrec is big-endian data the data path writes with its own byte-order helpers; the ring
    // descriptor carries it as plain 32-bit words.
    auto* doorbell_record = reinterpret_cast<std::uint32_t*>(qp.dbrec);
    rings.send.buffer = static_cast<std::uint8_t*>(qp.sq.buf);
    rings.send.wqe_count = qp.sq.wqe_cnt;
    rings.send.qpn = qpn;
    rings.send.doorbell_record = doorbell_record;
    rings.send.blueflame_register = static_cast<std::uint8_t*>(qp.bf.reg);
    rings.send.blueflame_size = qp.bf.size;  // 0: no BlueFlame, 8-byte doorbells only
    if (qp.rq.wqe_cnt != 0) {
        rings.receive.buffer = static_cast<std::uint8_t*>(qp.rq.buf);
        rings.receive.wqe_count = qp.rq.wqe_cnt;
        rings.receive.stride = qp.rq.stride;
        rings.receive.doorbell_record = doorbell_record;
    }
    return rings;
}

mlx5::CompletionQueueRing ring_from_mlx5dv(const mlx5dv_cq& cq) {
    require_power_of_two(cq.cqe_cnt, "cqe_cnt", cq.cqn);
    if (cq.cqe_size != 64 && cq.cqe_size != 128) {
        throw VerbsError(
            fmt::format("mlx5 ring mapping: CQE size {} of CQ {:#x}, expected 64 or 128",
                        cq.cqe_size, cq.cqn),
            EINVAL);
    }
    mlx5::CompletionQueueRing ring;
    ring.buffer = static_cast<std::uint8_t*>(cq.buf);
    ring.cqe_count = cq.cqe_cnt;
    ring.cqe_size = cq.cqe_size;
    ring.cqn = cq.cqn;
    ring.doorbell_record = reinterpret_cast<std::uint32_t*>(cq.dbrec);
    ring.uar = static_cast<std::uint8_t*>(cq.cq_uar);
    return ring;
}

mlx5::SharedReceiveQueueRing ring_from_mlx5dv(const mlx5dv_srq& srq, std::uint32_t wqe_count) {
    const std::uint32_t number = (srq.comp_mask & MLX5DV_SRQ_MASK_SRQN) ? srq.srqn : 0;
    require_power_of_two(wqe_count, "SRQ wqe count", number);
    require_power_of_two(srq.stride, "SRQ stride", number);
    mlx5::SharedReceiveQueueRing ring;
    ring.buffer = static_cast<std::uint8_t*>(srq.buf);
    ring.wqe_count = wqe_count;
    ring.stride = srq.stride;
    ring.srqn = number;
    ring.doorbell_record = reinterpret_cast<std::uint32_t*>(srq.dbrec);
    return ring;
}

std::shared_ptr<Mlx5ParentDomain> Mlx5ParentDomain::try_allocate(
    std::shared_ptr<ProtectionDomain> pd) {
    ibv_td_init_attr td_attributes{};
    errno = 0;
    ibv_td* td = ibv_alloc_td(pd->context()->handle(), &td_attributes);
    if (td == nullptr) {
        rdmachan::detail::logger().info("ibv_alloc_td on '{}': {}; QPs share BlueFlame registers",
                                        pd->context()->name(), describe_error_code(errno));
        return nullptr;
    }
    ibv_parent_domain_init_attr parent_attributes{};
    parent_attributes.pd = pd->handle();
    parent_attributes.td = td;
    errno = 0;
    ibv_pd* parent = ibv_alloc_parent_domain(pd->context()->handle(), &parent_attributes);
    if (parent == nullptr) {
        const int code = errno;
        ibv_dealloc_td(td);
        rdmachan::detail::logger().info(
            "ibv_alloc_parent_domain on '{}': {}; QPs share BlueFlame registers",
            pd->context()->name(), describe_error_code(code));
        return nullptr;
    }
    return std::shared_ptr<Mlx5ParentDomain>(new Mlx5ParentDomain(std::move(pd), td, parent));
}

Mlx5ParentDomain::~Mlx5ParentDomain() {
    // The parent domain references the thread domain: release it first.
    ibv_dealloc_pd(parent_);
    ibv_dealloc_td(td_);
}

std::string cqe_compression_refusal(const mlx5dv_cqe_comp_caps& caps, std::uint8_t format,
                                    const std::string& device) {
    if (caps.max_num == 0) {
        return fmt::format(
            "cqe_compression: device '{}' does not compress CQEs "
            "(mlx5dv_query_device: cqe_comp_caps.max_num 0)",
            device);
    }
    if ((caps.supported_format & format) == 0) {
        return fmt::format(
            "cqe_compression: device '{}' has no mini-CQE format {:#x} "
            "(mlx5dv_query_device: cqe_comp_caps.supported_format {:#x})",
            device, format, caps.supported_format);
    }
    return {};
}

namespace {

// mlx5dv_query_device's CQE compression capabilities; a device that does not answer them is
// one without compression.
mlx5dv_cqe_comp_caps query_cqe_compression(Context& context) {
    mlx5dv_context attributes{};
    attributes.comp_mask = MLX5DV_CONTEXT_MASK_CQE_COMPRESION;
    if (mlx5dv_query_device(context.handle(), &attributes) != 0 ||
        (attributes.comp_mask & MLX5DV_CONTEXT_MASK_CQE_COMPRESION) == 0) {
        return {};
    }
    return attributes.cqe_comp_caps;
}

}  // namespace

Mlx5CompletionQueue create_mlx5_completion_queue(std::shared_ptr<Context> context,
                                                 std::uint32_t depth,
                                                 std::uint8_t compression_format) {
    mlx5dv_cq_init_attr dv_attributes{};  // comp_mask 0: no CQE compression, default CQE size
    if (compression_format != 0) {
        const std::string refusal = cqe_compression_refusal(query_cqe_compression(*context),
                                                            compression_format, context->name());
        if (!refusal.empty()) throw VerbsError(refusal, EOPNOTSUPP);
        dv_attributes.comp_mask = MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE;
        dv_attributes.cqe_comp_res_format = compression_format;
    }
    // A channel of its own: the CQ's events, and only its, make the descriptor readable.
    std::shared_ptr<CompletionChannel> channel = CompletionChannel::try_create(context);
    ibv_cq_init_attr_ex attributes{};
    attributes.cqe = depth;
    attributes.channel = channel != nullptr ? channel->handle() : nullptr;
    attributes.wc_flags = IBV_WC_STANDARD_FLAGS;
    errno = 0;
    ibv_cq_ex* cq_ex = mlx5dv_create_cq(context->handle(), &attributes, &dv_attributes);
    if (cq_ex == nullptr) {
        throw_from_errno("mlx5dv_create_cq",
                         fmt::format("device '{}' depth {}", context->name(), depth));
    }
    ibv_cq* cq = ibv_cq_ex_to_cq(cq_ex);
    std::shared_ptr<CompletionQueue> owner =
        CompletionQueue::adopt(context, cq, nullptr, std::move(channel));
    mlx5dv_cq dv_cq{};
    mlx5dv_obj object{};
    object.cq.in = cq;
    object.cq.out = &dv_cq;
    check_return_code(mlx5dv_init_obj(&object, MLX5DV_OBJ_CQ), "mlx5dv_init_obj(CQ)",
                      fmt::format("CQ on device '{}'", context->name()));
    mlx5::CompletionQueueRing ring = ring_from_mlx5dv(dv_cq);
    ring.compressed_cqes = compression_format != 0;
    return {std::move(owner), ring};
}

mlx5::SharedReceiveQueueRing mlx5_shared_receive_queue_ring(const SharedReceiveQueue& queue) {
    const std::string object =
        fmt::format("SRQ on device '{}'", queue.protection_domain()->context()->name());
    ibv_srq_attr attributes{};
    check_return_code(ibv_query_srq(queue.handle(), &attributes), "ibv_query_srq", object);
    mlx5dv_srq dv_srq{};
    mlx5dv_obj object_description{};
    object_description.srq.in = queue.handle();
    object_description.srq.out = &dv_srq;
    check_return_code(mlx5dv_init_obj(&object_description, MLX5DV_OBJ_SRQ), "mlx5dv_init_obj(SRQ)",
                      object);
    return ring_from_mlx5dv(dv_srq, attributes.max_wr + 1);
}

Mlx5QueuePair create_mlx5_queue_pair(QueuePairParents parents,
                                     const QueuePairCapabilities& capabilities,
                                     std::shared_ptr<Mlx5ParentDomain> parent_domain,
                                     bool scatter_to_cqe) {
    if (!parents.protection_domain || !parents.send_completion_queue ||
        !parents.receive_completion_queue) {
        throw VerbsError(
            "create mlx5 queue pair: protection domain and both completion queues are required",
            EINVAL);
    }
    const std::shared_ptr<Context>& context = parents.protection_domain->context();
    ibv_qp_init_attr_ex attributes{};
    attributes.qp_type = IBV_QPT_RC;
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD;
    attributes.pd = parent_domain ? parent_domain->handle() : parents.protection_domain->handle();
    attributes.send_cq = parents.send_completion_queue->handle();
    attributes.recv_cq = parents.receive_completion_queue->handle();
    attributes.srq =
        parents.shared_receive_queue ? parents.shared_receive_queue->handle() : nullptr;
    attributes.cap.max_send_wr = capabilities.max_send_wr;
    attributes.cap.max_recv_wr = attributes.srq != nullptr ? 0 : capabilities.max_recv_wr;
    attributes.cap.max_send_sge = capabilities.max_send_sge;
    attributes.cap.max_recv_sge = attributes.srq != nullptr ? 0 : capabilities.max_recv_sge;
    attributes.cap.max_inline_data = capabilities.max_inline_data;
    // Requests are signaled one by one; ALLOW_SCATTER_TO_CQE reaches the requester without it.
    attributes.sq_sig_all = 0;
    mlx5dv_qp_init_attr dv_attributes{};
    dv_attributes.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_QP_CREATE_FLAGS;
    dv_attributes.create_flags = scatter_to_cqe ? MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE
                                                : MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE;
    errno = 0;
    ibv_qp* qp = mlx5dv_create_qp(context->handle(), &attributes, &dv_attributes);
    if (qp == nullptr) {
        throw_from_errno(
            "mlx5dv_create_qp",
            fmt::format(
                "RC QP on device '{}' (max_send_wr {} max_send_sge {}{})", context->name(),
                capabilities.max_send_wr, capabilities.max_send_sge,
                scatter_to_cqe ? " scatter_to_cqe: MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE" : ""));
    }
    const QueuePairCapabilities granted{attributes.cap.max_send_wr, attributes.cap.max_recv_wr,
                                        attributes.cap.max_send_sge, attributes.cap.max_recv_sge,
                                        attributes.cap.max_inline_data};
    if (parent_domain) parents.keep_alive = parent_domain;
    std::shared_ptr<QueuePair> owner = QueuePair::adopt(std::move(parents), qp, granted);
    mlx5dv_qp dv_qp{};
    mlx5dv_obj object{};
    object.qp.in = qp;
    object.qp.out = &dv_qp;
    check_return_code(mlx5dv_init_obj(&object, MLX5DV_OBJ_QP), "mlx5dv_init_obj(QP)",
                      owner->describe());
    Mlx5QueuePairRings rings = rings_from_mlx5dv(dv_qp, qp->qp_num);
    return {std::move(owner), rings};
}

}  // namespace rdmachan::verbs
