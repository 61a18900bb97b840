// rdmachan-demo's command line: what to run (a local job, one peer of a job, a standalone
// rendezvous) and the workload's settings.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>

namespace demo {

enum class Command { local, peer, rendezvous, elastic_member };

struct Workload {
    std::string mode = "rc";       // rc | dc
    std::uint32_t size = 65536;    // bytes of each slice, per peer
    std::uint32_t iterations = 20;
    std::string device = "auto";
    std::string wait = "adaptive";      // spin | adaptive | event: ChannelSettings::wait
    std::chrono::seconds timeout{120};  // the whole job, set-up included
    std::optional<std::uint32_t> fail_rank;  // test hook: that rank fails on purpose
    // Run for this long instead of `iterations` rounds (rank 0 decides when to stop and tells
    // the others in its control message); the local launcher then samples the peers' memory
    // and descriptors every `sample_period`.
    std::optional<std::chrono::seconds> duration;
    std::chrono::seconds sample_period{10};
};

struct Options {
    Command command = Command::local;
    Workload workload;
    bool json = false;
    std::uint32_t peers = 4;                    // local
    std::optional<std::uint32_t> rank;          // peer
    std::optional<std::uint32_t> world_size;    // peer, rendezvous
    std::optional<std::string> rendezvous;      // peer: host:port
    std::string job = "rdmachan-demo";          // peer, rendezvous
    std::string bind = "127.0.0.1";             // rendezvous
    std::uint16_t port = 0;                     // rendezvous
    bool report_events = false;                 // peer started by the local launcher
    std::string bootstrap = "tcp";              // local: tcp (the rendezvous) | etcd (with --elastic)
    bool elastic = false;                       // local: members join and leave during the run
    std::uint32_t churn = 4;                    // elastic: changes after the first members joined
};

// Parses argv. Returns the options, or an exit code when parsing ended the program (help
// printed: 0; a bad option: 2, with a message naming it on stderr).
struct Parsed {
    Options options;
    std::optional<int> exit_code;
};
Parsed parse_options(int argc, char** argv);

// "600", "600s", "10m", "1h": seconds; nullopt when the text is none of these or is 0.
std::optional<std::chrono::seconds> parse_duration(const std::string& text);

}  // namespace demo
