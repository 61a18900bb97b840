// The software device's DC objects behind the transport interface: DC initiators on the ring
// family's send path, a DC target fed by a shared receive queue, and address vectors built from a
// peer's GID and LID as the software device reads them.
#pragma once

#include <memory>

#include "transport/device_interface.hpp"
#include "transport/provider/mlx5_ring_queues.hpp"
#include "transport/soft/device.hpp"

namespace rdmachan::transport::soft_dc {

std::shared_ptr<QueuePair> create_initiator(const std::shared_ptr<soft::Device>& device,
                                            const std::shared_ptr<soft::ProtectionDomain>& domain,
                                            const QueuePairSettings& settings,
                                            std::shared_ptr<RingCompletionQueue> send_queue);
void recover_initiator(QueuePair& initiator);
std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(const std::shared_ptr<soft::Device>& device,
                                                                const std::shared_ptr<soft::ProtectionDomain>& domain,
                                                                std::uint32_t max_wr,
                                                                std::shared_ptr<RingCompletionQueue> receive_queue);
std::shared_ptr<DcTarget> create_target(const std::shared_ptr<soft::Device>& device,
                                        const std::shared_ptr<soft::ProtectionDomain>& domain,
                                        std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                        std::shared_ptr<RingCompletionQueue> receive_queue, std::uint64_t access_key,
                                        std::uint32_t soft_access);
std::array<std::uint8_t, 48> address_vector(const Gid& gid, std::uint16_t lid, std::uint32_t dctn, std::uint64_t key);

}  // namespace rdmachan::transport::soft_dc
