#include "tools/bench/bench_output.hpp"

#include <cstdio>

namespace bench {
namespace {

std::string line(const char* pattern, auto... values) {
    char text[512];
    std::snprintf(text, sizeof text, pattern, values...);
    return text;
}

}  // namespace

nlohmann::json to_json(const RankOutcome& outcome) {
    nlohmann::json rows = nlohmann::json::array();
    for (const Row& row : outcome.rows) {
        rows.push_back({{"test", row.test},
                        {"kind", row.bandwidth ? "bw" : "lat"},
                        {"mode", row.mode},
                        {"peers", row.peers},
                        {"bytes", row.bytes},
                        {"iterations", row.iterations},
                        {"t_min_us", row.t_min},
                        {"t_max_us", row.t_max},
                        {"t_typical_us", row.t_typical},
                        {"t_avg_us", row.t_average},
                        {"t_stdev_us", row.t_stdev},
                        {"t_p99_us", row.t_p99},
                        {"bw_peak_mb_s", row.bw_peak},
                        {"bw_average_mb_s", row.bw_average},
                        {"message_rate_mpps", row.message_rate}});
    }
    nlohmann::json counters = nlohmann::json::array();
    for (std::size_t peer = 0; peer < outcome.counters.size(); ++peer) {
        const rdmachan::PeerCounters& entry = outcome.counters[peer];
        counters.push_back({{"peer", peer}, {"operations", entry.operations}, {"bytes", entry.bytes}, {"errors", entry.errors}});
    }
    return {{"rows", rows}, {"counters", counters}};
}

RankOutcome outcome_from_json(const nlohmann::json& json) {
    RankOutcome outcome;
    for (const nlohmann::json& entry : json.at("rows")) {
        Row row;
        row.test = entry.at("test");
        row.bandwidth = entry.at("kind") == "bw";
        row.mode = entry.at("mode");
        row.peers = entry.at("peers");
        row.bytes = entry.at("bytes");
        row.iterations = entry.at("iterations");
        row.t_min = entry.at("t_min_us");
        row.t_max = entry.at("t_max_us");
        row.t_typical = entry.at("t_typical_us");
        row.t_average = entry.at("t_avg_us");
        row.t_stdev = entry.at("t_stdev_us");
        row.t_p99 = entry.at("t_p99_us");
        row.bw_peak = entry.at("bw_peak_mb_s");
        row.bw_average = entry.at("bw_average_mb_s");
        row.message_rate = entry.at("message_rate_mpps");
        outcome.rows.push_back(row);
    }
    for (const nlohmann::json& entry : json.at("counters")) {
        rdmachan::PeerCounters counters;
        counters.operations = entry.at("operations");
        counters.bytes = entry.at("bytes");
        counters.errors = entry.at("errors");
        outcome.counters.push_back(counters);
    }
    return outcome;
}

std::string format_table(const Options& options, const RankOutcome& outcome) {
    std::string text = line("rdmachan-bench: RDMA %s %s, mode %s, %u processes, device %s\n", options.test.c_str(),
                            options.bandwidth ? "bandwidth" : "latency", options.mode.c_str(), options.peers,
                            options.device.c_str());
    text += "---------------------------------------------------------------------------------------\n";
    if (options.bandwidth) {
        text += line(" %-10s %-12s %-18s %-21s %-14s\n", "#bytes", "#iterations", "BW peak[MB/sec]",
                     "BW average[MB/sec]", "MsgRate[Mpps]");
        for (const Row& row : outcome.rows)
            text += line(" %-10u %-12u %-18.2f %-21.2f %-14.6f\n", row.bytes, row.iterations, row.bw_peak,
                         row.bw_average, row.message_rate);
    } else {
        text += line(" %-8s %-12s %-11s %-11s %-15s %-11s %-13s %-14s\n", "#bytes", "#iterations", "t_min[usec]",
                     "t_max[usec]", "t_typical[usec]", "t_avg[usec]", "t_stdev[usec]", "99% percentile[usec]");
        for (const Row& row : outcome.rows)
            text += line(" %-8u %-12u %-11.2f %-11.2f %-15.2f %-11.2f %-13.2f %-14.2f\n", row.bytes, row.iterations,
                         row.t_min, row.t_max, row.t_typical, row.t_average, row.t_stdev, row.t_p99);
    }
    text += "---------------------------------------------------------------------------------------\n";
    text += "per-peer counters of rank 0 (operations / bytes / errors):";
    for (std::size_t peer = 0; peer < outcome.counters.size(); ++peer) {
        const rdmachan::PeerCounters& entry = outcome.counters[peer];
        text += line(" [%zu] %llu/%llu/%llu", peer, static_cast<unsigned long long>(entry.operations),
                     static_cast<unsigned long long>(entry.bytes), static_cast<unsigned long long>(entry.errors));
    }
    return text + "\n";
}

std::string format_csv(const RankOutcome& outcome) {
    std::string text =
        "test,kind,mode,peers,bytes,iterations,t_min_us,t_max_us,t_typical_us,t_avg_us,t_stdev_us,t_p99_us,"
        "bw_peak_mb_s,bw_average_mb_s,message_rate_mpps\n";
    for (const Row& row : outcome.rows) {
        text += line("%s,%s,%s,%u,%u,%u,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.3f,%.6f\n", row.test.c_str(),
                     row.bandwidth ? "bw" : "lat", row.mode.c_str(), row.peers, row.bytes, row.iterations, row.t_min,
                     row.t_max, row.t_typical, row.t_average, row.t_stdev, row.t_p99, row.bw_peak, row.bw_average,
                     row.message_rate);
    }
    return text;
}

}  // namespace bench
