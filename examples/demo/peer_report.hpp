// What one peer reports at the end of the workload, as JSON (the launcher collects one line per
// peer) and as rows of the summary table.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace demo {

struct PeerCounterRow {
    std::uint32_t peer = 0;
    std::uint64_t operations = 0;
    std::uint64_t bytes = 0;
    std::uint64_t errors = 0;
};

struct PeerReport {
    std::uint32_t rank = 0;
    std::string device;
    std::uint64_t bytes = 0;       // written, read and sent by this rank
    std::uint64_t operations = 0;  // completed operations, all peers
    double latency_p50_us = 0;     // one iteration's scatter_write, all peers
    double latency_p99_us = 0;
    double throughput_mb_s = 0;    // bytes / workload seconds
    double seconds = 0;
    double cpu_seconds = 0;        // the process's CPU time over the workload, every thread
    std::vector<PeerCounterRow> counters;  // MultiChannel::counters(peer), per peer
};

void to_json(nlohmann::json& json, const PeerCounterRow& row);
void from_json(const nlohmann::json& json, PeerCounterRow& row);
void to_json(nlohmann::json& json, const PeerReport& report);
void from_json(const nlohmann::json& json, PeerReport& report);

struct JobDescription {
    std::uint32_t peers = 0;
    std::string mode;
    std::uint32_t size = 0;
    std::uint32_t iterations = 0;
};

// Every rank's bytes over the longest rank's workload time: what the job moved per second while
// all of it ran.
double aggregate_throughput_mb_s(const std::vector<PeerReport>& reports);

// The human-readable summary: one row per rank, then the per-peer counters.
std::string summary_table(const JobDescription& job, const std::vector<PeerReport>& reports, double wall_seconds);
nlohmann::json summary_json(const JobDescription& job, const std::vector<PeerReport>& reports, double wall_seconds);

// p-th percentile (0..100) of samples, nearest rank; 0 for no samples.
double percentile(std::vector<double> samples, double p);

}  // namespace demo
