// The project's work-request and completion values <-> verbs structures, for the generic
// verbs data path. Header-only and allocation-free: called on every post and poll.
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include "transport/mlx5/completion.hpp"
#include "transport/mlx5/work_request.hpp"

namespace rdmachan::verbs {

// false when the opcode has no RC verbs equivalent (configure_memory_key, a UMR).
inline bool to_ibv_opcode(mlx5::SendOpcode opcode, ibv_wr_opcode& out) noexcept {
    switch (opcode) {
        case mlx5::SendOpcode::rdma_write:
            out = IBV_WR_RDMA_WRITE;
            return true;
        case mlx5::SendOpcode::rdma_write_with_immediate:
            out = IBV_WR_RDMA_WRITE_WITH_IMM;
            return true;
        case mlx5::SendOpcode::send:
            out = IBV_WR_SEND;
            return true;
        case mlx5::SendOpcode::send_with_immediate:
            out = IBV_WR_SEND_WITH_IMM;
            return true;
        case mlx5::SendOpcode::send_with_invalidate:
            out = IBV_WR_SEND_WITH_INV;
            return true;
        case mlx5::SendOpcode::rdma_read:
            out = IBV_WR_RDMA_READ;
            return true;
        case mlx5::SendOpcode::atomic_compare_and_swap:
            out = IBV_WR_ATOMIC_CMP_AND_SWP;
            return true;
        case mlx5::SendOpcode::atomic_fetch_and_add:
            out = IBV_WR_ATOMIC_FETCH_AND_ADD;
            return true;
        case mlx5::SendOpcode::local_invalidate:
            out = IBV_WR_LOCAL_INV;
            return true;
        case mlx5::SendOpcode::configure_memory_key:
            return false;  // a UMR: verbs has no such work request (memory layouts are mlx5 only)
    }
    return false;
}

inline unsigned to_ibv_send_flags(std::uint32_t flags) noexcept {
    unsigned result = 0;
    if (flags & mlx5::kSendSignaled) result |= IBV_SEND_SIGNALED;
    if (flags & mlx5::kSendSolicited) result |= IBV_SEND_SOLICITED;
    if (flags & mlx5::kSendFence) result |= IBV_SEND_FENCE;
    if (flags & mlx5::kSendInline) result |= IBV_SEND_INLINE;
    return result;
}

inline void to_ibv_sge(const mlx5::ScatterGatherElement& element, ibv_sge& out) noexcept {
    out.addr = element.addr;
    out.length = element.length;
    out.lkey = element.lkey;
}

// Fills everything but next and sg_list/num_sge (the caller owns the SGE storage).
// Returns false for a request the RC verbs path cannot carry (a DC address vector).
inline bool to_ibv_send_wr(const mlx5::SendWorkRequest& request, ibv_send_wr& out) noexcept {
    out = ibv_send_wr{};
    // The opcode first: a key configuration's layout shares its place with dc_address_vector.
    if (!to_ibv_opcode(request.opcode, out.opcode)) return false;
    if (request.dc_address_vector != nullptr) return false;
    out.wr_id = request.wr_id;
    out.send_flags = to_ibv_send_flags(request.flags);
    switch (request.opcode) {
        case mlx5::SendOpcode::rdma_write_with_immediate:
        case mlx5::SendOpcode::send_with_immediate:
            // verbs takes the immediate in network order; ours is host order.
            out.imm_data = htonl(request.immediate);
            break;
        case mlx5::SendOpcode::send_with_invalidate:
        case mlx5::SendOpcode::local_invalidate:
            out.invalidate_rkey = request.immediate;
            break;
        default:
            break;
    }
    switch (request.opcode) {
        case mlx5::SendOpcode::rdma_write:
        case mlx5::SendOpcode::rdma_write_with_immediate:
        case mlx5::SendOpcode::rdma_read:
            out.wr.rdma.remote_addr = request.remote_addr;
            out.wr.rdma.rkey = request.rkey;
            break;
        case mlx5::SendOpcode::atomic_compare_and_swap:
        case mlx5::SendOpcode::atomic_fetch_and_add:
            out.wr.atomic.remote_addr = request.remote_addr;
            out.wr.atomic.rkey = request.rkey;
            out.wr.atomic.compare_add = request.compare_add;
            out.wr.atomic.swap = request.swap;
            break;
        default:
            break;
    }
    return true;
}

inline mlx5::Completion from_ibv_wc(const ibv_wc& wc) noexcept {
    mlx5::Completion completion;
    completion.wr_id = wc.wr_id;
    // Equal numbering by construction (completion.hpp mirrors enum ibv_wc_status/ibv_wc_opcode).
    completion.status = static_cast<mlx5::CompletionStatus>(wc.status);
    completion.opcode = static_cast<mlx5::CompletionOpcode>(wc.opcode);
    completion.vendor_error = static_cast<std::uint8_t>(wc.vendor_err);
    completion.byte_len = wc.byte_len;
    completion.qp_num = wc.qp_num;
    completion.src_qp = wc.src_qp;
    completion.slid = wc.slid;
    completion.sl = wc.sl;
    completion.dlid_path_bits = wc.dlid_path_bits;
    completion.pkey_index = wc.pkey_index;
    if (wc.wc_flags & IBV_WC_GRH) completion.flags |= mlx5::kCompletionGrh;
    if (wc.wc_flags & IBV_WC_WITH_IMM) {
        completion.flags |= mlx5::kCompletionWithImmediate;
        completion.immediate = ntohl(wc.imm_data);
    }
    if (wc.wc_flags & IBV_WC_WITH_INV) {
        completion.flags |= mlx5::kCompletionWithInvalidate;
        completion.invalidated_rkey = wc.invalidated_rkey;
    }
    // Error completions carry no valid opcode (ibv_poll_cq(3)); the queue that produced them
    // tells requester from responder, which the caller knows. Valid ones say it in the opcode.
    completion.is_receive = wc.status == IBV_WC_SUCCESS && (wc.opcode & IBV_WC_RECV) != 0;
    return completion;
}

}  // namespace rdmachan::verbs
