// The mlx5 DC control plane on hardware: DC initiators and DC targets created through
// mlx5dv_create_qp (IBV_QPT_DRIVER), their transitions (dc_connection.hpp), the DCT number
// read only after RTR, and a peer's 48-byte address vector taken from an address handle with
// mlx5dv_init_obj. Runs only on a ConnectX; elsewhere every entry point fails with an error
// saying DC needs an mlx5 device (soft-RoCE in the VM tests that).
#pragma once

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <array>
#include <cstdint>
#include <memory>

#include "transport/mlx5/rings.hpp"
#include "transport/verbs/connection.hpp"
#include "transport/verbs/mlx5_binding.hpp"
#include "transport/verbs/queue_pair.hpp"
#include "transport/verbs/shared_receive_queue.hpp"

namespace rdmachan::verbs {

// Throws VerbsError (EOPNOTSUPP) naming the device when it is not driven by libmlx5: DC is an
// mlx5 transport, and nothing else in verbs offers it.
void require_dc_support(const Context& context);

// The send operations a DCI is created for: only what the data path posts, so libmlx5 does not
// reserve room in every WQE for bind-memory-window or UMR segments (mlx5-facts.md §2).
std::uint64_t dc_initiator_send_operations() noexcept;

struct Mlx5DcInitiator {
    std::shared_ptr<QueuePair> queue_pair;  // modify() with the make_dc_initiator_* transitions
    mlx5::SendQueueRing send;
};

// parents: protection domain and the send completion queue (verbs also requires a receive
// CQ: the send CQ is passed for both, as UCX does). RESET state on return.
Mlx5DcInitiator create_mlx5_dc_initiator(QueuePairParents parents, const QueuePairCapabilities& capabilities,
                                         std::shared_ptr<Mlx5ParentDomain> parent_domain);
// RESET -> INIT -> RTR -> RTS, also the recovery path after RESET (the caller purges the
// DCI's CQEs and restarts its producer index at 0 before posting again).
void connect_dc_initiator(QueuePair& initiator, const ConnectionParameters& parameters);

class Mlx5DcTarget {
  public:
    // parents: protection domain, shared receive queue and receive completion queue (required;
    // the send CQ may be the receive CQ: a DCT never sends but the kernel wants a valid one).
    static std::shared_ptr<Mlx5DcTarget> create(QueuePairParents parents, std::uint64_t access_key);
    // RESET -> INIT -> RTR. Only after this is the DCT number known.
    void connect(const ConnectionParameters& parameters);
    // The DCT number initiators address. Throws VerbsError before connect() succeeded.
    std::uint32_t number() const;
    std::uint64_t access_key() const noexcept { return access_key_; }
    QueuePair& queue_pair() const noexcept { return *queue_pair_; }

  private:
    Mlx5DcTarget(std::shared_ptr<QueuePair> queue_pair, std::uint64_t access_key)
        : queue_pair_(std::move(queue_pair)), access_key_(access_key) {}
    std::shared_ptr<QueuePair> queue_pair_;
    std::uint64_t access_key_;
    bool ready_ = false;
};

// The base address vector (48 bytes, as libmlx5 built it for this address handle) that
// make_dc_address_vector completes with the DCT number and key. The handle must outlive no
// one: the bytes are copied.
std::array<std::uint8_t, 48> address_vector_of(const AddressHandle& handle, const std::string& device_name);

}  // namespace rdmachan::verbs
