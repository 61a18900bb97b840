// rdmachan-demo: with no subcommand, starts --peers local peers (4 by default) on the default
// device, connects them through the rendezvous, runs the workload (examples/demo/
// peer_workload.hpp), verifies every byte and prints a per-peer summary. `peer` runs one peer
// of a job started by Slurm, torchrun, mpirun or by hand; `rendezvous` runs the server those
// peers meet at (under a PMIx launcher such as mpirun, peers meet through PMIx instead).
// `--bootstrap etcd --elastic` runs a service whose members join and leave while the others keep
// working (examples/demo/elastic_launcher.hpp). Any failure: exit status 1 and a message naming the rank and what failed.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>

#include "examples/demo/demo_options.hpp"
#include "examples/demo/elastic_launcher.hpp"
#include "examples/demo/elastic_member.hpp"
#include "examples/demo/local_launcher.hpp"
#include "examples/demo/peer_workload.hpp"
#include "rdmachan/bootstrap.hpp"
#include "rdmachan/launcher_environment.hpp"
#include "rdmachan/rendezvous.hpp"

namespace {

// Events for the local launcher: one JSON object per line on stdout.
void emit(const nlohmann::json& event) {
    std::printf("%s\n", event.dump().c_str());
    std::fflush(stdout);
}

int run_peer_command(const demo::Options& options) {
    rdmachan::LaunchArguments arguments{options.rank, options.world_size, options.rendezvous};
    std::uint32_t rank = options.rank.value_or(0);
    try {
        const rdmachan::LaunchEnvironment environment = rdmachan::discover_launch_environment(arguments);
        if (environment.rank) rank = *environment.rank;
        // Under a PMIx launcher (mpirun, srun --mpi=pmix) PMIx gives rank, world size and the
        // exchange, and the launcher authenticates the job: no rendezvous, no token.
        const bool pmix = rdmachan::choose_bootstrap(rdmachan::Bootstrap::automatic).bootstrap == rdmachan::Bootstrap::pmix;
        if (!pmix) {
            if (!environment.rank || !environment.world_size)
                throw std::runtime_error("no rank or world size: pass --rank and --world-size, or run under a launcher "
                                         "(Slurm, torchrun, mpirun) or with RDMACHAN_RANK / RDMACHAN_WORLD_SIZE");
            if (environment.rendezvous_host.empty() || !environment.rendezvous_port)
                throw std::runtime_error("no rendezvous address: pass --rendezvous host:port or set RDMACHAN_RENDEZVOUS "
                                         "(torchrun: MASTER_ADDR and MASTER_PORT), or run under a PMIx launcher");
            if (environment.job_token.empty())
                throw std::runtime_error("RDMACHAN_JOB_TOKEN is not set; `rdmachan-demo rendezvous` prints the token "
                                         "to export on every host");
        }
        const demo::PeerIdentity identity{pmix,
                                          environment.rank,
                                          environment.world_size,
                                          environment.rendezvous_host,
                                          environment.rendezvous_port.value_or(0),
                                          options.job,
                                          environment.job_token};
        auto progress = [&](const char* event, std::uint32_t iteration) {
            if (options.report_events) emit({{"event", event}, {"rank", rank}, {"iteration", iteration}});
        };
        const demo::PeerReport report = demo::run_peer(identity, options.workload, progress);
        if (options.report_events) {
            emit({{"event", "result"}, {"report", report}});
        } else if (options.json) {
            std::printf("%s\n", nlohmann::json(report).dump(2).c_str());
        } else {
            const auto world = static_cast<std::uint32_t>(report.counters.size());  // one per peer
            const demo::JobDescription job{world, options.workload.mode, options.workload.size,
                                           options.workload.iterations};
            std::printf("%s", demo::summary_table(job, {report}, report.seconds).c_str());
        }
        return 0;
    } catch (const std::exception& error) {
        const std::string text = error.what();
        std::fprintf(stderr, "rdmachan-demo peer (rank %u): %s\n", rank, text.c_str());
        // When it failed, on the host's monotonic clock (the local launcher's peers share it): the
        // launcher may read a peer that failed because of this one first. run_peer stamps its
        // failures before tearing its multi-channel down (demo::PeerFailure).
        const auto* failure = dynamic_cast<const demo::PeerFailure*>(&error);
        const auto at = (failure != nullptr ? failure->at() : std::chrono::steady_clock::now()).time_since_epoch();
        if (options.report_events) {
            emit({{"event", "failed"}, {"rank", rank}, {"error", text},
                  {"at_ns", std::chrono::duration_cast<std::chrono::nanoseconds>(at).count()}});
        }
        return 1;
    }
}

int run_rendezvous_command(const demo::Options& options) {
    try {
        std::string token;
        if (const char* from_environment = std::getenv("RDMACHAN_JOB_TOKEN"); from_environment && *from_environment) {
            token = from_environment;
        } else {
            token = rdmachan::generate_job_token();
            std::printf("export RDMACHAN_JOB_TOKEN=%s\n", token.c_str());
        }
        rdmachan::RendezvousServerSettings settings;
        settings.bind_address = options.bind;
        settings.port = options.port;
        settings.world_size = *options.world_size;
        settings.job = options.job;
        settings.token = token;
        settings.timeout = options.workload.timeout;
        rdmachan::RendezvousServer server(settings);
        std::printf("rendezvous for job '%s': %u ranks, listening on %s:%u\n", options.job.c_str(),
                    settings.world_size, options.bind.c_str(), server.port());
        std::fflush(stdout);
        server.run();
        std::printf("rendezvous for job '%s': all %u ranks met\n", options.job.c_str(), settings.world_size);
        return 0;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "rdmachan-demo rendezvous: %s\n", error.what());
        return 1;
    }
}

}  // namespace

int main(int argc, char** argv) {
    const demo::Parsed parsed = demo::parse_options(argc, argv);
    if (parsed.exit_code) return *parsed.exit_code;
    const demo::Options& options = parsed.options;
    switch (options.command) {
        case demo::Command::peer: return run_peer_command(options);
        case demo::Command::rendezvous: return run_rendezvous_command(options);
        case demo::Command::elastic_member: return demo::run_elastic_member(options);
        case demo::Command::local: break;
    }
    try {
        if (options.elastic) return demo::run_elastic_job(options);
        return demo::run_local_job(options);
    } catch (const std::exception& error) {
        std::fprintf(stderr, "rdmachan-demo: %s\n", error.what());
        return 1;
    }
}
