// The examples' stand-in for a launcher: forks the ranks of a job on this host, runs the
// rendezvous server in the parent, and tells each rank the server's port through a pipe. A real
// job starts its ranks with rdmachan-demo, mpirun, Slurm or torchrun and finds the rendezvous in
// its environment (rdmachan/launcher_environment.hpp).
//
//   examples::LocalRanks ranks(4, "my_job");
//   ranks.start([&](const rdmachan::RendezvousSettings& rendezvous) { ...; return 0; });
//   int failures = ranks.rendezvous();   // until every rank has connected
//   failures += ranks.wait_all();        // every rank exited with 0, or a failure each
#pragma once

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "rdmachan/launcher_environment.hpp"
#include "rdmachan/multi_channel.hpp"

namespace examples {

class LocalRanks {
public:
    LocalRanks(std::uint32_t ranks, std::string job) : ranks_(ranks), job_(std::move(job)), token_(rdmachan::generate_job_token()) {}
    LocalRanks(const LocalRanks&) = delete;
    LocalRanks& operator=(const LocalRanks&) = delete;
    ~LocalRanks() {
        for (const int descriptor : port_pipes_) close(descriptor);
        (void)wait_all();
    }

    // Forks every rank; each runs `run_rank(rendezvous settings)` once the port has come, and
    // exits with what it returns (1 on an exception, said on stderr). Call before this process
    // starts any thread: the children are made by fork.
    template <typename RunRank>
    void start(RunRank&& run_rank) {
        for (std::uint32_t rank = 0; rank < ranks_; ++rank) {
            int ends[2];
            if (pipe(ends) != 0) throw std::runtime_error("launcher: pipe failed");
            const pid_t child = fork();
            if (child < 0) throw std::runtime_error("launcher: fork failed");
            if (child == 0) {
                close(ends[1]);
                int code = 1;
                try {
                    code = run_rank(settings(rank, ends[0]));
                } catch (const std::exception& error) {
                    std::fprintf(stderr, "rank %u: %s\n", rank, error.what());
                }
                std::fflush(stdout);
                _exit(code);
            }
            close(ends[0]);
            port_pipes_.push_back(ends[1]);
            children_.push_back(child);
        }
    }

    // Runs the rendezvous server until every rank has connected (or its timeout); returns the
    // number of failures, each said on stderr.
    int rendezvous() {
        int failures = 0;
        try {
            rdmachan::RendezvousServerSettings server_settings;
            server_settings.world_size = ranks_;
            server_settings.job = job_;
            server_settings.token = token_;
            server_settings.timeout = kTimeout;
            rdmachan::RendezvousServer server(server_settings);
            server.start();
            const std::uint16_t port = server.port();
            for (const int descriptor : port_pipes_) {
                if (write(descriptor, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) ++failures;
                close(descriptor);
            }
            port_pipes_.clear();
            server.wait();
        } catch (const std::exception& error) {
            std::fprintf(stderr, "launcher: %s\n", error.what());
            ++failures;
        }
        return failures;
    }

    // Waits for one rank: 0 if it exited with 0, 1 otherwise (or if it was waited for before).
    int wait(std::uint32_t rank) {
        if (rank >= children_.size() || children_[rank] <= 0) return 1;
        int status = 0;
        const pid_t child = std::exchange(children_[rank], 0);
        return waitpid(child, &status, 0) == child && WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : 1;
    }

    // Waits for every rank not waited for yet; the number that failed.
    int wait_all() {
        int failures = 0;
        for (std::uint32_t rank = 0; rank < children_.size(); ++rank) {
            if (children_[rank] > 0) failures += wait(rank);
        }
        return failures;
    }

private:
    static constexpr std::chrono::seconds kTimeout{30};

    // In the child: reads the port from the launcher, then fills in the rest.
    rdmachan::RendezvousSettings settings(std::uint32_t rank, int port_pipe) const {
        std::uint16_t port = 0;
        const bool read_whole = read(port_pipe, &port, sizeof port) == static_cast<ssize_t>(sizeof port);
        close(port_pipe);
        if (!read_whole) throw std::runtime_error("the launcher never sent the rendezvous port");
        rdmachan::RendezvousSettings settings;
        settings.port = port;
        settings.rank = rank;
        settings.world_size = ranks_;
        settings.job = job_;
        settings.token = token_;
        settings.timeout = kTimeout;
        return settings;
    }

    std::uint32_t ranks_;
    std::string job_;
    std::string token_;
    std::vector<int> port_pipes_;
    std::vector<pid_t> children_;
};

}  // namespace examples
