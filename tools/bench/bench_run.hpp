// One rank of rdmachan-bench: connect through the rendezvous, then for every size either measure
// (rank 0) or answer (the others). Rank 0 returns the rows.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "rdmachan/peer_counters.hpp"
#include "tools/bench/bench_options.hpp"

namespace bench {

struct Row {
    std::string test;
    bool bandwidth = false;
    std::string mode;
    std::uint32_t peers = 2;
    std::uint32_t bytes = 0;
    std::uint32_t iterations = 0;
    // Latency (microseconds; one-way = half the round trip for write and send ping-pong, the
    // whole operation for read, as perftest reports them). A write's round trip runs from its
    // post to the answer's marker; its own completion is taken after, before the next write, as
    // ucx_perftest's put ping-pong does with its one outstanding put.
    double t_min = 0, t_max = 0, t_typical = 0, t_average = 0, t_stdev = 0, t_p99 = 0;
    // Bandwidth (MB/s = 10^6 bytes per second) and message rate (millions per second).
    double bw_peak = 0, bw_average = 0, message_rate = 0;
};

struct RankOutcome {
    std::vector<Row> rows;                       // rank 0 only
    std::vector<rdmachan::PeerCounters> counters;  // rank 0: per peer
};

struct RankIdentity {
    std::uint32_t rank = 0;
    std::uint16_t rendezvous_port = 0;
    std::string token;
};

RankOutcome run_rank(const Options& options, const RankIdentity& identity);

}  // namespace bench
