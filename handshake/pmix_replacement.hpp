// Peer replacement under the PMIx bootstrap (README.md here, "Peer replacement under PMIx"):
// the protocol the TCP rendezvous server runs, carried by the launcher's data store
// (PMIx_Publish / PMIx_Lookup) instead, since no process of the job serves it. Internal:
// PreparedMultiChannel::connect(PeerReplacement) and MultiChannel use it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "handshake/peer_watch.hpp"
#include "handshake/pmix_bootstrap.hpp"

namespace rdmachan::detail {

// Set in the environment of a process started to take a rank ("<namespace>:<rank>");
// MultiChannel::spawn_replacement sets it.
inline constexpr const char* kPmixReplacesVariable = "RDMACHAN_PMIX_REPLACES";
// Throws rdmachan::Error naming the variable and what is wrong with `text`.
PmixSession::Replaces parse_pmix_replaces(std::string_view text);

// The data store's keys, all under the namespace of the job's first processes and the
// exchange's sequence number: the index-th replacement's announcement (its rank, session,
// deadline and endpoint), each live rank's acknowledgement of it (RC: the queue pair it made
// for the replacement), and the replacement's word that it connected everyone.
std::string pmix_announcement_key(const std::string& job, std::uint64_t sequence, std::uint64_t index);
std::string pmix_acknowledgement_key(const std::string& job, std::uint64_t sequence, std::uint64_t index, std::uint32_t from_rank);
std::string pmix_ready_key(const std::string& job, std::uint64_t sequence, std::uint64_t index);

// The replacement's side, before its queue pairs connect: announces `mine` (this process takes
// session.replaces()->rank), waits until every other rank acknowledged it, and returns the table
// to connect to (each peer's endpoint with, in RC, the queue pair it made for this process).
// Refused, naming why: while another replacement is in progress; when another process announced
// itself at the same index; when a rank refuses (it is alive: the rank is not dead). At the
// deadline: an error listing the ranks that did not acknowledge.
struct PmixReplacementTable {
    std::vector<Endpoint> table;
    std::uint64_t sequence = 0;
    std::uint64_t index = 0;  // this replacement's announcement
    std::map<std::uint32_t, std::string> holders;  // ranks replaced before: their process's namespace
};
PmixReplacementTable pmix_announce_replacement(PmixSession& session, const Endpoint& mine, std::uint32_t world_size,
                                               PmixSession::Clock::time_point deadline);
// The replacement connected every queue pair: the live ranks' watches report it `ready`.
void pmix_announce_connected(PmixSession& session, const PmixReplacementTable& replacement, std::uint64_t my_session);

// A watch over the data store: a thread looks up the next announcement (and the `ready` of those
// this rank saw) every max(50 ms, world_size ms), so the launcher's data server answers at
// most about a thousand lookups a second whatever the job size. An announcement is offered to
// the application only when the launcher's process table says the rank's current process
// ended. `first_index`: the first announcement not yet seen (1 for the job's first processes);
// `holders`: the namespace of each rank replaced before it (the replacement's table gives them).
std::shared_ptr<PeerWatch> watch_through_pmix(std::shared_ptr<PmixSession> session, std::string job,
                                              std::uint64_t sequence, std::uint32_t rank, std::uint32_t world_size,
                                              std::uint64_t first_index, std::map<std::uint32_t, std::string> holders = {});

}  // namespace rdmachan::detail
