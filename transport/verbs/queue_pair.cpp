#include "transport/verbs/queue_pair.hpp"

#include <fmt/format.h>

#include <cerrno>

#include "transport/verbs/receive_posting.hpp"
#include "transport/verbs/verbs_error.hpp"
#include "transport/verbs/work_request_translation.hpp"

namespace rdmachan::verbs {

namespace {

void require_parents(const QueuePairParents& parents) {
    if (!parents.protection_domain || !parents.send_completion_queue ||
        !parents.receive_completion_queue) {
        throw VerbsError(
            "create queue pair: protection domain and both completion queues are required", EINVAL);
    }
}

}  // namespace

std::shared_ptr<QueuePair> QueuePair::create_reliable_connected(
    QueuePairParents parents, const QueuePairCapabilities& capabilities) {
    require_parents(parents);
    ibv_qp_init_attr attributes{};
    attributes.qp_type = IBV_QPT_RC;
    attributes.send_cq = parents.send_completion_queue->handle();
    attributes.recv_cq = parents.receive_completion_queue->handle();
    attributes.srq =
        parents.shared_receive_queue ? parents.shared_receive_queue->handle() : nullptr;
    attributes.cap.max_send_wr = capabilities.max_send_wr;
    attributes.cap.max_recv_wr = attributes.srq != nullptr ? 0 : capabilities.max_recv_wr;
    attributes.cap.max_send_sge = capabilities.max_send_sge;
    attributes.cap.max_recv_sge = attributes.srq != nullptr ? 0 : capabilities.max_recv_sge;
    attributes.cap.max_inline_data = capabilities.max_inline_data;
    // Completions only for requests that ask (kSendSignaled): the channel layer decides.
    attributes.sq_sig_all = 0;
    errno = 0;
    ibv_qp* qp = ibv_create_qp(parents.protection_domain->handle(), &attributes);
    if (qp == nullptr) {
        throw_from_errno(
            "ibv_create_qp",
            fmt::format("RC QP on device '{}' (max_send_wr {} max_recv_wr {} max_send_sge {} "
                        "max_recv_sge {} max_inline_data {})",
                        parents.protection_domain->context()->name(), capabilities.max_send_wr,
                        capabilities.max_recv_wr, capabilities.max_send_sge,
                        capabilities.max_recv_sge, capabilities.max_inline_data));
    }
    // ibv_create_qp writes back the granted capabilities, which may exceed the request.
    QueuePairCapabilities granted{attributes.cap.max_send_wr, attributes.cap.max_recv_wr,
                                  attributes.cap.max_send_sge, attributes.cap.max_recv_sge,
                                  attributes.cap.max_inline_data};
    return std::shared_ptr<QueuePair>(new QueuePair(std::move(parents), qp, granted));
}

std::shared_ptr<QueuePair> QueuePair::adopt(QueuePairParents parents, ibv_qp* qp,
                                            const QueuePairCapabilities& granted) {
    require_parents(parents);
    return std::shared_ptr<QueuePair>(new QueuePair(std::move(parents), qp, granted));
}

QueuePair::~QueuePair() {
    ibv_destroy_qp(qp_);
}

std::string QueuePair::describe() const {
    return fmt::format("QP {:#x} on {}", qp_->qp_num,
                       parents_.protection_domain->context()->name());
}

void QueuePair::modify(const QueuePairTransition& transition, const char* transition_name) {
    ibv_qp_attr attributes = transition.attributes;
    const int return_code = ibv_modify_qp(qp_, &attributes, transition.mask);
    if (return_code == 0) return;
    const int code = return_code < 0 ? -return_code : return_code;
    std::string hint;
    if (code == ETIMEDOUT && transition.attributes.qp_state == IBV_QPS_RTR) {
        hint =
            " (RoCE address resolution for the destination GID timed out: is it reachable from the "
            "source "
            "GID's interface?)";
    }
    throw VerbsError(
        fmt::format("ibv_modify_qp {} failed on {} (remote QPN {:#x}, mask {:#x}): returned {}{}",
                    transition_name, describe(), transition.attributes.dest_qp_num, transition.mask,
                    describe_error_code(code), hint),
        code);
}

void QueuePair::connect(const ConnectionParameters& parameters, const RcEndpoint& remote) {
    modify(make_init_transition(parameters), "RESET->INIT");
    QueuePairTransition ready_to_receive = make_ready_to_receive_transition(parameters, remote);
    modify(ready_to_receive, "INIT->RTR");
    modify(make_ready_to_send_transition(parameters), "RTR->RTS");
}

ibv_qp_state QueuePair::state() const {
    ibv_qp_attr attributes{};
    ibv_qp_init_attr init_attributes{};
    check_return_code(ibv_query_qp(qp_, &attributes, IBV_QP_STATE, &init_attributes),
                      "ibv_query_qp", describe());
    return attributes.qp_state;
}

mlx5::PostResult QueuePair::post_send(std::span<const mlx5::SendWorkRequest> requests,
                                      std::uint32_t* posted) noexcept {
    ibv_send_wr work_requests[detail::kRequestsPerChunk];
    ibv_sge elements[detail::kElementsPerChunk];
    std::size_t done = 0;
    mlx5::PostResult result = mlx5::PostResult::ok;
    while (done < requests.size() && result == mlx5::PostResult::ok) {
        std::size_t count = 0;
        std::size_t used_elements = 0;
        while (done + count < requests.size() && count < detail::kRequestsPerChunk) {
            const mlx5::SendWorkRequest& request = requests[done + count];
            if (request.num_sge > capabilities_.max_send_sge ||
                request.num_sge > detail::kElementsPerChunk) {
                result = mlx5::PostResult::too_many_sge;
                break;
            }
            if (used_elements + request.num_sge > detail::kElementsPerChunk) break;
            if ((request.flags & mlx5::kSendInline) != 0) {
                std::uint64_t inline_length = 0;
                for (std::uint32_t i = 0; i < request.num_sge; ++i)
                    inline_length += request.sg_list[i].length;
                if (inline_length > capabilities_.max_inline_data) {
                    result = mlx5::PostResult::inline_too_large;
                    break;
                }
            }
            ibv_send_wr& out = work_requests[count];
            if (!to_ibv_send_wr(request, out)) {
                result = mlx5::PostResult::invalid_request;
                break;
            }
            out.sg_list = elements + used_elements;
            out.num_sge = static_cast<int>(request.num_sge);
            for (std::uint32_t i = 0; i < request.num_sge; ++i)
                to_ibv_sge(request.sg_list[i], elements[used_elements++]);
            if (count > 0) work_requests[count - 1].next = &out;
            ++count;
        }
        if (count == 0) break;
        ibv_send_wr* bad = nullptr;
        const int code = ibv_post_send(qp_, work_requests, &bad);
        if (code != 0) {
            done += bad != nullptr ? static_cast<std::size_t>(bad - work_requests) : 0;
            result = detail::result_from_post_error(code);
            break;
        }
        done += count;
    }
    if (posted != nullptr) *posted = static_cast<std::uint32_t>(done);
    return result;
}

mlx5::PostResult QueuePair::post_receive(std::span<const mlx5::ReceiveWorkRequest> requests,
                                         std::uint32_t* posted) noexcept {
    if (parents_.shared_receive_queue) {
        if (posted != nullptr) *posted = 0;
        return mlx5::PostResult::invalid_request;  // receives go to the shared receive queue
    }
    return detail::post_receive_chunks(
        requests, capabilities_.max_recv_sge, posted,
        [this](ibv_recv_wr* first, ibv_recv_wr** bad) { return ibv_post_recv(qp_, first, bad); });
}

}  // namespace rdmachan::verbs
