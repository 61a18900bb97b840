// DC on a ConnectX behind the transport interface: DC initiators on the ring family's send path
// (created by transport/verbs/mlx5_dc), a shared receive queue driven through its ring, a DC
// target whose receive CQEs the ring CQ routes to that ring, and address vectors taken from
// address handles. Compiled and reviewed here; it runs only on mlx5 hardware.
#pragma once

#include <memory>

#include "transport/device_interface.hpp"
#include "transport/provider/mlx5_ring_queues.hpp"
#include "transport/verbs/completion_queue.hpp"
#include "transport/verbs/mlx5_binding.hpp"
#include "transport/verbs/protection_domain.hpp"

namespace rdmachan::transport {

// The verbs owner of a ring CQ on a ConnectX: kept alive by the ring queue's owner pointer.
struct Mlx5CompletionQueueOwner {
    std::shared_ptr<verbs::CompletionQueue> queue;
};

}  // namespace rdmachan::transport

namespace rdmachan::transport::mlx5_dc {


std::shared_ptr<QueuePair> create_initiator(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                            const std::shared_ptr<verbs::Mlx5ParentDomain>& parent_domain,
                                            const QueuePairSettings& settings,
                                            std::shared_ptr<RingCompletionQueue> send_queue);
void recover_initiator(QueuePair& initiator);
std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                                                std::uint32_t max_wr);
std::shared_ptr<DcTarget> create_target(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                        std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                        std::shared_ptr<RingCompletionQueue> receive_queue, std::uint64_t access_key,
                                        unsigned access);
std::array<std::uint8_t, 48> address_vector(const std::shared_ptr<verbs::ProtectionDomain>& domain,
                                            const PortIdentity& local, const Gid& gid, std::uint16_t lid,
                                            std::uint32_t dctn, std::uint64_t key);

}  // namespace rdmachan::transport::mlx5_dc
