#include "tools/bench/bench_options.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>

#include "rdmachan/multi_channel.hpp"

namespace bench {

Parsed parse_options(int argc, char** argv) {
    Parsed parsed;
    Options& options = parsed.options;
    CLI::App app{"rdmachan-bench: RDMA write/read/send latency and bandwidth between local processes through "
                 "rdmachan (perftest-style columns). Rank 0 measures; the other ranks answer."};
    app.add_option("--test,-t", options.test, "write | read | send")->check(CLI::IsMember({"write", "read", "send"}));
    app.add_flag("--bw", options.bandwidth, "bandwidth (many requests in flight) instead of latency");
    std::uint32_t size = 0;
    auto* size_option = app.add_option("--size,-s", size, "message size in bytes")->check(CLI::Range(1u, 16u << 20));
    bool sweep = false;
    app.add_flag("--sweep,-a", sweep, "every power of two from 8 B to 1 MiB");
    app.add_option("--iterations,-n", options.iterations, "iterations per size")->check(CLI::Range(1u, 100000000u));
    app.add_option("--warmup,-w", options.warmup, "iterations run and not measured before each size (as ucx_perftest -w)")
        ->check(CLI::Range(0u, 100000000u));
    app.add_option("--window", options.window, "bandwidth: requests per batch (one doorbell)")
        ->check(CLI::Range(1u, 1024u));
    app.add_option("--mode", options.mode, "rc | dc")->check(CLI::IsMember({"rc", "dc"}));
    app.add_option("--peers", options.peers, "processes, rank 0 included (latency uses rank 1 only)")
        ->check(CLI::Range(2u, 64u));
    app.add_option("--device", options.device, "auto | soft | a verbs device name");
    app.add_option("--memory", options.memory,
                   "allocated (allocate_memory, the default) | heap (a vector given to register_memory)")
        ->check(CLI::IsMember({"allocated", "heap"}));
    app.add_option("--format", options.format, "table | json | csv")->check(CLI::IsMember({"table", "json", "csv"}));
    app.add_option("--wait", options.wait, "spin (the default) | adaptive | event: how completion waits pass time")
        ->check(CLI::IsMember({"spin", "adaptive", "event"}));
    app.add_option("--cpus", options.cpus, "pin rank r to the r-th CPU of this list (comma separated)")->delimiter(',');
    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
        parsed.exit_code = app.exit(error);
        return parsed;
    }
    // DC sends land in the target's engine-owned receive buffers, which bound their size.
    const bool bounded = options.test == "send" && options.mode == "dc";
    if (sweep) {
        options.sizes.clear();
        const std::uint32_t largest = bounded ? rdmachan::kDcMaxSendBytes : 1u << 20;
        for (std::uint32_t bytes = 8; bytes <= largest; bytes *= 2) options.sizes.push_back(bytes);
    } else if (size_option->count() != 0) {
        options.sizes = {size};
    }
    if (bounded && options.sizes.back() > rdmachan::kDcMaxSendBytes) {
        std::fprintf(stderr, "rdmachan-bench: --size %u: a send in DC mode carries at most %u bytes (the DC target's receive buffers)\n",
                     options.sizes.back(), rdmachan::kDcMaxSendBytes);
        parsed.exit_code = 2;
    }
    return parsed;
}

}  // namespace bench
