// What libmlx5 v44 returns for each refusal of ours (providers/mlx5/qp.c). Sends
// (_mlx5_post_send and the ibv_wr_* builders): ENOMEM for no room, too many SGEs (it checks
// num_sge against max_gs with the overflow checks) and an inline payload or key layout that
// does not fit; EINVAL for a request it cannot carry. Receives (mlx5_post_recv, and the SRQ's
// mlx5_post_srq_recv): ENOMEM for no room, EINVAL for too many SGEs.
#pragma once

#include <cerrno>

#include "transport/mlx5/work_request.hpp"

namespace rdmachan::golden {

inline int send_errno_of(mlx5::PostResult result) {
    switch (result) {
        case mlx5::PostResult::ok:
            return 0;
        case mlx5::PostResult::queue_full:
        case mlx5::PostResult::too_many_sge:
        case mlx5::PostResult::inline_too_large:
        case mlx5::PostResult::too_many_entries:  // mlx5_send_wr_set_mkey_layout
            return ENOMEM;
        case mlx5::PostResult::invalid_request:
            return EINVAL;
    }
    return EINVAL;
}

inline int receive_errno_of(mlx5::PostResult result) {
    switch (result) {
        case mlx5::PostResult::ok:
            return 0;
        case mlx5::PostResult::queue_full:
            return ENOMEM;
        default:
            return EINVAL;
    }
}

}  // namespace rdmachan::golden
