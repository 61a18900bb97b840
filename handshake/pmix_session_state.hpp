// What PmixSession keeps (pmix_bootstrap.hpp), and the small helpers its two source files share:
// pmix_bootstrap.cpp (opening, the exchange, fences, gets) and pmix_launcher_calls.cpp (the
// launcher's data store, process table and spawn, for peer replacement). Compiled with libpmix.
#pragma once

#include <pmix.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

#include "handshake/pmix_bootstrap.hpp"

namespace rdmachan::detail {

struct PmixSession::State {
    pmix_proc_t self{};
    std::uint32_t world_size = 0;
    std::string job;
    std::uint64_t last_exchange_bytes = 0;
    PmixSession::ExchangePhases last_phases;
    std::optional<PmixSession::Replaces> replaces;
    std::uint64_t last_sequence = 0;
};

inline std::string status_text(pmix_status_t status) { return PMIx_Error_string(status); }

// PMIX_TIMEOUT takes whole seconds: the time left, rounded up, at least one.
inline int timeout_seconds(std::chrono::milliseconds left) {
    const auto seconds = (std::max<std::int64_t>(left.count(), 1) + 999) / 1000;
    return static_cast<int>(std::min<std::int64_t>(seconds, 1 << 30));
}

inline std::chrono::milliseconds time_left(PmixSession::Clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - PmixSession::Clock::now()));
}

}  // namespace rdmachan::detail
