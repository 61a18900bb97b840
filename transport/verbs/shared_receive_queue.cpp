#include "transport/verbs/shared_receive_queue.hpp"

#include <fmt/format.h>

#include <cerrno>

#include "transport/verbs/receive_posting.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

std::shared_ptr<SharedReceiveQueue> SharedReceiveQueue::create(std::shared_ptr<ProtectionDomain> pd,
                                                               std::uint32_t max_wr,
                                                               std::uint32_t max_sge) {
    ibv_srq_init_attr attributes{};
    attributes.attr.max_wr = max_wr;
    attributes.attr.max_sge = max_sge;
    errno = 0;
    ibv_srq* srq = ibv_create_srq(pd->handle(), &attributes);
    if (srq == nullptr) {
        throw_from_errno("ibv_create_srq", fmt::format("device '{}' max_wr {} max_sge {}",
                                                       pd->context()->name(), max_wr, max_sge));
    }
    // ibv_create_srq writes back what the provider granted.
    return std::shared_ptr<SharedReceiveQueue>(new SharedReceiveQueue(
        std::move(pd), srq, attributes.attr.max_wr, attributes.attr.max_sge));
}

SharedReceiveQueue::~SharedReceiveQueue() {
    ibv_destroy_srq(srq_);
}

mlx5::PostResult SharedReceiveQueue::post_receive(
    std::span<const mlx5::ReceiveWorkRequest> requests, std::uint32_t* posted) noexcept {
    return detail::post_receive_chunks(requests, max_sge_, posted,
                                       [this](ibv_recv_wr* first, ibv_recv_wr** bad) {
                                           return ibv_post_srq_recv(srq_, first, bad);
                                       });
}

std::shared_ptr<AddressHandle> AddressHandle::create(std::shared_ptr<ProtectionDomain> pd,
                                                     const ibv_ah_attr& attributes) {
    ibv_ah_attr copy = attributes;
    errno = 0;
    ibv_ah* ah = ibv_create_ah(pd->handle(), &copy);
    if (ah == nullptr) {
        throw_from_errno("ibv_create_ah",
                         fmt::format("device '{}' port {} dlid {} global {}", pd->context()->name(),
                                     attributes.port_num, attributes.dlid, attributes.is_global));
    }
    return std::shared_ptr<AddressHandle>(new AddressHandle(std::move(pd), ah));
}

AddressHandle::~AddressHandle() {
    ibv_destroy_ah(ah_);
}

}  // namespace rdmachan::verbs
