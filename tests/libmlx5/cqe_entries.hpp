// What the CQE-format differential tests (scatter_to_cqe_differential_test.cpp,
// compressed_cqe_differential_test.cpp) share: writing one CQ entry as a ConnectX does, and
// comparing an ibv_wc libmlx5 filled with our Completion, field by field.
#pragma once

#include <arpa/inet.h>
#include <infiniband/verbs.h>

#include <atomic>
#include <cstdint>
#include <cstring>
#include <string>

#include "transport/mlx5/completion.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::libmlx5_instructions {

// The owner bit a CQE written at free-running index `index` carries (mlx5-facts.md §5).
inline std::uint8_t owner_of(std::uint32_t index, std::uint32_t cqe_count) {
    return static_cast<std::uint8_t>((index / cqe_count) & 1);
}

// Writes entry `index` of a ring of `cqe_count` entries of `cqe_size` bytes: `first_half` (64
// bytes, or nullptr) into a 128-byte entry's first half, then `cqe64`'s bytes 0-62, then its
// op_own byte as given, with release, as the NIC makes the entry visible last.
inline void put_entry(std::uint8_t* ring, std::uint32_t cqe_count, std::uint32_t cqe_size, std::uint32_t index,
                      const std::uint8_t* cqe64, const std::uint8_t* first_half = nullptr) {
    std::uint8_t* const entry = ring + static_cast<std::size_t>(index & (cqe_count - 1)) * cqe_size;
    std::uint8_t* const body = entry + (cqe_size - 64);
    if (first_half != nullptr && cqe_size == 128) std::memcpy(entry, first_half, 64);
    std::memcpy(body, cqe64, 63);
    std::atomic_ref<std::uint8_t>(body[63]).store(cqe64[63], std::memory_order_release);
}

// Compares the ibv_wc fields libmlx5 wrote (those not still `poison`; the array was filled with
// it before the poll) with ours; empty when they agree. Counts the fields compared.
inline std::string compare_completion(const ibv_wc& theirs, const mlx5::Completion& ours, std::uint8_t poison,
                                      std::uint64_t& compared_fields) {
    std::string difference;
    auto field = [&](const char* name, const void* address, std::size_t size, std::uint64_t their_value,
                     std::uint64_t our_value) {
        const auto* bytes = static_cast<const std::uint8_t*>(address);
        bool written = false;
        for (std::size_t i = 0; i < size; ++i) written = written || bytes[i] != poison;
        if (!written) return;
        ++compared_fields;
        if (difference.empty() && their_value != our_value)
            difference = std::string(name) + ": libmlx5 " + std::to_string(their_value) + ", ours " + std::to_string(our_value);
    };
    std::uint32_t flags = 0;
    if ((ours.flags & mlx5::kCompletionGrh) != 0) flags |= IBV_WC_GRH;
    if ((ours.flags & mlx5::kCompletionWithImmediate) != 0) flags |= IBV_WC_WITH_IMM;
    if ((ours.flags & mlx5::kCompletionWithInvalidate) != 0) flags |= IBV_WC_WITH_INV;
    field("wr_id", &theirs.wr_id, 8, theirs.wr_id, ours.wr_id);
    field("status", &theirs.status, sizeof theirs.status, theirs.status, static_cast<std::uint64_t>(ours.status));
    field("opcode", &theirs.opcode, sizeof theirs.opcode, theirs.opcode, static_cast<std::uint64_t>(ours.opcode));
    field("vendor_err", &theirs.vendor_err, 4, theirs.vendor_err, ours.vendor_error);
    field("byte_len", &theirs.byte_len, 4, theirs.byte_len, ours.byte_len);
    field("qp_num", &theirs.qp_num, 4, theirs.qp_num, ours.qp_num);
    field("src_qp", &theirs.src_qp, 4, theirs.src_qp, ours.src_qp);
    field("wc_flags", &theirs.wc_flags, 4, theirs.wc_flags, flags);
    field("pkey_index", &theirs.pkey_index, 2, theirs.pkey_index, ours.pkey_index);
    field("slid", &theirs.slid, 2, theirs.slid, ours.slid);
    field("sl", &theirs.sl, 1, theirs.sl, ours.sl);
    field("dlid_path_bits", &theirs.dlid_path_bits, 1, theirs.dlid_path_bits, ours.dlid_path_bits);
    if ((theirs.wc_flags & IBV_WC_WITH_INV) != 0 && theirs.status == IBV_WC_SUCCESS) {
        field("invalidated_rkey", &theirs.invalidated_rkey, 4, theirs.invalidated_rkey, ours.invalidated_rkey);
    } else if ((theirs.wc_flags & IBV_WC_WITH_IMM) != 0 && theirs.status == IBV_WC_SUCCESS) {
        field("imm_data", &theirs.imm_data, 4, ntohl(theirs.imm_data), ours.immediate);
    }
    return difference;
}

}  // namespace rdmachan::libmlx5_instructions
