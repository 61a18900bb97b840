#include "examples/demo/elastic_launcher.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "examples/demo/elastic_member.hpp"
#include "examples/demo/local_etcd.hpp"
#include "examples/demo/monotonic_time.hpp"

extern char** environ;

namespace demo {
namespace {

using Clock = std::chrono::steady_clock;
using Nanoseconds = std::int64_t;

struct Member {
    pid_t pid = -1;
    int commands = -1;  // its standard input
    int events = -1;    // its standard output
    std::string pending;
    std::optional<std::uint32_t> id;
    Nanoseconds joining_at = 0;
    bool left = false;  // left_service seen
    bool exited = false;
    std::optional<nlohmann::json> result;
    std::string failure;
    std::map<std::uint32_t, Nanoseconds> joined_seen;  // peer -> when this member saw it join
    std::map<std::uint32_t, Nanoseconds> left_seen;
    std::map<std::uint32_t, Nanoseconds> failed_seen;
    bool killed = false;  // by the launcher, on purpose
};

struct Sample {
    Nanoseconds at = 0;
    std::uint64_t bytes = 0;
};

struct Change {
    enum class Kind { join, leave, kill };
    Nanoseconds at = 0;  // join: the member's join() call; leave: the launcher's request; kill: SIGKILL
    Kind kind = Kind::join;
    std::uint32_t id = 0;
    std::optional<double> seen_ms;  // by every other member
    std::size_t others = 0;
};

class Run {
public:
    Run(const Options& options, std::string etcd, std::string prefix)
        : options_(options), etcd_(std::move(etcd)), prefix_(std::move(prefix)) {}

    ~Run() {
        for (auto& member : members_) {
            if (!member->exited && member->pid > 0) {
                ::kill(member->pid, SIGKILL);
                ::waitpid(member->pid, nullptr, 0);
            }
        }
    }

    Member& start() {
        int input[2];
        int output[2];
        if (::pipe2(input, O_CLOEXEC) != 0 || ::pipe2(output, O_CLOEXEC) != 0)
            throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
        posix_spawn_file_actions_t actions;
        posix_spawn_file_actions_init(&actions);
        posix_spawn_file_actions_adddup2(&actions, input[0], STDIN_FILENO);
        posix_spawn_file_actions_adddup2(&actions, output[1], STDOUT_FILENO);
        const Workload& workload = options_.workload;
        std::vector<std::string> arguments = {"rdmachan-demo", "elastic-member", "--mode", workload.mode,
                                              "--size", std::to_string(workload.size), "--device", workload.device,
                                              "--timeout", std::to_string(workload.timeout.count())};
        std::vector<char*> argv;
        for (std::string& argument : arguments) argv.push_back(argument.data());
        argv.push_back(nullptr);
        std::vector<std::string> environment_strings = {"RDMACHAN_ETCD=" + etcd_, "RDMACHAN_ETCD_PREFIX=" + prefix_};
        for (char** entry = environ; *entry != nullptr; ++entry) {
            if (std::strncmp(*entry, "RDMACHAN_ETCD=", 14) != 0 && std::strncmp(*entry, "RDMACHAN_ETCD_PREFIX=", 21) != 0)
                environment_strings.emplace_back(*entry);
        }
        std::vector<char*> environment;
        for (std::string& entry : environment_strings) environment.push_back(entry.data());
        environment.push_back(nullptr);
        auto member = std::make_unique<Member>();
        const int error = posix_spawn(&member->pid, "/proc/self/exe", &actions, nullptr, argv.data(), environment.data());
        posix_spawn_file_actions_destroy(&actions);
        ::close(input[0]);
        ::close(output[1]);
        if (error != 0) throw std::runtime_error(std::string("starting a member: ") + std::strerror(error));
        member->commands = input[1];
        member->events = output[0];
        members_.push_back(std::move(member));
        return *members_.back();
    }

    // Reads every member's events for up to `limit`; returns when `done` holds or the time is up.
    bool pump_until(const std::function<bool()>& done, std::chrono::milliseconds limit) {
        const auto until = Clock::now() + limit;
        while (!done()) {
            if (Clock::now() >= until) return false;
            pump(std::chrono::milliseconds(10));
        }
        return true;
    }

    void pump(std::chrono::milliseconds wait) {
        std::vector<pollfd> descriptors;
        std::vector<Member*> owners;
        for (auto& member : members_) {
            if (member->events < 0) continue;
            descriptors.push_back({member->events, POLLIN, 0});
            owners.push_back(member.get());
        }
        if (descriptors.empty()) return;
        if (::poll(descriptors.data(), descriptors.size(), static_cast<int>(wait.count())) <= 0) return;
        for (std::size_t index = 0; index < descriptors.size(); ++index) {
            if (descriptors[index].revents == 0) continue;
            Member& member = *owners[index];
            char chunk[8192];
            const ssize_t got = ::read(member.events, chunk, sizeof chunk);
            if (got <= 0) {
                ::close(member.events);
                member.events = -1;
                int status = 0;
                ::waitpid(member.pid, &status, 0);
                member.exited = true;
                if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
                    if (member.failure.empty()) member.failure = "exited with status " + std::to_string(status);
                }
                continue;
            }
            member.pending.append(chunk, static_cast<std::size_t>(got));
            for (std::size_t end; (end = member.pending.find('\n')) != std::string::npos;) {
                handle(member, member.pending.substr(0, end));
                member.pending.erase(0, end + 1);
            }
        }
    }

