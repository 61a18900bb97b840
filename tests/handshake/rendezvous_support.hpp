// Helpers shared by the rendezvous tests and the benchmark: endpoints every rank can predict,
// and fork()ed ranks with a bounded wait.
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/endpoint.hpp"
#include "rdmachan/error.hpp"
#include "rdmachan/rendezvous.hpp"
#include "tests/error_of.hpp"

namespace rdmachan::test {


// Distinct, recognizable values per rank, so a table entry in the wrong place is caught.
inline Endpoint predictable_endpoint(std::uint32_t rank, std::uint32_t world_size) {
    Endpoint endpoint;
    endpoint.rank = rank;
    endpoint.session = 0x5e55000000000000ull | (std::uint64_t{rank} << 16) | 0xabc;
    endpoint.device = DeviceKind::soft;
    endpoint.port.lid = static_cast<std::uint16_t>(rank + 1);
    endpoint.port.gid[15] = static_cast<std::uint8_t>(rank);
    endpoint.port.mtu = 4096;
    for (std::uint32_t peer = 0; peer < world_size; ++peer)
        if (peer != rank)
            endpoint.rc.push_back({peer, (rank << 12 | peer) & 0xffffff, rank * 7 + peer});
    endpoint.dc.push_back({0x1000 + rank, 0xdc00000000000000ull | rank});
    endpoint.regions["buffer"] = {0x10000ull * (rank + 1), 4096, 0x100 + rank};
    return endpoint;
}

// A rank's rendezvous settings on the loopback server at `port`.
inline RendezvousSettings rendezvous_settings(std::uint16_t port, std::uint32_t rank, std::uint32_t world_size,
                                              const std::string& job, const std::string& token,
                                              std::chrono::milliseconds timeout) {
    RendezvousSettings settings;
    settings.port = port;
    settings.rank = rank;
    settings.world_size = world_size;
    settings.job = job;
    settings.token = token;
    settings.timeout = timeout;
    return settings;
}

// What `recipient` receives of `endpoint` from the rendezvous (protocol 2): everything but the
// RC entries for other ranks.
inline Endpoint as_received_by(Endpoint endpoint, std::uint32_t recipient) {
    std::erase_if(endpoint.rc, [recipient](const RcEntry& entry) { return entry.peer != recipient; });
    return endpoint;
}

// How one child of run_children_outcomes ended: its wait status, and whether the parent killed
// it at the deadline (then the status says SIGKILL too).
struct ChildOutcome {
    int status = 0;
    bool killed_at_deadline = false;
    bool exited_zero() const { return !killed_at_deadline && WIFEXITED(status) && WEXITSTATUS(status) == 0; }
    bool killed_itself_by(int signal) const { return !killed_at_deadline && WIFSIGNALED(status) && WTERMSIG(status) == signal; }
    std::string describe() const {
        if (killed_at_deadline) return "killed at the deadline";
        if (WIFSIGNALED(status)) return "killed by signal " + std::to_string(WTERMSIG(status));
        return "exited with status " + std::to_string(WEXITSTATUS(status));
    }
};

// Runs `body` in `count` child processes (body's return value is the exit status), then runs
// `after_fork` in the parent, and waits for all children until the deadline; children still
// running then are killed. Returns how each child ended, in the order of its index.
// Call it before the parent starts any thread (start the server in `after_fork`): a child forked
// while another thread holds a lock inside the allocator (AddressSanitizer's, for one) keeps
// that lock held forever and hangs at its first allocation.
inline std::vector<ChildOutcome> run_children_outcomes(int count, const std::function<int(int)>& body,
                                                       std::chrono::milliseconds timeout,
                                                       const std::function<void()>& after_fork = {}) {
    std::vector<pid_t> children;
    for (int index = 0; index < count; ++index) {
        const pid_t child = fork();
        if (child == 0) {
            int status = 1;
            try {
                status = body(index);
            } catch (...) {
                status = 2;
            }
            _exit(status);
        }
        if (child > 0) children.push_back(child);
    }
    if (after_fork) after_fork();
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    std::vector<ChildOutcome> outcomes(children.size());
    std::size_t reaped = 0;
    std::vector<bool> done(children.size(), false);
    while (reaped < children.size()) {
        for (std::size_t index = 0; index < children.size(); ++index) {
            if (done[index]) continue;
            if (waitpid(children[index], &outcomes[index].status, WNOHANG) == children[index]) {
                done[index] = true;
                ++reaped;
            }
        }
        if (std::chrono::steady_clock::now() > deadline) {
            for (std::size_t index = 0; index < children.size(); ++index)
                if (!done[index]) {
                    kill(children[index], SIGKILL);
                    waitpid(children[index], &outcomes[index].status, 0);
                    outcomes[index].killed_at_deadline = true;
                }
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return outcomes;
}

// The same; returns the number of children that exited with status 0.
inline int run_children(int count, const std::function<int(int)>& body, std::chrono::milliseconds timeout,
                        const std::function<void()>& after_fork = {}) {
    const std::vector<ChildOutcome> outcomes = run_children_outcomes(count, body, timeout, after_fork);
    return static_cast<int>(std::count_if(outcomes.begin(), outcomes.end(), [](const ChildOutcome& outcome) { return outcome.exited_zero(); }));
}

}  // namespace rdmachan::test
