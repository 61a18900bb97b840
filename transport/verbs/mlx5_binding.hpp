// The mlx5 hardware binding: on a ConnectX, queue pairs and completion queues are created
// through mlx5dv so that the direct data path (transport/mlx5) can drive their rings, and
// mlx5dv_init_obj supplies the ring descriptors. Runs only on mlx5 hardware; the mapping
// functions are pure and unit-tested with filled-in mlx5dv structs.
#pragma once

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>

#include "transport/mlx5/rings.hpp"
#include "transport/verbs/queue_pair.hpp"

namespace rdmachan::verbs {

struct Mlx5QueuePairRings {
    mlx5::SendQueueRing send;
    mlx5::ReceiveQueueRing receive;  // empty (wqe_count 0) when the QP uses an SRQ
};

// Pure mappings. Throw VerbsError when the layout is not one the data path supports
// (send stride other than 64 B, counts or strides that are not powers of two).
Mlx5QueuePairRings rings_from_mlx5dv(const mlx5dv_qp& qp, std::uint32_t qpn);
mlx5::CompletionQueueRing ring_from_mlx5dv(const mlx5dv_cq& cq);
// mlx5dv_srq has no entry count, and the max_wr ibv_create_srq hands back is not it either:
// libmlx5 appends a "wait queue" to the ring and reports only the application's share
// (rdma-core providers/mlx5/verbs.c mlx5_create_srq). The caller passes the real count.
mlx5::SharedReceiveQueueRing ring_from_mlx5dv(const mlx5dv_srq& srq, std::uint32_t wqe_count);

// A thread domain and the parent domain over it. Creating QPs in a parent domain with a
// thread domain makes libmlx5 give them a dedicated BlueFlame register instead of sharing
// one of the context's 16 (mlx5-facts.md §9 pitfall 3: concurrent BF writes corrupt).
class Mlx5ParentDomain {
  public:
    // Returns null (and logs why) when the provider cannot allocate a thread domain; callers
    // then create the QP in the plain protection domain and share BlueFlame registers.
    static std::shared_ptr<Mlx5ParentDomain> try_allocate(std::shared_ptr<ProtectionDomain> pd);
    ~Mlx5ParentDomain();
    Mlx5ParentDomain(const Mlx5ParentDomain&) = delete;
    Mlx5ParentDomain& operator=(const Mlx5ParentDomain&) = delete;
    ibv_pd* handle() const noexcept { return parent_; }

  private:
    Mlx5ParentDomain(std::shared_ptr<ProtectionDomain> pd, ibv_td* td, ibv_pd* parent)
        : pd_(std::move(pd)), td_(td), parent_(parent) {}
    std::shared_ptr<ProtectionDomain> pd_;
    ibv_td* td_;
    ibv_pd* parent_;
};

struct Mlx5CompletionQueue {
    std::shared_ptr<CompletionQueue> completion_queue;
    mlx5::CompletionQueueRing ring;
};

struct Mlx5QueuePair {
    std::shared_ptr<QueuePair> queue_pair;  // connect() works as for any verbs QP
    Mlx5QueuePairRings rings;
};

// Why a device whose mlx5dv_query_device answered `caps` cannot compress CQEs in the mini-CQE
// format `format` (one MLX5DV_CQE_RES_FORMAT_* bit), naming the setting and the device; empty
// when it can. Pure, so that it is tested with filled-in caps.
std::string cqe_compression_refusal(const mlx5dv_cqe_comp_caps& caps, std::uint8_t format,
                                    const std::string& device);

// mlx5dv_create_cq with a completion channel of its own (none, and the reason logged, where the
// device gives none), then mlx5dv_init_obj; the ring names the UAR page whose CQ doorbell an arm
// writes (cq_uar). `compression_format` 0: plain 64-B CQEs; else one MLX5DV_CQE_RES_FORMAT_*
// bit: MLX5DV_CQ_INIT_ATTR_MASK_COMPRESSED_CQE with that cqe_comp_res_format, after
// mlx5dv_query_device's cqe_comp_caps said the device has it (VerbsError naming the setting if
// not), and the ring marked compressed_cqes so that the poller unpacks sessions.
// After this the CQ is DV-owned: poll and arm it through the ring only (mlx5-facts.md §9
// pitfall 7); take its events with CompletionQueue::take_event.
Mlx5CompletionQueue create_mlx5_completion_queue(std::shared_ptr<Context> context,
                                                 std::uint32_t depth,
                                                 std::uint8_t compression_format = 0);

// mlx5dv_init_obj on an SRQ. The ring's entry count is ibv_query_srq's max_wr + 1: libmlx5
// told the kernel max_wr = ring size - 1 at creation (wait queue included), and the kernel
// reports that value back, whereas ibv_create_srq's answer excludes the wait queue.
mlx5::SharedReceiveQueueRing mlx5_shared_receive_queue_ring(const SharedReceiveQueue& queue);

// mlx5dv_create_qp in the parent domain when one is given, then mlx5dv_init_obj for the rings.
// Without `scatter_to_cqe`, MLX5DV_QP_CREATE_DISABLE_SCATTER_TO_CQE: small reads and receives
// land in the buffers, never inside CQEs (mlx5dv's default would put them there:
// mlx5-facts.md §9 pitfall 2). With it, MLX5DV_QP_CREATE_ALLOW_SCATTER_TO_CQE: responder and
// requester both, the requester's although the QP does not signal every request (mlx5dv's
// default turns the requester's on only with sq_sig_all); the poller then copies a CQE's data
// to the WQE's buffers (CompletionTarget::scatter_to_cqe).
Mlx5QueuePair create_mlx5_queue_pair(QueuePairParents parents,
                                     const QueuePairCapabilities& capabilities,
                                     std::shared_ptr<Mlx5ParentDomain> parent_domain,
                                     bool scatter_to_cqe = false);

}  // namespace rdmachan::verbs
