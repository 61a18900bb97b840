// The installed libmlx5's queues on the fake uverbs device (tests/libmlx5), as
// mlx5-golden-capture drives them: receives, sends and SRQ receives posted with the verbs
// calls, CQEs written into its CQ ring as a ConnectX writes them and polled with ibv_poll_cq,
// each call also recorded as a capture step or input.
#pragma once

#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "tests/libmlx5/fake_device.hpp"

namespace rdmachan::golden::capture {

// One receive work request: wr_id and the first `sges` of the golden README's receive SGEs.
struct ReceiveSpec {
    std::uint64_t wr_id = 0;
    std::uint32_t sges = 1;
};

// A CQE as the golden harness writes them (README "Inputs"): responder fields sl 5, remote QPN
// 0xbeef, SLID 0x0a0b, path 0x85; the QP named by its user index.
struct CqeSpec {
    std::uint8_t opcode = 2;  // RESP_SEND
    std::uint32_t user_index = 0;
    std::uint32_t sop_drop_qpn = 0;
    std::uint16_t wqe_counter = 0;
    std::uint32_t byte_count = 0x200;
    std::uint32_t immediate = 0;
    std::uint8_t syndrome = 0;  // error CQEs
    std::uint8_t vendor_syndrome = 0;
};

struct QueuePair {
    ibv_qp* qp = nullptr;
    std::uint32_t user_index = 0;
    mlx5dv_qp dv{};
};

class Libmlx5Queues {
  public:
    // A CQ of at least `cq_entries` entries; throws what failed.
    explicit Libmlx5Queues(std::uint32_t cq_entries);

    QueuePair& add_queue_pair(std::uint32_t max_recv_wr, std::uint32_t max_recv_sge,
                              ibv_srq* srq = nullptr);
    ibv_srq* add_shared_receive_queue(std::uint32_t max_wr, std::uint32_t max_sge);
    mlx5dv_srq shared_receive_view() const;

    // Each returns the step as inputs.before_capture records it.
    nlohmann::json post_receives(const QueuePair& qp, const std::vector<ReceiveSpec>& list);
    nlohmann::json post_shared_receives(const std::vector<ReceiveSpec>& list);
    nlohmann::json post_send(const QueuePair& qp, std::uint64_t wr_id);
    // Writes the CQEs at the consumer index on and polls `ne`; `wc` gets what the poll returned
    // (the array filled with `poison` first). The step holds cqes_written, ne, return_code, wc.
    nlohmann::json write_and_poll(const std::vector<CqeSpec>& cqes, std::uint32_t ne,
                                  std::uint8_t poison, std::vector<ibv_wc>& wc);

    const mlx5dv_cq& cq() const { return cq_; }
    ibv_cq* verbs_cq() const { return device_.cq; }
    std::uint32_t consumer_index() const { return consumer_index_; }
    // inputs.cq of a cqe case.
    nlohmann::json cq_inputs() const;
    // One entry of cqes_written: the CQE at consumer index `index`, as it is in the ring.
    nlohmann::json cqe_written(std::uint32_t index) const;

  private:
    rdmachan::libmlx5_instructions::FakeMlx5 device_;
    mlx5dv_cq cq_{};
    ibv_srq* srq_ = nullptr;
    std::vector<QueuePair*> queue_pairs_;
    std::uint32_t consumer_index_ = 0;  // CQEs written and polled so far
};

// {"wr_id", "num_sge", "sg_list"} of a receive as the vectors write it.
nlohmann::json receive_json(const ReceiveSpec& spec);
// An entry of the SRQ's or a receive queue's geometry, read back from libmlx5.
nlohmann::json receive_queue_geometry(const QueuePair& qp);

}  // namespace rdmachan::golden::capture
