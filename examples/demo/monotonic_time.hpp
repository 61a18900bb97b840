// The host's monotonic clock in nanoseconds: what the demo's processes stamp their events with,
// so that the launcher can order and subtract the stamps of different processes.
#pragma once

#include <chrono>
#include <cstdint>

namespace demo {

inline std::int64_t monotonic_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
}

}  // namespace demo
