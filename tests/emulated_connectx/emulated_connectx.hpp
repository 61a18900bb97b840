// The emulated ConnectX (emulated_connectx.cpp) exports libibverbs' and libmlx5's C entry
// points; this header only names what it shows.
#pragma once

#include <cstdint>

namespace rdmachan::emulated {
const char* device_name() noexcept;  // "mlx5_0"

// What the doorbell pollers of this process saw of CQ arms (for tests that link the library):
// CQ doorbell register writes taken, and how many of those found a CQE already past the arm's
// consumer index (a completion that landed between the consumer's poll and the device seeing
// its arm; the arm then raises the event at once).
struct ArmDoorbellCounts {
    std::uint64_t seen = 0;
    std::uint64_t completion_waiting = 0;
};
ArmDoorbellCounts arm_doorbell_counts() noexcept;
}  // namespace rdmachan::emulated