    void handle(Member& member, const std::string& line) {
        const nlohmann::json event = nlohmann::json::parse(line, nullptr, false);
        if (event.is_discarded() || !event.is_object() || !event.contains("event")) return;
        const std::string kind = event["event"].get<std::string>();
        const Nanoseconds at = event.value("at_ns", Nanoseconds{0});
        if (kind == "joining") member.joining_at = at;
        if (kind == "ready") member.id = event.at("id").get<std::uint32_t>();
        if (kind == "joined") member.joined_seen[event.at("peer").get<std::uint32_t>()] = at;
        if (kind == "left") member.left_seen[event.at("peer").get<std::uint32_t>()] = at;
        if (kind == "failed") member.failed_seen[event.at("peer").get<std::uint32_t>()] = at;
        if (kind == "left_service") member.left = true;
        if (kind == "traffic") samples_.push_back({at, event.at("bytes").get<std::uint64_t>()});
        if (kind == "result") member.result = event;
        if (kind == "error" || kind == "refused") member.failure = event.dump();
        if (kind == "corrupted") member.failure = "corrupted bytes: " + event.dump();
    }

    std::vector<Member*> active() {
        std::vector<Member*> list;
        for (auto& member : members_) {
            if (member->id && !member->left && !member->exited) list.push_back(member.get());
        }
        return list;
    }

    // Starts a member and waits until every active member has seen it join.
    Change join_one() {
        Member& member = start();
        if (!pump_until([&] { return member.id.has_value() || member.exited; }, std::chrono::seconds(30)))
            throw std::runtime_error("a member did not join within 30 s");
        if (!member.id) throw std::runtime_error("a member failed to join: " + member.failure);
        Change change{member.joining_at, Change::Kind::join, *member.id, std::nullopt, 0};
        const std::uint32_t id = *member.id;
        auto others = [&] {
            std::vector<Member*> list = active();
            std::erase(list, &member);
            return list;
        };
        change.others = others().size();
        if (pump_until([&] {
                const auto list = others();
                return std::all_of(list.begin(), list.end(), [&](Member* other) { return other->joined_seen.count(id) != 0; });
            },
            std::chrono::seconds(10))) {
            Nanoseconds last = change.at;
            for (Member* other : others()) last = std::max(last, other->joined_seen[id]);
            change.seen_ms = static_cast<double>(last - change.at) / 1e6;
        }
        return change;
    }

    // Tells the longest-running active member to leave (or kills it with SIGKILL), and waits until
    // the others saw it go (left, or failed).
    Change remove_one(bool kill) {
        std::vector<Member*> list = active();
        if (list.size() < 2) throw std::runtime_error("no member to remove");
        Member& member = *list.front();
        const std::uint32_t id = *member.id;
        Change change{monotonic_ns(), kill ? Change::Kind::kill : Change::Kind::leave, id, std::nullopt, list.size() - 1};
        if (kill) {
            member.killed = true;
            ::kill(member.pid, SIGKILL);
        } else if (::write(member.commands, "l", 1) != 1) {
            throw std::runtime_error("telling member " + std::to_string(id) + " to leave failed");
        }
        std::erase(list, &member);
        auto seen = [&](Member* other) -> std::map<std::uint32_t, Nanoseconds>& {
            return kill ? other->failed_seen : other->left_seen;
        };
        if (pump_until([&] { return std::all_of(list.begin(), list.end(), [&](Member* other) { return seen(other).count(id) != 0; }); },
                       std::chrono::seconds(10))) {
            Nanoseconds last = change.at;
            for (Member* other : list) last = std::max(last, seen(other)[id]);
            change.seen_ms = static_cast<double>(last - change.at) / 1e6;
        }
        pump_until([&] { return member.exited; }, std::chrono::seconds(10));
        return change;
    }

    void leave_all() {
        for (Member* member : active()) {
            if (::write(member->commands, "l", 1) != 1) member->failure = "could not be told to leave";
        }
        pump_until([&] { return std::all_of(members_.begin(), members_.end(), [](const auto& m) { return m->exited; }); },
                   std::chrono::seconds(30));
    }

    // Aggregate bytes per second reported in [from, to).
    double throughput(Nanoseconds from, Nanoseconds to) const {
        std::uint64_t bytes = 0;
        for (const Sample& sample : samples_) {
            if (sample.at >= from && sample.at < to) bytes += sample.bytes;
        }
        return static_cast<double>(bytes) / (static_cast<double>(to - from) / 1e9);
    }

    const std::vector<std::unique_ptr<Member>>& members() const { return members_; }

private:
    const Options& options_;
    std::string etcd_;
    std::string prefix_;
    std::vector<std::unique_ptr<Member>> members_;
    std::vector<Sample> samples_;
};

}  // namespace

