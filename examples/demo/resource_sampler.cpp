#include "examples/demo/resource_sampler.hpp"

#include <dirent.h>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <numeric>

namespace demo {

std::uint64_t resident_kib(pid_t process) {
    std::ifstream status("/proc/" + std::to_string(process) + "/status");
    std::string line;
    while (std::getline(status, line)) {
        if (line.rfind("VmRSS:", 0) == 0) return std::strtoull(line.c_str() + 6, nullptr, 10);
    }
    return 0;
}

std::uint32_t open_descriptors(pid_t process) {
    const std::string path = "/proc/" + std::to_string(process) + "/fd";
    DIR* directory = opendir(path.c_str());
    if (directory == nullptr) return 0;
    std::uint32_t count = 0;
    while (const dirent* entry = readdir(directory)) {
        if (entry->d_name[0] != '.') ++count;
    }
    closedir(directory);
    return count;
}

ResourceSample sample_resources(const std::vector<pid_t>& processes, double seconds) {
    ResourceSample sample;
    sample.seconds = seconds;
    for (const pid_t process : processes) {
        const std::uint64_t resident = process > 0 ? resident_kib(process) : 0;
        const std::uint32_t descriptors = process > 0 ? open_descriptors(process) : 0;
        if (resident == 0 || descriptors == 0) return ResourceSample{seconds, {}, {}};  // exited (or exiting)
        sample.resident_kib.push_back(resident);
        sample.descriptors.push_back(descriptors);
    }
    return sample;
}

std::string describe(const ResourceSample& sample) {
    std::string line = "t=" + std::to_string(static_cast<long long>(sample.seconds + 0.5)) + " s  RSS KiB: total " +
                       std::to_string(std::accumulate(sample.resident_kib.begin(), sample.resident_kib.end(), 0ull)) + " (";
    for (std::size_t rank = 0; rank < sample.resident_kib.size(); ++rank)
        line += (rank == 0 ? "r" : ", r") + std::to_string(rank) + " " + std::to_string(sample.resident_kib[rank]);
    line += ")  descriptors: total " +
            std::to_string(std::accumulate(sample.descriptors.begin(), sample.descriptors.end(), 0u)) + " (";
    for (std::size_t rank = 0; rank < sample.descriptors.size(); ++rank)
        line += (rank == 0 ? "r" : ", r") + std::to_string(rank) + " " + std::to_string(sample.descriptors[rank]);
    return line + ")";
}

nlohmann::json samples_json(const std::vector<ResourceSample>& samples) {
    nlohmann::json result = nlohmann::json::object();
    nlohmann::json rows = nlohmann::json::array();
    for (const ResourceSample& sample : samples) {
        rows.push_back({{"seconds", sample.seconds}, {"resident_kib", sample.resident_kib}, {"descriptors", sample.descriptors}});
    }
    result["samples"] = rows;
    if (samples.size() >= 2) {
        const std::size_t settled_index = samples.size() >= 3 ? 1 : 0;
        const ResourceSample& settled = samples[settled_index];
        std::int64_t largest_growth_kib = 0;
        std::int64_t descriptor_growth = 0;
        for (std::size_t later = settled_index + 1; later < samples.size(); ++later) {
            const ResourceSample& sample = samples[later];
            for (std::size_t rank = 0; rank < settled.resident_kib.size() && rank < sample.resident_kib.size(); ++rank) {
                largest_growth_kib = std::max<std::int64_t>(
                    largest_growth_kib, static_cast<std::int64_t>(sample.resident_kib[rank]) - static_cast<std::int64_t>(settled.resident_kib[rank]));
                descriptor_growth = std::max<std::int64_t>(
                    descriptor_growth, static_cast<std::int64_t>(sample.descriptors[rank]) - static_cast<std::int64_t>(settled.descriptors[rank]));
            }
        }
        result["largest_rss_growth_kib"] = largest_growth_kib;
        result["largest_descriptor_growth"] = descriptor_growth;
    }
    return result;
}

}  // namespace demo
