#include "tests/libmlx5/libmlx5_refusals.hpp"

namespace rdmachan::libmlx5_instructions {
namespace {

using mlx5::PostResult;

// struct mlx5_wqe_inl_data_seg (the inline header) and a translation entry, in bytes.
constexpr std::uint32_t kInlineHeaderBytes = 4;
constexpr std::uint32_t kTranslationEntryBytes = 16;

}  // namespace

Refusal libmlx5_send_refusal(const std::vector<ibv_send_wr>& chain, std::uint32_t outstanding,
                             const QueueLimits& limits) {
    for (std::uint32_t index = 0; index < chain.size(); ++index) {
        const ibv_send_wr& request = chain[index];
        if (outstanding + index >= limits.max_post) return {index, PostResult::queue_full};
        if (static_cast<std::uint32_t>(request.num_sge) > limits.max_sge)
            return {index, PostResult::too_many_sge};
        if ((request.send_flags & IBV_SEND_INLINE) != 0 && request.num_sge != 0) {
            std::uint64_t total = 0;
            for (int i = 0; i < request.num_sge; ++i) total += request.sg_list[i].length;
            if (total > limits.max_inline_data) return {index, PostResult::inline_too_large};
        }
    }
    return {static_cast<std::uint32_t>(chain.size()), PostResult::ok};
}

Refusal libmlx5_receive_refusal(const std::vector<ibv_recv_wr>& chain, std::uint32_t outstanding,
                                const QueueLimits& limits) {
    for (std::uint32_t index = 0; index < chain.size(); ++index) {
        if (outstanding + index >= limits.max_post) return {index, PostResult::queue_full};
        if (static_cast<std::uint32_t>(chain[index].num_sge) > limits.max_sge)
            return {index, PostResult::too_many_sge};
    }
    return {static_cast<std::uint32_t>(chain.size()), PostResult::ok};
}

Refusal libmlx5_shared_receive_refusal(const std::vector<ibv_recv_wr>& chain,
                                       std::uint32_t outstanding, std::uint32_t wqe_count,
                                       std::uint32_t max_sge) {
    for (std::uint32_t index = 0; index < chain.size(); ++index) {
        if (static_cast<std::uint32_t>(chain[index].num_sge) > max_sge)
            return {index, PostResult::too_many_sge};
        if (outstanding + index >= wqe_count - 1) return {index, PostResult::queue_full};
    }
    return {static_cast<std::uint32_t>(chain.size()), PostResult::ok};
}

PostResult libmlx5_builder_refusal(std::uint32_t num_sge, bool inline_data,
                                   std::uint64_t inline_total, std::uint32_t outstanding,
                                   std::uint32_t position, const QueueLimits& limits) {
    if (outstanding + position >= limits.max_post) return PostResult::queue_full;
    if (inline_data)
        return inline_total > limits.max_inline_data ? PostResult::inline_too_large
                                                     : PostResult::ok;
    return num_sge > limits.max_sge ? PostResult::too_many_sge : PostResult::ok;
}

PostResult libmlx5_layout_refusal(bool interleaved, std::uint32_t num_entries,
                                  std::uint32_t key_entries, std::uint32_t max_inline_data) {
    const std::uint32_t slots = (max_inline_data + kInlineHeaderBytes) / kTranslationEntryBytes;
    std::uint32_t room = interleaved ? slots - 1 : slots;
    if (key_entries < room) room = key_entries;
    return num_entries > room ? PostResult::too_many_entries : PostResult::ok;
}

const char* reason_name(PostResult reason) {
    switch (reason) {
        case PostResult::ok:
            return "none";
        case PostResult::queue_full:
            return "queue full";
        case PostResult::too_many_sge:
            return "too many SGEs";
        case PostResult::inline_too_large:
            return "inline too large";
        case PostResult::invalid_request:
            return "invalid request";
        case PostResult::too_many_entries:
            return "too many entries";
    }
    return "unknown";
}

std::string check_derivation(const Refusal& expected, int their_result, std::uint32_t their_posted,
                             std::uint32_t requests, int (*errno_of)(PostResult)) {
    const std::uint32_t expected_posted =
        expected.reason == PostResult::ok ? requests : expected.index;
    if (their_result == errno_of(expected.reason) && their_posted == expected_posted) return {};
    const std::string modelled = expected.reason == PostResult::ok
                                     ? "takes all " + std::to_string(requests)
                                     : "refuses request " + std::to_string(expected.index) + " (" +
                                           reason_name(expected.reason) + ", errno " +
                                           std::to_string(errno_of(expected.reason)) + ")";
    return "libmlx5 returned " + std::to_string(their_result) + " after taking " +
           std::to_string(their_posted) + "; its code, as modelled, " + modelled;
}

std::string refusal_difference(const Refusal& expected, PostResult our_result,
                               std::uint32_t our_posted) {
    if (our_result == expected.reason && our_posted == expected.index) return {};
    return std::string("libmlx5 refuses request ") + std::to_string(expected.index) + " (" +
           reason_name(expected.reason) + "); ours took " + std::to_string(our_posted) + " (" +
           reason_name(our_result) + ")";
}

}  // namespace rdmachan::libmlx5_instructions
