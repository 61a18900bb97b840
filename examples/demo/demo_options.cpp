#include "examples/demo/demo_options.hpp"

#include <CLI/CLI.hpp>
#include <cstdio>

namespace demo {
namespace {

void add_workload_options(CLI::App& app, Workload& workload, bool& json) {
    app.add_option("--mode", workload.mode, "rc: a queue pair per peer; dc: DC initiators + one DC target")
        ->check(CLI::IsMember({"rc", "dc"}));
    app.add_option("--size", workload.size, "bytes of each per-peer slice")->check(CLI::Range(1u, 64u << 20));
    app.add_option("--iterations", workload.iterations, "rounds of the workload")->check(CLI::Range(1u, 1000000u));
    app.add_option("--device", workload.device, "auto | soft | a verbs device name");
    app.add_option("--wait", workload.wait, "spin | adaptive (the default) | event: how the peers' waits pass time")
        ->check(CLI::IsMember({"spin", "adaptive", "event"}));
    app.add_option_function<std::uint32_t>(
           "--timeout", [&workload](std::uint32_t seconds) { workload.timeout = std::chrono::seconds(seconds); },
           "seconds for the whole job, set-up included (default 120)")
        ->check(CLI::Range(1u, 86400u));
    app.add_option_function<std::uint32_t>(
           "--fail-rank", [&workload](std::uint32_t rank) { workload.fail_rank = rank; },
           "(testing) this rank fails on purpose after connecting")
        ->group("");  // hidden
    app.add_option_function<std::string>(
           "--duration",
           [&workload](const std::string& text) {
               workload.duration = parse_duration(text);
               if (!workload.duration)
                   throw CLI::ValidationError("--duration", "'" + text + "' is not a duration: seconds, or a number with s, m or h (10m), at most 7 days");
           },
           "run this long instead of --iterations rounds: seconds, or with s, m or h (10m); samples the peers' memory and "
           "descriptors every 10 s");
    app.add_option_function<std::uint32_t>(
           "--sample-period", [&workload](std::uint32_t seconds) { workload.sample_period = std::chrono::seconds(seconds); },
           "(testing) seconds between samples with --duration")
        ->check(CLI::Range(1u, 3600u))
        ->group("");  // hidden
    app.add_flag("--json", json, "print the result as JSON");
}

}  // namespace

std::optional<std::chrono::seconds> parse_duration(const std::string& text) {
    if (text.empty() || text.size() > 12) return std::nullopt;
    std::size_t digits = 0;
    while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9') ++digits;
    if (digits == 0 || text.size() - digits > 1) return std::nullopt;
    const unsigned long long number = std::stoull(text.substr(0, digits));
    unsigned long long unit = 1;
    if (digits < text.size()) {
        switch (text[digits]) {
            case 's': unit = 1; break;
            case 'm': unit = 60; break;
            case 'h': unit = 3600; break;
            default: return std::nullopt;
        }
    }
    const unsigned long long seconds = number * unit;
    if (seconds == 0 || seconds > 7ull * 24 * 3600) return std::nullopt;
    return std::chrono::seconds(seconds);
}

Parsed parse_options(int argc, char** argv) {
    Parsed parsed;
    Options& options = parsed.options;
    CLI::App app{
        "rdmachan-demo: peers exchange per-peer buffers over RDMA (scatter_write, gather_read, multicast_send, "
        "immediates) and verify every byte.\nWith no subcommand it starts --peers local peers."};
    app.require_subcommand(0, 1);
    add_workload_options(app, options.workload, options.json);
    app.add_option("--peers", options.peers, "local peers to start (default 4)")->check(CLI::Range(1u, 64u));
    app.add_option("--bootstrap", options.bootstrap,
                   "tcp: the peers meet at a rendezvous (the default); etcd: members found through etcd (RDMACHAN_ETCD, "
                   "else a local etcd-server started for the run), with --elastic")
        ->check(CLI::IsMember({"tcp", "etcd"}));
    app.add_flag("--elastic", options.elastic,
                 "members join and leave during the run while the others keep writing to every member and reading it "
                 "back; prints a table of the changes (needs --bootstrap etcd)");
    app.add_option("--churn", options.churn, "with --elastic: changes after the first --peers joined, one second apart: "
                                             "a leave, a join, a kill (SIGKILL), a join, and again (default 4)")
        ->check(CLI::Range(0u, 1000u));

    CLI::App* peer = app.add_subcommand(
        "peer", "run one peer of a job; rank, world size and rendezvous come from the flags or the launcher's "
                "environment (RDMACHAN_*, Slurm, torchrun, Open MPI, PMI); the token from RDMACHAN_JOB_TOKEN");
    add_workload_options(*peer, options.workload, options.json);
    peer->add_option_function<std::uint32_t>("--rank", [&options](std::uint32_t value) { options.rank = value; });
    peer->add_option_function<std::uint32_t>("--world-size",
                                             [&options](std::uint32_t value) { options.world_size = value; });
    peer->add_option_function<std::string>("--rendezvous",
                                           [&options](const std::string& value) { options.rendezvous = value; },
                                           "host:port of the rendezvous server");
    peer->add_option("--job", options.job, "job name (every peer and the rendezvous must agree)");
    peer->add_flag("--report-events", options.report_events, "(launcher) JSON events on stdout")->group("");

    CLI::App* rendezvous = app.add_subcommand(
        "rendezvous", "run a standalone rendezvous server for --world-size peers; prints the job token to export "
                      "as RDMACHAN_JOB_TOKEN unless it is already set");
    rendezvous->add_option_function<std::uint32_t>(
                   "--world-size", [&options](std::uint32_t value) { options.world_size = value; })
        ->required()
        ->check(CLI::Range(1u, 4096u));
    rendezvous->add_option("--bind", options.bind, "address to listen on (default 127.0.0.1)");
    rendezvous->add_option("--port", options.port, "port (default: any free one, printed)");
    rendezvous->add_option("--job", options.job, "job name");
    rendezvous->add_option_function<std::uint32_t>(
                   "--timeout",
                   [&options](std::uint32_t seconds) { options.workload.timeout = std::chrono::seconds(seconds); },
                   "seconds until every rank must have arrived (default 120)")
        ->check(CLI::Range(1u, 86400u));

    CLI::App* elastic_member = app.add_subcommand("elastic-member", "(launcher) one member of an --elastic run");
    elastic_member->group("");  // hidden
    add_workload_options(*elastic_member, options.workload, options.json);

    try {
        app.parse(argc, argv);
    } catch (const CLI::ParseError& error) {
        parsed.exit_code = app.exit(error);
        return parsed;
    }
    if (peer->parsed()) options.command = Command::peer;
    if (rendezvous->parsed()) options.command = Command::rendezvous;
    if (elastic_member->parsed()) options.command = Command::elastic_member;
    if (options.command == Command::local && (options.elastic != (options.bootstrap == "etcd"))) {
        std::fprintf(stderr, "rdmachan-demo: %s\n",
                     options.elastic ? "--elastic needs --bootstrap etcd (members find each other through etcd)"
                                     : "--bootstrap etcd runs an elastic service: add --elastic");
        parsed.exit_code = 2;
    }
    return parsed;
}

}  // namespace demo