int run_elastic_job(const Options& options) {
    std::unique_ptr<LocalEtcd> local;
    std::string etcd;
    if (const char* given = std::getenv("RDMACHAN_ETCD"); given != nullptr && *given != '\0') {
        etcd = given;
    } else {
        local = std::make_unique<LocalEtcd>();
        etcd = local->endpoint();
    }
    // A prefix of this run's own: runs sharing one etcd do not see each other.
    const std::string prefix = "rdmachan-demo/" + std::to_string(::getpid()) + "-" + std::to_string(monotonic_ns()) + "/";
    std::printf("elastic run: %u members, %u changes, %s, %u-byte slices; etcd %s%s, keys under %s\n", options.peers,
                options.churn, options.workload.mode.c_str(), options.workload.size, etcd.c_str(),
                local ? " (started for this run)" : "", prefix.c_str());
    std::fflush(stdout);
    Run run(options, etcd, prefix);
    std::vector<Change> changes;
    for (std::uint32_t count = 0; count < options.peers; ++count) changes.push_back(run.join_one());
    const std::chrono::milliseconds settle(1000);
    run.pump_until([] { return false; }, settle);
    for (std::uint32_t step = 0; step < options.churn; ++step) {
        // A leave, a join, a kill, a join, and again.
        switch (step % 4) {
            case 0: changes.push_back(run.remove_one(false)); break;
            case 2: changes.push_back(run.remove_one(true)); break;
            default: changes.push_back(run.join_one()); break;
        }
        run.pump_until([] { return false; }, settle);
    }
    const Nanoseconds end = monotonic_ns();
    run.leave_all();

    std::printf("\n| change | member | members before | seen by every other member | MB/s, 1 s before | MB/s, 1 s after |\n");
    std::printf("|---|---:|---:|---:|---:|---:|\n");
    bool ok = true;
    for (const Change& change : changes) {
        const Nanoseconds second = 1'000'000'000;
        const double before = run.throughput(change.at - second, change.at) / 1e6;
        const Nanoseconds after_end = std::min(change.at + second, end);
        const double after = after_end > change.at ? run.throughput(change.at, after_end) / 1e6 : 0.0;
        char seen[64];
        if (change.seen_ms) {
            std::snprintf(seen, sizeof seen, "%.1f ms", *change.seen_ms);
        } else {
            std::snprintf(seen, sizeof seen, "not within 10 s");
            ok = false;
        }
        const bool join = change.kind == Change::Kind::join;
        std::printf("| %s | %u | %zu | %s | %.1f | %.1f |\n",
                    join ? "join" : change.kind == Change::Kind::leave ? "leave" : "kill (SIGKILL)", change.id,
                    join ? change.others : change.others + 1, change.others == 0 ? "-" : seen, before, after);
    }
    // The target: the members' aggregate throughput during the changes stays within 20% of the
    // steady state (the second before the first change), second by second.
    if (options.churn > 0 && changes.size() > options.peers) {
        const Nanoseconds second = 1'000'000'000;
        const Nanoseconds first_change = changes[options.peers].at;
        const double steady = run.throughput(first_change - second, first_change) / 1e6;
        double lowest = steady;
        for (Nanoseconds from = first_change; from + second <= end; from += second) {
            lowest = std::min(lowest, run.throughput(from, from + second) / 1e6);
        }
        std::printf("\nsteady state %.1f MB/s (the second before the first change); lowest second during the %u changes "
                    "%.1f MB/s, %.0f%% of it\n",
                    steady, options.churn, lowest, steady > 0 ? 100.0 * lowest / steady : 0.0);
    }
    std::printf("\njoin: from the member's join() call until every other member reported it joined (its pairs connected "
                "on both sides); leave: from the request until every other member reported it left; kill: from SIGKILL until "
                "every other member reported it failed (its queue pair failed, or its lease, TTL 2 s, ran out: whichever "
                "came first).\n");
    std::uint64_t verified = 0;
    std::uint64_t corrupted = 0;
    std::uint64_t cut = 0;
    for (const auto& member : run.members()) {
        if (member->killed) continue;
        if (member->result) {
            verified += member->result->value("verified", std::uint64_t{0});
            corrupted += member->result->value("corrupted", std::uint64_t{0});
            cut += member->result->value("cut", std::uint64_t{0});
        } else if (member->failure.empty()) {
            member->failure = "no result";
        }
        if (!member->failure.empty()) {
            ok = false;
            std::fprintf(stderr, "member %s: %s\n", member->id ? std::to_string(*member->id).c_str() : "?",
                         member->failure.c_str());
        }
    }
    std::printf("every byte written was read back and checked: %llu bytes equal, %llu differ; %llu operations cut short "
                "by a member leaving\n",
                static_cast<unsigned long long>(verified), static_cast<unsigned long long>(corrupted),
                static_cast<unsigned long long>(cut));
    return ok && corrupted == 0 ? 0 : 1;
}

}  // namespace demo
