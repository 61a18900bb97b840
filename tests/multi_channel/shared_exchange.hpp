// A test-only out-of-band exchange between forked processes: a table in shared memory (mapped
// before fork) where each rank publishes a JSON text, plus a barrier, and the fork of the ranks
// themselves. Every wait has a deadline.
#pragma once

#include <signal.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "rdmachan/multi_channel.hpp"
#include "transport/soft/device.hpp"

namespace multi_test {

constexpr std::uint32_t kMaxRanks = 64;
constexpr std::size_t kTextSize = 16384;

struct SharedTable {
    std::atomic<std::uint32_t> published[kMaxRanks];
    std::atomic<std::uint32_t> arrived;
    std::atomic<std::uint32_t> generation;
    char text[kMaxRanks][kTextSize];
};

inline SharedTable* create_shared_table() {
    void* memory = mmap(nullptr, sizeof(SharedTable), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (memory == MAP_FAILED) throw std::runtime_error("mmap of the shared table failed");
    return new (memory) SharedTable{};
}

inline void destroy_shared_table(SharedTable* table) { munmap(table, sizeof(SharedTable)); }

inline void publish(SharedTable& table, std::uint32_t rank, const std::string& text) {
    if (text.size() + 1 > kTextSize) throw std::runtime_error("published text too large");
    std::memcpy(table.text[rank], text.c_str(), text.size() + 1);
    table.published[rank].store(1, std::memory_order_release);
}

// Waits for rank's text; throws naming the rank when the deadline passes.
inline std::string read_published(SharedTable& table, std::uint32_t rank, std::chrono::milliseconds deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (table.published[rank].load(std::memory_order_acquire) == 0) {
        if (std::chrono::steady_clock::now() >= until) {
            throw std::runtime_error("rank " + std::to_string(rank) + " never published its endpoints");
        }
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    return table.text[rank];
}

// All `world` ranks meet; throws when the deadline passes (a rank died or hangs).
inline void barrier(SharedTable& table, std::uint32_t world, std::chrono::milliseconds deadline) {
    const std::uint32_t generation = table.generation.load(std::memory_order_acquire);
    if (table.arrived.fetch_add(1, std::memory_order_acq_rel) + 1 == world) {
        table.arrived.store(0, std::memory_order_relaxed);
        table.generation.fetch_add(1, std::memory_order_acq_rel);
        rdmachan::soft::acquire_remote_writes();
        return;
    }
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (table.generation.load(std::memory_order_acquire) == generation) {
        if (std::chrono::steady_clock::now() >= until) throw std::runtime_error("barrier: not every rank arrived in time");
        std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    // The ranks' writes reached this process's memory through another process's device thread;
    // the barrier (shared memory) is causality ThreadSanitizer cannot see.
    rdmachan::soft::acquire_remote_writes();
}

// Publishes `own` as `rank`'s endpoint and reads every rank's (this one's too), in rank order.
inline std::vector<rdmachan::Endpoint> exchange_endpoints(SharedTable& table, std::uint32_t rank, std::uint32_t world,
                                                          const rdmachan::Endpoint& own,
                                                          std::chrono::milliseconds deadline) {
    publish(table, rank, nlohmann::json(own).dump());
    std::vector<rdmachan::Endpoint> endpoints(world);
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        endpoints[peer] = nlohmann::json::parse(read_published(table, peer, deadline)).get<rdmachan::Endpoint>();
    }
    return endpoints;
}

// Forks `world` children, each running body(table, rank, world) on a fresh shared table and
// exiting with its result; returns how many failed. Children still running after 120 s are
// killed and counted as failed.
template <typename Body>
int run_ranks(std::uint32_t world, Body body) {
    SharedTable* table = create_shared_table();
    std::vector<pid_t> children;
    for (std::uint32_t rank = 0; rank < world; ++rank) {
        const pid_t child = fork();
        if (child == 0) _exit(body(*table, rank, world));
        children.push_back(child);
    }
    int failures = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(120);
    for (std::size_t done = 0; done < children.size();) {
        int status = 0;
        const pid_t finished = waitpid(-1, &status, WNOHANG);
        if (finished > 0) {
            ++done;
            if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) ++failures;
            continue;
        }
        if (std::chrono::steady_clock::now() >= until) {
            for (pid_t child : children) kill(child, SIGKILL);
            while (waitpid(-1, &status, 0) > 0) ++failures;
            break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    destroy_shared_table(table);
    return failures;
}

}  // namespace multi_test
