#include "transport/verbs/mlx5_dc.hpp"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>

#include "transport/verbs/context.hpp"
#include "transport/verbs/dc_connection.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

void require_dc_support(const Context& context) {
    if (!mlx5dv_is_supported(context.handle()->device)) {
        throw VerbsError(fmt::format("DC (dynamically connected) mode needs an mlx5 device (ConnectX); "
                                     "device '{}' is not driven by libmlx5",
                                     context.name()),
                         EOPNOTSUPP);
    }
}

std::uint64_t dc_initiator_send_operations() noexcept {
    return IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM | IBV_QP_EX_WITH_SEND |
           IBV_QP_EX_WITH_SEND_WITH_IMM | IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
           IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;
}

Mlx5DcInitiator create_mlx5_dc_initiator(QueuePairParents parents, const QueuePairCapabilities& capabilities,
                                         std::shared_ptr<Mlx5ParentDomain> parent_domain) {
    if (!parents.protection_domain || !parents.send_completion_queue) {
        throw VerbsError("create DC initiator: a protection domain and a send completion queue are required", EINVAL);
    }
    const std::shared_ptr<Context>& context = parents.protection_domain->context();
    require_dc_support(*context);
    if (!parents.receive_completion_queue) parents.receive_completion_queue = parents.send_completion_queue;
    ibv_qp_init_attr_ex attributes{};
    attributes.qp_type = IBV_QPT_DRIVER;
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS;
    attributes.send_ops_flags = dc_initiator_send_operations();
    attributes.pd = parent_domain ? parent_domain->handle() : parents.protection_domain->handle();
    attributes.send_cq = parents.send_completion_queue->handle();
    attributes.recv_cq = parents.receive_completion_queue->handle();
    attributes.cap.max_send_wr = capabilities.max_send_wr;
    attributes.cap.max_send_sge = capabilities.max_send_sge;
    attributes.cap.max_inline_data = capabilities.max_inline_data;
    attributes.sq_sig_all = 0;
    mlx5dv_qp_init_attr dv_attributes{};
    dv_attributes.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
    dv_attributes.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCI;
    errno = 0;
    ibv_qp* qp = mlx5dv_create_qp(context->handle(), &attributes, &dv_attributes);
    if (qp == nullptr) {
        throw_from_errno("mlx5dv_create_qp", fmt::format("DC initiator on device '{}' (max_send_wr {} max_send_sge {})",
                                                         context->name(), capabilities.max_send_wr,
                                                         capabilities.max_send_sge));
    }
    const QueuePairCapabilities granted{attributes.cap.max_send_wr, 0, attributes.cap.max_send_sge, 0,
                                        attributes.cap.max_inline_data};
    if (parent_domain) parents.keep_alive = parent_domain;
    std::shared_ptr<QueuePair> owner = QueuePair::adopt(std::move(parents), qp, granted);
    mlx5dv_qp dv_qp{};
    mlx5dv_obj object{};
    object.qp.in = qp;
    object.qp.out = &dv_qp;
    check_return_code(mlx5dv_init_obj(&object, MLX5DV_OBJ_QP), "mlx5dv_init_obj(DCI)", owner->describe());
    return {std::move(owner), rings_from_mlx5dv(dv_qp, qp->qp_num).send};
}

void connect_dc_initiator(QueuePair& initiator, const ConnectionParameters& parameters) {
    initiator.modify(make_dc_initiator_init_transition(parameters), "DCI RESET->INIT");
    initiator.modify(make_dc_initiator_ready_to_receive_transition(parameters), "DCI INIT->RTR");
    initiator.modify(make_dc_initiator_ready_to_send_transition(parameters), "DCI RTR->RTS");
}

std::shared_ptr<Mlx5DcTarget> Mlx5DcTarget::create(QueuePairParents parents, std::uint64_t access_key) {
    if (!parents.protection_domain || !parents.shared_receive_queue || !parents.receive_completion_queue) {
        throw VerbsError(
            "create DC target: a protection domain, a shared receive queue and a receive completion queue are "
            "required",
            EINVAL);
    }
    const std::shared_ptr<Context>& context = parents.protection_domain->context();
    require_dc_support(*context);
    if (!parents.send_completion_queue) parents.send_completion_queue = parents.receive_completion_queue;
    ibv_qp_init_attr_ex attributes{};
    attributes.qp_type = IBV_QPT_DRIVER;
    attributes.comp_mask = IBV_QP_INIT_ATTR_PD;
    attributes.pd = parents.protection_domain->handle();
    attributes.send_cq = parents.send_completion_queue->handle();
    attributes.recv_cq = parents.receive_completion_queue->handle();
    attributes.srq = parents.shared_receive_queue->handle();
    mlx5dv_qp_init_attr dv_attributes{};
    dv_attributes.comp_mask = MLX5DV_QP_INIT_ATTR_MASK_DC;
    dv_attributes.dc_init_attr.dc_type = MLX5DV_DCTYPE_DCT;
    dv_attributes.dc_init_attr.dct_access_key = access_key;
    errno = 0;
    ibv_qp* qp = mlx5dv_create_qp(context->handle(), &attributes, &dv_attributes);
    if (qp == nullptr) {
        throw_from_errno("mlx5dv_create_qp", fmt::format("DC target on device '{}'", context->name()));
    }
    std::shared_ptr<QueuePair> owner = QueuePair::adopt(std::move(parents), qp, QueuePairCapabilities{});
    return std::shared_ptr<Mlx5DcTarget>(new Mlx5DcTarget(std::move(owner), access_key));
}

void Mlx5DcTarget::connect(const ConnectionParameters& parameters) {
    queue_pair_->modify(make_dc_target_init_transition(parameters), "DCT RESET->INIT");
    queue_pair_->modify(make_dc_target_ready_to_receive_transition(parameters), "DCT INIT->RTR");
    // libmlx5 replaces qp_num with the number the firmware assigned at RTR (rdma-core
    // verbs.c, mlx5_modify_qp for DCT): before this point it is not the DCT number.
    ready_ = true;
}

std::uint32_t Mlx5DcTarget::number() const {
    if (!ready_) {
        throw VerbsError(fmt::format("DC target {}: the DCT number exists only after INIT->RTR", queue_pair_->describe()),
                         EINVAL);
    }
    return queue_pair_->qpn();
}

std::array<std::uint8_t, 48> address_vector_of(const AddressHandle& handle, const std::string& device_name) {
    mlx5dv_ah dv_ah{};
    mlx5dv_obj object{};
    object.ah.in = handle.handle();
    object.ah.out = &dv_ah;
    check_return_code(mlx5dv_init_obj(&object, MLX5DV_OBJ_AH), "mlx5dv_init_obj(AH)",
                      fmt::format("address handle on device '{}'", device_name));
    std::array<std::uint8_t, 48> vector{};
    static_assert(sizeof(mlx5_wqe_av) == 48, "the mlx5 address vector is 48 bytes");
    std::memcpy(vector.data(), dv_ah.av, vector.size());
    return vector;
}

}  // namespace rdmachan::verbs
