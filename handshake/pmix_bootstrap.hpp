// The PMIx bootstrap's exchange (key design in README.md here). Internal: MultiChannel uses it
// through MultiChannelBuilder::bootstrap / PreparedMultiChannel::connect(); the tests and the
// exchange benchmark call it directly. Without libpmix (pmix_unavailable.cpp) open() throws.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "handshake/pmix_rows.hpp"
#include "rdmachan/endpoint.hpp"

namespace rdmachan::detail {

class PmixSession {
  public:
    using Clock = std::chrono::steady_clock;

    // PMIx_Init (reference counted by libpmix, so several sessions may coexist), then this
    // process's rank and the job size, all before `deadline`. Throws rdmachan::Error naming
    // PMIx_Init's return code (PMIx_Error_string), a PMIx_Init that did not return by the
    // deadline (pmix_waits.hpp), or the missing job information.
    static std::shared_ptr<PmixSession> open(Clock::time_point deadline);
    ~PmixSession();  // PMIx_Finalize
    PmixSession(const PmixSession&) = delete;
    PmixSession& operator=(const PmixSession&) = delete;

    std::uint32_t rank() const;
    std::uint32_t world_size() const;
    const std::string& job() const;  // the PMIx namespace

    // Publishes `mine` (its rank must be this session's), fences with data collection, and
    // returns every rank's endpoint indexed by rank, each holding only the RC entry that rank
    // created for this one (DC endpoints are whole). Every peer's endpoint passes the schema's
    // validation. Throws rdmachan::Error naming the rank and the key (a peer that published
    // nothing), or the deadline (a fence that did not complete: some rank never reached it).
    std::vector<Endpoint> exchange(const Endpoint& mine, Clock::time_point deadline);
    // A fence without data: returns once every rank reached it, or throws naming the deadline.
    void barrier(Clock::time_point deadline);
    // The value bytes the last exchange() read from PMIx (all peers' keys): grows linearly with
    // the world size (README.md here).
    std::uint64_t last_exchange_bytes() const;
    // Where the last exchange() spent its time, in seconds: publishing (the puts and the commit),
    // the fence with data collection (which includes waiting for the last rank to arrive), and
    // reading the peers' endpoints.
    struct ExchangePhases {
        double publish = 0;
        double fence = 0;
        double read = 0;
    };
    const ExchangePhases& last_exchange_phases() const;

    // The sequence number of the next exchange in this process (what exchange() keys use): a
    // replacement (pmix_replacement.hpp) takes the one its exchange would have had.
    static std::uint64_t take_exchange_sequence();
    // The sequence number the last exchange() used (0 before the first).
    std::uint64_t last_exchange_sequence() const;

    // Peer replacement's primitives (handshake/pmix_replacement.hpp builds the protocol on them).
    // PMIx_Publish of one string in the launcher's data store; throws naming the key.
    void publish(const std::string& key, const std::string& value);
    // PMIx_Lookup of each key without waiting: the value, or nothing when no process published
    // it yet. Throws naming the keys when the lookup itself fails.
    std::vector<std::optional<std::string>> lookup(const std::vector<std::string>& keys);
    // PMIx_Get of `key` published by `rank` of namespace `job` (another job of the same
    // launcher, e.g. the one a replacement replaces); throws naming job, rank and key.
    std::string get(const std::string& job, std::uint32_t rank, const std::string& key, Clock::time_point deadline);
    // The number of processes of namespace `job` (PMIX_JOB_SIZE); throws naming the job.
    std::uint32_t job_size(const std::string& job, Clock::time_point deadline);
    // PMIx_Spawn of one process running `command` (command[0] is the program) with `environment`
    // ("NAME=value") added to what the launcher gives it; returns the new namespace.
    std::string spawn(const std::vector<std::string>& command, const std::vector<std::string>& environment);

    // What the launcher says of `rank` of namespace `job` (PMIX_QUERY_PROC_TABLE): whether its
    // process has ended, its state's name and its pid. Throws naming the job and the rank when
    // the launcher does not answer or does not know the rank.
    struct ProcessState {
        bool ended = false;
        std::string state;
        std::int64_t pid = 0;
    };
    ProcessState process_state(const std::string& job, std::uint32_t rank);

    // Set by the bootstrap when this process was started to take `rank` of namespace `job`
    // (RDMACHAN_PMIX_REPLACES); identity() then says that rank rather than PMIx's.
    struct Replaces {
        std::string job;
        std::uint32_t rank = 0;
    };
    void set_replaces(Replaces replaces);
    const std::optional<Replaces>& replaces() const;

    struct State;

  private:
    explicit PmixSession(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
};

}  // namespace rdmachan::detail
