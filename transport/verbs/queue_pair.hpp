// A reliable-connected queue pair: creation, the INIT -> RTR -> RTS connect sequence, and the
// generic verbs data path (ibv_post_send / ibv_post_recv) over the project's work requests.
// Keeps its protection domain, completion queues and shared receive queue alive.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "transport/mlx5/work_request.hpp"
#include "transport/verbs/completion_queue.hpp"
#include "transport/verbs/connection.hpp"
#include "transport/verbs/protection_domain.hpp"
#include "transport/verbs/shared_receive_queue.hpp"

namespace rdmachan::verbs {

struct QueuePairCapabilities {
    std::uint32_t max_send_wr = 64;
    std::uint32_t max_recv_wr = 64;  // ignored with a shared receive queue
    std::uint32_t max_send_sge = 1;
    std::uint32_t max_recv_sge = 1;
    std::uint32_t max_inline_data = 0;
};

// Everything a queue pair depends on; it outlives none of them.
struct QueuePairParents {
    std::shared_ptr<ProtectionDomain> protection_domain;
    std::shared_ptr<CompletionQueue> send_completion_queue;
    std::shared_ptr<CompletionQueue> receive_completion_queue;
    std::shared_ptr<SharedReceiveQueue> shared_receive_queue;  // may be null
    std::shared_ptr<const void> keep_alive;  // e.g. an mlx5 parent domain; may be null
};

class QueuePair {
  public:
    // Throws VerbsError naming the device and capabilities when ibv_create_qp fails.
    static std::shared_ptr<QueuePair> create_reliable_connected(
        QueuePairParents parents, const QueuePairCapabilities& capabilities);
    // Takes ownership of a queue pair created elsewhere (mlx5dv_create_qp).
    static std::shared_ptr<QueuePair> adopt(QueuePairParents parents, ibv_qp* qp,
                                            const QueuePairCapabilities& granted);
    ~QueuePair();
    QueuePair(const QueuePair&) = delete;
    QueuePair& operator=(const QueuePair&) = delete;

    ibv_qp* handle() const noexcept { return qp_; }
    std::uint32_t qpn() const noexcept { return qp_->qp_num; }
    const QueuePairCapabilities& capabilities() const noexcept { return capabilities_; }
    const QueuePairParents& parents() const noexcept { return parents_; }
    // "QP 0x11 on rxe0": for error messages.
    std::string describe() const;

    // RESET -> INIT -> RTR -> RTS. Throws VerbsError naming the transition, this QP, the
    // remote QPN and the return code of ibv_modify_qp (which returns the error, not errno).
    void connect(const ConnectionParameters& parameters, const RcEndpoint& remote);
    // One transition, for tests and recovery.
    void modify(const QueuePairTransition& transition, const char* transition_name);
    ibv_qp_state state() const;

    // Data path: no allocation, lock of ours, or exception. Posts the requests in order,
    // stops at the first one refused; *posted (if given) says how many were accepted.
    mlx5::PostResult post_send(std::span<const mlx5::SendWorkRequest> requests,
                               std::uint32_t* posted) noexcept;
    mlx5::PostResult post_receive(std::span<const mlx5::ReceiveWorkRequest> requests,
                                  std::uint32_t* posted) noexcept;

  private:
    QueuePair(QueuePairParents parents, ibv_qp* qp, const QueuePairCapabilities& capabilities)
        : parents_(std::move(parents)), qp_(qp), capabilities_(capabilities) {}
    QueuePairParents parents_;
    ibv_qp* qp_;
    QueuePairCapabilities capabilities_;
};

}  // namespace rdmachan::verbs
