// rdmachan-bench: forks one process per rank on this machine (rank 0 measures, the others
// answer), connects them through a rendezvous it hosts, and prints perftest-style results.
//   rdmachan-bench -t write            8-byte write latency, RC, 2 processes
//   rdmachan-bench -t write --bw -a    write bandwidth, sizes 8 B .. 1 MiB
//   rdmachan-bench -t read --bw --peers 4 --mode dc --format json
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "rdmachan/launcher_environment.hpp"
#include "rdmachan/rendezvous.hpp"
#include "tools/bench/bench_output.hpp"
#include "tools/bench/bench_run.hpp"

namespace {

void pin(const std::vector<int>& cpus, std::uint32_t rank) {
    if (cpus.empty()) return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpus[rank % cpus.size()], &set);
    if (sched_setaffinity(0, sizeof set, &set) != 0) std::perror("rdmachan-bench: sched_setaffinity");
}

bool write_all(int descriptor, const std::string& text) {
    for (std::size_t done = 0; done < text.size();) {
        const ssize_t wrote = write(descriptor, text.data() + done, text.size() - done);
        if (wrote <= 0) return false;
        done += static_cast<std::size_t>(wrote);
    }
    return true;
}

}  // namespace

int main(int argc, char** argv) {
    const bench::Parsed parsed = bench::parse_options(argc, argv);
    if (parsed.exit_code) return *parsed.exit_code;
    const bench::Options& options = parsed.options;
    const std::string token = rdmachan::generate_job_token();
    try {
        rdmachan::RendezvousServer server({"127.0.0.1", 0, options.peers, "rdmachan-bench", token, std::chrono::seconds(60)});
        const std::uint16_t port = server.port();
        int result_pipe[2];
        if (pipe(result_pipe) != 0) throw std::runtime_error("pipe failed");
        std::vector<pid_t> children;
        // Children are forked before the server thread exists (see run_children in the tests).
        for (std::uint32_t rank = 0; rank < options.peers; ++rank) {
            const pid_t child = fork();
            if (child == 0) {
                close(result_pipe[0]);
                int status = 0;
                try {
                    pin(options.cpus, rank);
                    const bench::RankOutcome outcome = bench::run_rank(options, {rank, port, token});
                    if (rank == 0 && !write_all(result_pipe[1], bench::to_json(outcome).dump())) status = 3;
                } catch (const std::exception& error) {
                    std::fprintf(stderr, "rdmachan-bench: rank %u: %s\n", rank, error.what());
                    status = 1;
                }
                close(result_pipe[1]);
                std::fflush(stdout);
                _exit(status);
            }
            children.push_back(child);
        }
        close(result_pipe[1]);
        server.start();
        std::string text;
        char chunk[4096];
        for (ssize_t got; (got = read(result_pipe[0], chunk, sizeof chunk)) > 0;) text.append(chunk, static_cast<std::size_t>(got));
        close(result_pipe[0]);
        int failures = 0;
        for (std::size_t rank = 0; rank < children.size(); ++rank) {
            int status = 0;
            waitpid(children[rank], &status, 0);
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                std::fprintf(stderr, "rdmachan-bench: rank %zu failed\n", rank);
                ++failures;
            }
        }
        if (failures != 0 || text.empty()) return 1;
        server.wait();
        const bench::RankOutcome outcome = bench::outcome_from_json(nlohmann::json::parse(text));
        if (options.format == "json") {
            std::printf("%s\n", bench::to_json(outcome).dump(2).c_str());
        } else if (options.format == "csv") {
            std::printf("%s", bench::format_csv(outcome).c_str());
        } else {
            std::printf("%s", bench::format_table(options, outcome).c_str());
        }
        return 0;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "rdmachan-bench: %s\n", error.what());
        return 1;
    }
}
