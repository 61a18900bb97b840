// Shared by QueuePair::post_receive and SharedReceiveQueue::post_receive: translate receive
// requests into verbs structures on the stack, in chunks, and report how many were accepted.
#pragma once

#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdint>
#include <span>

#include "transport/mlx5/work_request.hpp"
#include "transport/verbs/work_request_translation.hpp"

namespace rdmachan::verbs::detail {

inline constexpr std::size_t kRequestsPerChunk = 16;
inline constexpr std::size_t kElementsPerChunk = 64;

inline mlx5::PostResult result_from_post_error(int code) noexcept {
    // libibverbs providers answer a full queue with ENOMEM and a bad request with EINVAL.
    // Some providers return -errno: compare magnitudes.
    const int magnitude = code < 0 ? -code : code;
    return magnitude == ENOMEM ? mlx5::PostResult::queue_full : mlx5::PostResult::invalid_request;
}

// post(first, &bad) is ibv_post_recv or ibv_post_srq_recv bound to its queue.
template <typename Post>
mlx5::PostResult post_receive_chunks(std::span<const mlx5::ReceiveWorkRequest> requests,
                                     std::uint32_t max_sge, std::uint32_t* posted,
                                     Post&& post) noexcept {
    ibv_recv_wr work_requests[kRequestsPerChunk];
    ibv_sge elements[kElementsPerChunk];
    std::size_t done = 0;
    mlx5::PostResult result = mlx5::PostResult::ok;
    while (done < requests.size()) {
        std::size_t count = 0;
        std::size_t used_elements = 0;
        while (done + count < requests.size() && count < kRequestsPerChunk) {
            const mlx5::ReceiveWorkRequest& request = requests[done + count];
            if (request.num_sge > max_sge || request.num_sge > kElementsPerChunk) {
                result = mlx5::PostResult::too_many_sge;
                break;
            }
            if (used_elements + request.num_sge > kElementsPerChunk) break;
            ibv_recv_wr& out = work_requests[count];
            out = ibv_recv_wr{};
            out.wr_id = request.wr_id;
            out.sg_list = elements + used_elements;
            out.num_sge = static_cast<int>(request.num_sge);
            for (std::uint32_t i = 0; i < request.num_sge; ++i)
                to_ibv_sge(request.sg_list[i], elements[used_elements++]);
            if (count > 0) work_requests[count - 1].next = &out;
            ++count;
        }
        if (count > 0) {
            ibv_recv_wr* bad = nullptr;
            const int code = post(work_requests, &bad);
            if (code != 0) {
                done += bad != nullptr ? static_cast<std::size_t>(bad - work_requests) : 0;
                result = result_from_post_error(code);
                break;
            }
            done += count;
        }
        if (result != mlx5::PostResult::ok) break;
    }
    if (posted != nullptr) *posted = static_cast<std::uint32_t>(done);
    return result;
}

}  // namespace rdmachan::verbs::detail
