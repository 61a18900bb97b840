// rdmachan-bench's command line, perftest style: which test (write, read, send), latency or
// bandwidth, one size or a sweep, iterations, window, RC or DC, peers, output format, pinning.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace bench {

struct Options {
    std::string test = "write";  // write | read | send
    bool bandwidth = false;      // --bw; latency otherwise
    std::vector<std::uint32_t> sizes{8};
    std::uint32_t iterations = 1000;
    std::uint32_t warmup = 0;  // iterations run and discarded before each size's measurement
    std::uint32_t window = 64;  // bandwidth: requests per doorbell batch
    std::string mode = "rc";
    std::uint32_t peers = 2;  // ranks including rank 0 (the measuring side)
    std::string device = "auto";
    // allocated: buffers from allocate_memory (on the software device, memory same-host peers
    // map, as ucx_perftest's come from ucp_mem_map); heap: a vector registered with
    // register_memory, as an application registering memory of its own.
    std::string memory = "allocated";
    std::string format = "table";  // table | json | csv
    std::vector<int> cpus;          // --cpus 0,1: rank r pinned to cpus[r % size]
    // How the channels' completion waits pass time (ChannelSettings::wait). Spin by default: the
    // bench measures the data path, as ucx_perftest busy-polls.
    std::string wait = "spin";  // spin | adaptive | event
};

struct Parsed {
    Options options;
    std::optional<int> exit_code;
};
Parsed parse_options(int argc, char** argv);

}  // namespace bench
