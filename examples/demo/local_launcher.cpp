#include "examples/demo/local_launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "examples/demo/peer_report.hpp"
#include "examples/demo/resource_sampler.hpp"
#include "rdmachan/launcher_environment.hpp"
#include "rdmachan/rendezvous.hpp"

extern char** environ;

namespace demo {
namespace {

using Clock = std::chrono::steady_clock;

struct Child {
    std::uint32_t rank = 0;
    pid_t pid = -1;
    int events = -1;  // read end of the peer's stdout
    std::string pending;
    bool connected = false;
    std::uint32_t iterations = 0;
    std::optional<PeerReport> report;
    std::string failure;
    // When this peer's failure was first seen (its "failed" event or an unclean exit): the
    // earliest one is the cause; the others usually failed because of it.
    std::optional<Clock::time_point> failed_at;
    std::string exit_description;
    bool exited = false;
};

std::vector<std::string> peer_arguments(const Options& options, std::uint32_t rank, const std::string& rendezvous) {
    const Workload& workload = options.workload;
    std::vector<std::string> arguments = {"rdmachan-demo",
                                          "peer",
                                          "--report-events",
                                          "--rank",
                                          std::to_string(rank),
                                          "--world-size",
                                          std::to_string(options.peers),
                                          "--rendezvous",
                                          rendezvous,
                                          "--job",
                                          options.job,
                                          "--mode",
                                          workload.mode,
                                          "--size",
                                          std::to_string(workload.size),
                                          "--iterations",
                                          std::to_string(workload.iterations),
                                          "--device",
                                          workload.device,
                                          "--wait",
                                          workload.wait,
                                          "--timeout",
                                          std::to_string(workload.timeout.count())};
    if (workload.duration) {
        arguments.push_back("--duration");
        arguments.push_back(std::to_string(workload.duration->count()));
    }
    if (workload.fail_rank) {
        arguments.push_back("--fail-rank");
        arguments.push_back(std::to_string(*workload.fail_rank));
    }
    return arguments;
}

// posix_spawn: no code of ours runs between fork and exec, so the rendezvous thread already
// running in this process cannot leave a lock held in the child.
Child spawn_peer(const Options& options, std::uint32_t rank, const std::string& rendezvous, const std::string& token) {
    int ends[2];
    if (pipe2(ends, O_CLOEXEC) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_adddup2(&actions, ends[1], STDOUT_FILENO);
    std::vector<std::string> arguments = peer_arguments(options, rank, rendezvous);
    std::vector<char*> argv;
    for (std::string& argument : arguments) argv.push_back(argument.data());
    argv.push_back(nullptr);
    // The peers meet at this launcher's rendezvous, even if it was itself started under PMIx.
    std::vector<std::string> environment_strings = {"RDMACHAN_JOB_TOKEN=" + token, "RDMACHAN_BOOTSTRAP=tcp"};
    for (char** entry = environ; *entry != nullptr; ++entry)
        if (std::strncmp(*entry, "RDMACHAN_JOB_TOKEN=", 19) != 0 && std::strncmp(*entry, "RDMACHAN_BOOTSTRAP=", 19) != 0)
            environment_strings.emplace_back(*entry);
    std::vector<char*> environment;
    for (std::string& entry : environment_strings) environment.push_back(entry.data());
    environment.push_back(nullptr);
    Child child;
    child.rank = rank;
    const int error = posix_spawn(&child.pid, "/proc/self/exe", &actions, nullptr, argv.data(), environment.data());
    posix_spawn_file_actions_destroy(&actions);
    close(ends[1]);
    if (error != 0) {
        close(ends[0]);
        throw std::runtime_error("starting rank " + std::to_string(rank) + ": " + std::strerror(error));
    }
    child.events = ends[0];
    return child;
}

void handle_event(Child& child, const std::string& line) {
    const nlohmann::json event = nlohmann::json::parse(line, nullptr, false);
    if (event.is_discarded() || !event.is_object() || !event.contains("event")) return;  // not ours
    const std::string kind = event["event"].get<std::string>();
    if (kind == "connected") child.connected = true;
    if (kind == "iteration") child.iterations = event.value("iteration", 0u);
    if (kind == "result") child.report = event.at("report").get<PeerReport>();
    if (kind == "failed") {
        child.failure = event.value("error", std::string("failed"));
        // The peer's own time of failure orders failures causally: the launcher reads peers that
        // failed together in descriptor order, which may put a consequence before its cause.
        const auto at = event.find("at_ns");
        if (at != event.end() && at->is_number_integer()) {
            child.failed_at = Clock::time_point(std::chrono::duration_cast<Clock::duration>(
                std::chrono::nanoseconds(at->get<std::int64_t>())));
        } else if (!child.failed_at) {
            child.failed_at = Clock::now();
        }
    }
}

// Reads what is available from one peer; false at end of stream.
bool read_events(Child& child) {
    char chunk[4096];
    const ssize_t got = read(child.events, chunk, sizeof chunk);
    if (got <= 0) return false;
    child.pending.append(chunk, static_cast<std::size_t>(got));
    for (std::size_t end; (end = child.pending.find('\n')) != std::string::npos;) {
        handle_event(child, child.pending.substr(0, end));
        child.pending.erase(0, end + 1);
    }
    return true;
}

std::string describe_exit(int status) {
    if (WIFEXITED(status)) return "exited with status " + std::to_string(WEXITSTATUS(status));
    if (WIFSIGNALED(status)) return std::string("killed by signal ") + strsignal(WTERMSIG(status));
    return "ended";
}

// The rank that failed first, then the others that failed (usually as a consequence); empty when
// no rank has failed.
std::string describe_failures(const std::vector<Child>& children) {
    const Child* first = nullptr;
    for (const Child& child : children)
        if (child.failed_at && (!first || *child.failed_at < *first->failed_at)) first = &child;
    if (!first) return {};
    std::string text = "rank " + std::to_string(first->rank) + " failed";
    if (!first->exit_description.empty()) text += " (" + first->exit_description + ")";
    if (!first->failure.empty()) text += ": " + first->failure;
    std::string others;
    for (const Child& child : children)
        if (child.failed_at && &child != first) others += (others.empty() ? "" : ", ") + std::to_string(child.rank);
    if (!others.empty()) text += "\nafter it, these ranks failed too: " + others;
    return text;
}

class Progress {
public:
    explicit Progress(std::uint32_t peers, std::uint32_t iterations)
        : peers_(peers), iterations_(iterations), terminal_(isatty(STDERR_FILENO) != 0) {}
    void show(const std::vector<Child>& children) {
        if (iterations_ == 0) return;  // a timed run: the samples say how it goes
        std::uint32_t connected = 0;
        std::uint64_t done = 0;
        for (const Child& child : children) {
            connected += child.connected ? 1 : 0;
            done += child.iterations;
        }
        const std::uint64_t total = static_cast<std::uint64_t>(peers_) * iterations_;
        const unsigned percent = static_cast<unsigned>(total == 0 ? 100 : done * 100 / total);
        if (terminal_) {
            std::fprintf(stderr, "\r  connected %u/%u, iterations %llu/%llu (%u%%)   ", connected, peers_,
                         static_cast<unsigned long long>(done), static_cast<unsigned long long>(total), percent);
        } else if (connected != last_connected_ && connected == peers_) {
            std::fprintf(stderr, "  all %u peers connected\n", peers_);
        } else if (percent / 25 != last_percent_ / 25) {
            std::fprintf(stderr, "  iterations %llu/%llu (%u%%)\n", static_cast<unsigned long long>(done),
                         static_cast<unsigned long long>(total), percent);
        }
        last_connected_ = connected;
        last_percent_ = percent;
    }
    void finish() {
        if (terminal_) std::fprintf(stderr, "\n");
    }

private:
    std::uint32_t peers_;
    std::uint32_t iterations_;
    bool terminal_;
    std::uint32_t last_connected_ = 0;
    unsigned last_percent_ = 0;
};

}  // namespace

int run_local_job(const Options& options) {
    const Clock::time_point started = Clock::now();
    const std::string token = rdmachan::generate_job_token();
    rdmachan::RendezvousServerSettings server_settings;
    server_settings.world_size = options.peers;
    server_settings.job = options.job;
    server_settings.token = token;
    server_settings.timeout = options.workload.timeout;
    rdmachan::RendezvousServer server(server_settings);
    server.start();
    const std::string rendezvous = "127.0.0.1:" + std::to_string(server.port());
    std::fprintf(stderr, "rdmachan-demo: starting %u peers (mode %s, device %s), rendezvous on %s\n", options.peers,
                 options.workload.mode.c_str(), options.workload.device.c_str(), rendezvous.c_str());

    std::vector<Child> children;
    std::string first_failure;
    try {
        for (std::uint32_t rank = 0; rank < options.peers; ++rank)
            children.push_back(spawn_peer(options, rank, rendezvous, token));
    } catch (const std::exception& error) {
        first_failure = error.what();
    }

    const std::optional<std::chrono::seconds>& duration = options.workload.duration;
    Progress progress(options.peers, duration ? 0 : options.workload.iterations);
    const Clock::time_point deadline =
        started + options.workload.timeout + duration.value_or(std::chrono::seconds(0)) + std::chrono::seconds(5);
    // A timed run samples every peer's memory and descriptors, from when all are connected.
    std::vector<ResourceSample> samples;
    std::optional<Clock::time_point> next_sample;
    // After the first failure the others get a short grace period to fail or finish on their
    // own, so the report can name the rank that failed first rather than whichever exit the
    // poll loop happened to see first.
    constexpr std::chrono::seconds failure_grace{3};
    std::optional<Clock::time_point> first_failure_seen;
    std::string timeout_failure;
    std::size_t open = children.size();
    while (open > 0 && first_failure.empty() && timeout_failure.empty()) {
        if (first_failure_seen && Clock::now() > *first_failure_seen + failure_grace) break;
        std::vector<pollfd> descriptors;
        for (const Child& child : children)
            descriptors.push_back({child.exited ? -1 : child.events, POLLIN, 0});
        const int ready = poll(descriptors.data(), descriptors.size(), 200);
        if (ready < 0 && errno != EINTR) break;
        for (std::size_t index = 0; index < children.size(); ++index) {
            Child& child = children[index];
            if (child.exited || descriptors[index].revents == 0) continue;
            if (!read_events(child)) {
                // End of the peer's output: it has exited (or is about to).
                int status = 0;
                waitpid(child.pid, &status, 0);
                child.exited = true;
                --open;
                const bool clean = WIFEXITED(status) && WEXITSTATUS(status) == 0 && child.report;
                if (!clean) {
                    child.exit_description = describe_exit(status);
                    if (!child.failed_at) child.failed_at = Clock::now();
                }
            }
            if (child.failed_at && !first_failure_seen) first_failure_seen = Clock::now();
        }
        progress.show(children);
        if (duration) {
            const bool all_connected = std::all_of(children.begin(), children.end(), [](const Child& child) { return child.connected; });
            // The first sample one period after all are connected: connections to peer devices
            // open on first use, and the first rounds' memory is set-up, not growth.
            if (!next_sample && all_connected) next_sample = Clock::now() + options.workload.sample_period;
            if (next_sample && Clock::now() >= *next_sample && open == children.size()) {
                std::vector<pid_t> processes;
                for (const Child& child : children) processes.push_back(child.exited ? -1 : child.pid);
                ResourceSample sample = sample_resources(processes, std::chrono::duration<double>(Clock::now() - started).count());
                // A peer that finished its last iteration may exit before this loop sees it.
                if (!sample.resident_kib.empty()) {
                    samples.push_back(std::move(sample));
                    std::fprintf(stderr, "  %s\n", describe(samples.back()).c_str());
                }
                *next_sample += options.workload.sample_period;
            }
        }
        if (Clock::now() > deadline && !first_failure_seen) {
            std::string missing;
            for (const Child& child : children)
                if (!child.exited) missing += (missing.empty() ? "" : ", ") + std::to_string(child.rank);
            timeout_failure = "the job did not finish within " + std::to_string(options.workload.timeout.count()) +
                              " s; still running: rank " + missing;
        }
    }
    if (first_failure.empty()) first_failure = describe_failures(children);
    if (first_failure.empty()) first_failure = timeout_failure;
    progress.finish();
    for (Child& child : children) {
        if (!child.exited) {
            kill(child.pid, SIGKILL);
            waitpid(child.pid, nullptr, 0);
        }
        if (child.events >= 0) close(child.events);
    }
    if (first_failure.empty()) {
        try {
            server.wait();
        } catch (const std::exception& error) {
            first_failure = error.what();
        }
    }
    if (!first_failure.empty()) {
        std::fprintf(stderr, "rdmachan-demo: FAILED: %s\n", first_failure.c_str());
        if (options.json) std::printf("%s\n", nlohmann::json{{"ok", false}, {"error", first_failure}}.dump(2).c_str());
        return 1;
    }
    const double wall = std::chrono::duration<double>(Clock::now() - started).count();
    std::vector<PeerReport> reports;
    for (const Child& child : children) reports.push_back(*child.report);
    const std::uint32_t iterations = duration ? children.front().iterations : options.workload.iterations;
    const JobDescription job{options.peers, options.workload.mode, options.workload.size, iterations};
    if (options.json) {
        nlohmann::json summary = summary_json(job, reports, wall);
        if (duration) summary["resources"] = samples_json(samples);
        std::printf("%s\n", summary.dump(2).c_str());
    } else {
        std::printf("%s", summary_table(job, reports, wall).c_str());
        if (duration && samples.size() >= 2) {
            const nlohmann::json growth = samples_json(samples);
            std::printf("%zu samples, every %lld s: largest growth of one peer above its second sample: RSS %lld KiB, "
                        "descriptors %lld\n",
                        samples.size(), static_cast<long long>(options.workload.sample_period.count()),
                        growth["largest_rss_growth_kib"].get<long long>(), growth["largest_descriptor_growth"].get<long long>());
        }
    }
    return 0;
}

}  // namespace demo
