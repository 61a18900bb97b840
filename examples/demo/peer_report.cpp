#include "examples/demo/peer_report.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace demo {

void to_json(nlohmann::json& json, const PeerCounterRow& row) {
    json = {{"peer", row.peer}, {"operations", row.operations}, {"bytes", row.bytes}, {"errors", row.errors}};
}

void from_json(const nlohmann::json& json, PeerCounterRow& row) {
    row.peer = json.at("peer").get<std::uint32_t>();
    row.operations = json.at("operations").get<std::uint64_t>();
    row.bytes = json.at("bytes").get<std::uint64_t>();
    row.errors = json.at("errors").get<std::uint64_t>();
}

void to_json(nlohmann::json& json, const PeerReport& report) {
    json = {{"rank", report.rank},
            {"device", report.device},
            {"bytes", report.bytes},
            {"operations", report.operations},
            {"latency_p50_us", report.latency_p50_us},
            {"latency_p99_us", report.latency_p99_us},
            {"throughput_mb_s", report.throughput_mb_s},
            {"seconds", report.seconds},
            {"cpu_seconds", report.cpu_seconds},
            {"counters", report.counters}};
}

void from_json(const nlohmann::json& json, PeerReport& report) {
    report.rank = json.at("rank").get<std::uint32_t>();
    report.device = json.at("device").get<std::string>();
    report.bytes = json.at("bytes").get<std::uint64_t>();
    report.operations = json.at("operations").get<std::uint64_t>();
    report.latency_p50_us = json.at("latency_p50_us").get<double>();
    report.latency_p99_us = json.at("latency_p99_us").get<double>();
    report.throughput_mb_s = json.at("throughput_mb_s").get<double>();
    report.seconds = json.at("seconds").get<double>();
    report.cpu_seconds = json.at("cpu_seconds").get<double>();
    report.counters = json.at("counters").get<std::vector<PeerCounterRow>>();
}

double percentile(std::vector<double> samples, double p) {
    if (samples.empty()) return 0;
    std::sort(samples.begin(), samples.end());
    const auto rank = static_cast<std::size_t>(std::ceil(p / 100.0 * static_cast<double>(samples.size())));
    return samples[std::clamp<std::size_t>(rank, 1, samples.size()) - 1];
}

namespace {

std::string format(const char* pattern, auto... values) {
    char line[512];
    std::snprintf(line, sizeof line, pattern, values...);
    return line;
}

std::string megabytes(std::uint64_t bytes) { return format("%.2f MB", static_cast<double>(bytes) / 1e6); }

}  // namespace

double aggregate_throughput_mb_s(const std::vector<PeerReport>& reports) {
    std::uint64_t bytes = 0;
    double longest = 0;
    for (const PeerReport& report : reports) {
        bytes += report.bytes;
        longest = std::max(longest, report.seconds);
    }
    return longest > 0 ? static_cast<double>(bytes) / longest / 1e6 : 0;
}

std::string summary_table(const JobDescription& job, const std::vector<PeerReport>& reports, double wall_seconds) {
    std::string text;
    const std::string device = reports.empty() ? "?" : reports.front().device;
    text += format("rdmachan-demo: %u peers, mode %s, device %s, %u-byte slices, %u iterations, %.2f s: every byte "
                   "verified\n\n",
                   job.peers, job.mode.c_str(), device.c_str(), job.size, job.iterations, wall_seconds);
    text += format("%6s %14s %12s %12s %12s %18s %12s\n", "rank", "bytes moved", "operations", "p50 (us)", "p99 (us)",
                   "throughput (MB/s)", "CPU (s)");
    std::uint64_t total_bytes = 0, total_operations = 0;
    for (const PeerReport& report : reports) {
        text += format("%6u %14s %12llu %12.1f %12.1f %18.1f %12.3f\n", report.rank, megabytes(report.bytes).c_str(),
                       static_cast<unsigned long long>(report.operations), report.latency_p50_us,
                       report.latency_p99_us, report.throughput_mb_s, report.cpu_seconds);
        total_bytes += report.bytes;
        total_operations += report.operations;
    }
    text += format("%6s %14s %12llu %12s %12s %18.1f\n", "all", megabytes(total_bytes).c_str(),
                   static_cast<unsigned long long>(total_operations), "", "", aggregate_throughput_mb_s(reports));
    text += "\nper-peer counters (MultiChannel::counters): operations / bytes / errors, by rank (row) and peer\n";
    for (const PeerReport& report : reports) {
        text += format("  rank %2u:", report.rank);
        for (const PeerCounterRow& row : report.counters) {
            text += format(" [%u] %llu/%s/%llu", row.peer, static_cast<unsigned long long>(row.operations),
                           megabytes(row.bytes).c_str(), static_cast<unsigned long long>(row.errors));
        }
        text += "\n";
    }
    return text;
}

nlohmann::json summary_json(const JobDescription& job, const std::vector<PeerReport>& reports, double wall_seconds) {
    return {{"ok", true},          {"peers", job.peers},           {"mode", job.mode},
            {"size", job.size},    {"iterations", job.iterations}, {"wall_seconds", wall_seconds},
            {"aggregate_throughput_mb_s", aggregate_throughput_mb_s(reports)},
            {"ranks", reports}};
}

}  // namespace demo
