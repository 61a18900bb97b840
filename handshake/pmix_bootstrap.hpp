// The PMIx bootstrap's exchange (key design in README.md here). Internal: MultiChannel uses it
// through MultiChannelBuilder::bootstrap / PreparedMultiChannel::connect(); the tests and the
// exchange benchmark call it directly. Without libpmix (pmix_unavailable.cpp) open() throws.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rdmachan/endpoint.hpp"

namespace rdmachan::detail {

class PmixSession {
  public:
    using Clock = std::chrono::steady_clock;

    // PMIx_Init (reference counted by libpmix, so several sessions may coexist), then this
    // process's rank and the job size. Throws rdmachan::Error naming PMIx_Init's return code
    // (PMIx_Error_string) or the missing job information.
    static std::shared_ptr<PmixSession> open();
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

    struct State;

  private:
    explicit PmixSession(std::unique_ptr<State> state);
    std::unique_ptr<State> state_;
};

// The keys the exchange uses, for error messages and tests: `sequence` counts the exchanges in
// this process (1 for the first), so a second MultiChannel never reads the first one's values.
std::string pmix_endpoint_key(std::uint64_t sequence);
std::string pmix_rc_key(std::uint64_t sequence, std::uint32_t for_rank);

}  // namespace rdmachan::detail
