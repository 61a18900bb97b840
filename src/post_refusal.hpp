// A post the queue pair refused: the status its operation fails with, and the reason it names.
#pragma once

#include "transport/device_interface.hpp"

namespace rdmachan::detail {

inline mlx5::CompletionStatus refusal_status(mlx5::PostResult result) {
    switch (result) {
        case mlx5::PostResult::too_many_sge:
        case mlx5::PostResult::too_many_entries:
        case mlx5::PostResult::inline_too_large: return mlx5::CompletionStatus::local_length_error;
        case mlx5::PostResult::invalid_request: return mlx5::CompletionStatus::local_qp_operation_error;
        default: return mlx5::CompletionStatus::general_error;
    }
}

inline const char* refusal_reason(mlx5::PostResult result) {
    switch (result) {
        case mlx5::PostResult::ok: return "no reason";
        case mlx5::PostResult::queue_full: return "the queue stayed full until the deadline";
        case mlx5::PostResult::too_many_sge: return "more scatter/gather elements than the queue takes";
        case mlx5::PostResult::inline_too_large: return "inline data larger than max_inline_data";
        case mlx5::PostResult::invalid_request: return "the device refused the request";
        case mlx5::PostResult::too_many_entries:
            return "more memory layout entries than the key or the queue's max_inline_data takes";
    }
    return "unknown";
}

}  // namespace rdmachan::detail
