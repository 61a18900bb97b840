// Per-peer figures a channel keeps as it works: readable at any time from the thread that uses
// the channel, printed by the demo and the benchmark.
#pragma once

#include <cstdint>

namespace rdmachan {

struct PeerCounters {
    std::uint64_t operations = 0;   // completed successfully
    std::uint64_t bytes = 0;        // moved by those operations (sent, written, read, received)
    std::uint64_t errors = 0;       // completed with an error (flushes included)
    std::uint32_t outstanding = 0;  // posted and not completed yet
};

}  // namespace rdmachan
