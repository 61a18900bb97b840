// Two copies of one queue pair's queues for the differential tests: libmlx5's own (an RC queue
// pair of the installed libmlx5 on the fake uverbs device, its rings read through
// mlx5dv_init_obj) and the project's (SendQueue, ReceiveQueue and CompletionQueue over plain
// memory of the same shapes, the CQ ring starting as a copy of libmlx5's). The tests post the
// same work requests to both and write the same CQEs into both rings.
//
// Which bytes libmlx5 wrote: before a call the tests fill both sides' memory with the same
// random byte; a byte of libmlx5's that differs from it afterwards was written (a byte written
// with the poison's value is missed, a different one each call). We may write more (reserved
// fields libmlx5 leaves alone).
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "tests/libmlx5/fake_device.hpp"
#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/receive_queue.hpp"
#include "transport/mlx5/send_queue.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"

namespace rdmachan::libmlx5_instructions {

// One side's memory of a queue: where it is and how long.
struct Memory {
    std::uint8_t* bytes = nullptr;
    std::size_t length = 0;
};

struct DifferentialQueues {
    FakeMlx5 device;
    ibv_qp* qp = nullptr;
    ibv_qp_cap caps{};
    std::uint32_t user_index = 0;
    // libmlx5's rings.
    Memory their_send, their_receive, their_completions;
    std::uint32_t* their_doorbell_record = nullptr;  // [0] receive, [1] send
    std::uint32_t* their_cq_doorbell_record = nullptr;
    std::uint8_t* their_blueflame = nullptr;
    std::uint32_t blueflame_size = 0;
    std::uint32_t send_wqe_count = 0, receive_wqe_count = 0, receive_stride = 0, cqe_count = 0, cqe_size = 0;
    // Ours, in storage of our own.
    std::vector<std::uint8_t> send_memory, receive_memory, completion_memory, register_memory;
    Memory our_send, our_receive, our_completions;
    std::uint32_t our_doorbell_record[2] = {};
    std::uint32_t our_cq_doorbell_record[2] = {};
    std::uint8_t* our_blueflame = nullptr;
    std::vector<std::uint64_t> send_wr_ids, receive_wr_ids;
    std::vector<std::uint32_t> send_wqe_ends;
    std::vector<std::uint8_t> send_umr_opcodes;
    mlx5::SendQueue send;
    mlx5::ReceiveQueue receive;
    mlx5::CompletionQueue completions;
    mlx5::CompletionTarget target;
    // With a shared receive queue (the QP then has no receive queue of its own).
    ibv_srq* srq = nullptr;
    Memory their_shared_receive;
    std::uint32_t* their_srq_doorbell_record = nullptr;
    std::uint32_t srq_wqe_count = 0, srq_stride = 0, srq_max_sge = 0;
    std::vector<std::uint8_t> shared_receive_memory;
    Memory our_shared_receive;
    std::uint32_t our_srq_doorbell_record[1] = {};
    std::vector<std::uint64_t> shared_receive_wr_ids;
    mlx5::SharedReceiveQueue shared_receive;
};

// Empty on success, else what failed. `queues` must not move afterwards (the queues point into it).
// `shared_receive_wr` > 0: the QP receives from an SRQ of that many work requests and
// wanted.max_recv_sge SGEs; ours starts as a copy of libmlx5's (its free list included).
std::string open_differential_queues(DifferentialQueues& queues, const ibv_qp_cap& wanted, bool signal_all,
                                     std::uint32_t shared_receive_wr = 0);

// The same over a DC initiator of libmlx5's (mlx5dv_create_qp, in RTS), sending with the
// ibv_wr_* API; ours is a DC-initiator SendQueue.
std::string open_differential_dci(DifferentialQueues& queues, const ibv_qp_cap& wanted);
// The same over an RC queue pair of libmlx5's that configures indirect memory keys (the ibv_wr_*
// API with mlx5dv_wr_mr_list, mlx5dv_wr_mr_interleaved and ibv_wr_local_inv).
std::string open_differential_memory_keys(DifferentialQueues& queues, const ibv_qp_cap& wanted);
// Ours, shaped after libmlx5's queue pair and CQ (every opener ends with it).
std::string mirror_queues(DifferentialQueues& queues, bool signal_all, bool dc_initiator);

// 64-byte aligned storage of `length` bytes inside `storage`.
Memory aligned(std::vector<std::uint8_t>& storage, std::size_t length);

// The first offset in the send ring, within the WQEBBs posted since `first_wqebb` (up to our
// producer index), where libmlx5 wrote a byte other than ours; -1 if none. A refused request
// may leave bytes after them (libmlx5 copies inline data before it finds the total too large),
// which no NIC reads.
long first_posted_difference(DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint8_t poison);
// Fills both sides' send rings and BlueFlame registers with `poison` before a post.
void poison_send_side(DifferentialQueues& queues, std::uint8_t poison);
// After both sides posted from `first_wqebb`: empty when the send doorbell records agree, the
// WQEBBs posted agree (first_posted_difference) and, with `compare_register`, so do the
// registers; else where they first differ.
std::string send_side_difference(DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint8_t poison,
                                 bool compare_register);
// Whether libmlx5's last doorbell was a BlueFlame copy: it wrote past the first 8 bytes (the
// doorbell's) of either half of its register, which poison_send_side filled with `poison`.
bool blueflame_written(const DifferentialQueues& queues, std::uint8_t poison);
// Whether the WQEBBs from `first_wqebb` up to `end_wqebb` run past the ring end.
bool crosses_ring_end(const DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint32_t end_wqebb);
// The first WQEBB of the last of `wqes` WQEs libmlx5 posted from `first_wqebb` (walking their ds).
std::uint32_t last_wqe_start(const DifferentialQueues& queues, std::uint32_t first_wqebb, std::uint32_t wqes);
// Retires the `wqes` WQEs both sides posted from `first_wqebb`, as a completion of libmlx5's
// last one would (the CQE names that WQE's first WQEBB, found by walking the ds fields), so
// neither queue fills. False if libmlx5 did not return that completion.
bool retire_posted(DifferentialQueues& queues, std::uint32_t& cqes, std::uint32_t first_wqebb, std::uint32_t wqes);

// Writes the same CQE into both CQ rings as entry `index`: `cqe`'s first 63 bytes, then op_own
// (`opcode_and_flags` with the pass's owner bit, stored into cqe[63] too) with release. The
// mlx5_cqe64 is the last 64 bytes of an entry (a 128-byte CQE's first half holds data scattered
// to the CQE, which format 0 does not use).
void write_cqe_to_both(DifferentialQueues& queues, std::uint32_t index, std::uint8_t* cqe, std::uint8_t opcode_and_flags);

// One poll of up to `capacity` (at most 6) completions from both CQs: libmlx5's ibv_poll_cq into
// `theirs` (poisoned with `poison` first), ours into `ours`, resolving only the queues' QP.
// Empty when both returned the same number, `count`, and left the same CQ doorbell record;
// else what differs.
std::string poll_both_once(DifferentialQueues& queues, std::uint32_t capacity, std::uint8_t poison, ibv_wc* theirs,
                           mlx5::Completion* ours, std::uint32_t& count);

// A chain of send work requests in both forms, with the storage their pointers refer to.
struct SendChain {
    std::vector<ibv_send_wr> verbs;
    std::vector<ibv_sge> verbs_elements;
    std::vector<mlx5::SendWorkRequest> ours;
    std::vector<mlx5::ScatterGatherElement> our_elements;
    std::string description;
};
// 1 to 4 requests of the opcodes the channel posts, random flags, SGE counts (now and then one
// above the queue's maximum) and lengths; inline payloads come from `payload`.
SendChain random_send_chain(std::mt19937_64& random, const ibv_qp_cap& caps, const std::vector<std::uint8_t>& payload);

// The same for receives: 1 to 3 requests, SGE counts up to one above the maximum, lengths 0 up.
struct ReceiveChain {
    std::vector<ibv_recv_wr> verbs;
    std::vector<ibv_sge> verbs_elements;
    std::vector<mlx5::ReceiveWorkRequest> ours;
    std::vector<mlx5::ScatterGatherElement> our_elements;
};
ReceiveChain random_receive_chain(std::mt19937_64& random, const ibv_qp_cap& caps);

// How many requests of a list libmlx5 took: up to the one *bad names, all when it is nullptr.
template <typename Request>
std::uint32_t accepted(const Request* bad, const std::vector<Request>& requests) {
    return bad == nullptr ? static_cast<std::uint32_t>(requests.size()) : static_cast<std::uint32_t>(bad - requests.data());
}
// Empty when both posts returned the same errno after accepting as many requests; else says so.
std::string post_difference(const std::string& what, int their_result, std::uint32_t their_posted, int our_result,
                            std::uint32_t our_posted);

// The first offset where libmlx5 wrote something (a byte not `poison`) that differs from ours,
// or -1.
long first_difference(const std::uint8_t* theirs, const std::uint8_t* ours, std::size_t length, std::uint8_t poison);
// 16 bytes around `at`, in hex, for a failure message.
std::string hex_around(const std::uint8_t* bytes, long at, std::size_t length);

}  // namespace rdmachan::libmlx5_instructions
