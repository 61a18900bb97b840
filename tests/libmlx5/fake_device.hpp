// Debian's libibverbs and libmlx5, as installed, opened on the fake uverbs device
// (fake_uverbs.cpp): an "mlx5_0" with one InfiniBand port, a protection domain and a CQ, and RC
// queue pairs moved to RTS. Shared by the libmlx5 benchmark and the differential send test.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <string>

namespace rdmachan::libmlx5_instructions {

struct FakeMlx5 {
    ibv_context* context = nullptr;
    ibv_pd* pd = nullptr;
    ibv_cq* cq = nullptr;
};

// Writes the sysfs tree of the fake device into a new temporary folder and points libibverbs at
// it (SYSFS_PATH), for a program that opens the device itself; returns the folder.
std::string make_fake_sysfs();
// Empty `error` on success; otherwise what failed.
FakeMlx5 open_fake_mlx5(std::uint32_t cq_entries, std::string& error);
// An RC queue pair with these capabilities (libmlx5 may round them up: `caps` is updated),
// sending and receiving on `mlx5.cq`, in RTS (every WQE signaled when `signal_all`: sq_sig_all;
// receiving from `shared_receive_queue` when there is one);
// nullptr and `error` set on failure.
ibv_qp* create_rts_queue_pair(const FakeMlx5& mlx5, ibv_qp_cap& caps, std::string& error, bool signal_all = false,
                              ibv_srq* shared_receive_queue = nullptr);
// An RC queue pair (mlx5dv_create_qp) that also configures indirect memory keys through the
// ibv_wr_* API (mlx5dv_wr_mr_list, mlx5dv_wr_mr_interleaved, ibv_wr_local_inv), in RTS.
ibv_qp* create_rts_memory_key_queue_pair(const FakeMlx5& mlx5, ibv_qp_cap& caps, std::string& error);
// A DC initiator (mlx5dv_create_qp) that sends with the ibv_wr_* API (every opcode the channel
// posts), in RTS; `caps` updated as libmlx5 granted them.
ibv_qp* create_rts_dc_initiator(const FakeMlx5& mlx5, ibv_qp_cap& caps, std::string& error);
// Names in a CQE's mlx5_cqe64 the QP (the user index, which a CQE of version 1 carries, and
// sop_drop_qpn: the WQE opcode in bits 31:24 on the requester side, the QPN below) and the WQE
// it completes (wqe_counter), big-endian as a ConnectX writes them.
void name_cqe(std::uint8_t* cqe, std::uint32_t user_index, std::uint32_t sop_drop_qpn, std::uint32_t wqe_counter);
// Writes, as a ConnectX does, the `index`-th CQE of the last CQ created: a requester CQE for the
// WQE of opcode `wqe_opcode` starting at WQEBB `wqe_counter` of queue pair `qpn` (the last one
// created: the CQE, version 1, names it by its user index), owned by software on this pass of
// the ring (mlx5-facts.md §5), the op_own byte last.
void write_requester_cqe(std::uint32_t index, std::uint32_t qpn, std::uint8_t wqe_opcode, std::uint32_t wqe_counter,
                         std::uint32_t byte_count = 0);

}  // namespace rdmachan::libmlx5_instructions
