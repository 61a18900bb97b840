// What a long demo run watches in its peers: resident memory and open descriptors,
// read from /proc every sampling period, so a leak shows as growth over the run.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace demo {

struct ResourceSample {
    double seconds = 0;                       // since the job started
    std::vector<std::uint64_t> resident_kib;  // per rank (VmRSS); 0 when the peer has exited
    std::vector<std::uint32_t> descriptors;   // per rank (entries of /proc/PID/fd)
};

// VmRSS of a process in KiB, 0 when it cannot be read (the process is gone).
std::uint64_t resident_kib(pid_t process);
// Open descriptors of a process, 0 when they cannot be listed.
std::uint32_t open_descriptors(pid_t process);

// Empty (no ranks) when a process could not be read: a peer that has just finished is not
// sampled as 0 KiB.
ResourceSample sample_resources(const std::vector<pid_t>& processes, double seconds);

// One line: "t=10 s  RSS KiB: total T (r0 A, r1 B, ...)  descriptors: total D (r0 a, ...)".
std::string describe(const ResourceSample& sample);

// The samples, and the largest growth of one peer above its settled sample in any later one:
// largest_rss_growth_kib, largest_descriptor_growth. The settled sample is the second when
// there are three or more, else the first. The first is taken one period after every peer
// connected, but can still come before a peer reached its working set (under ThreadSanitizer,
// whose shadow memory grows as the program first touches it, resident size rose 1540 KiB
// between the first two samples of a CI run and stayed flat after).
nlohmann::json samples_json(const std::vector<ResourceSample>& samples);

}  // namespace demo
