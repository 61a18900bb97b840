// Peer replacement through the PMIx launcher's data store (pmix_replacement.hpp; the protocol
// in README.md here). Built on PmixSession's publish/lookup/get/spawn, so it compiles with or
// without libpmix (without, those throw).
#include "handshake/pmix_replacement.hpp"

#include <algorithm>
#include <charconv>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <atomic>
#include <thread>

#include "handshake/hex.hpp"
#include "rdmachan/error.hpp"
#include "common/logger.hpp"

namespace rdmachan::detail {
namespace {

using handshake::parse_hex_u64;
using handshake::to_hex_u64;
using SystemClock = std::chrono::system_clock;

std::int64_t unix_milliseconds(SystemClock::time_point time) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(time.time_since_epoch()).count();
}

std::string key_prefix(const std::string& job, std::uint64_t sequence) {
    return "rdmachan.replacement." + job + "." + std::to_string(sequence) + ".";
}

// One announcement as published: the replacement's rank and session, when it gives up
// (wall-clock, since the ranks reading it run on other hosts), and its whole endpoint.
struct Announcement {
    std::uint32_t rank = 0;
    std::uint64_t session = 0;
    std::string job;  // the replacement's own PMIx namespace (rank 0 of it)
    std::int64_t expires_unix_ms = 0;
    Endpoint endpoint;
};

std::string announcement_text(const Announcement& announcement) {
    nlohmann::json json;
    json["rank"] = announcement.rank;
    json["session"] = to_hex_u64(announcement.session);
    json["namespace"] = announcement.job;
    json["expires_unix_ms"] = announcement.expires_unix_ms;
    to_json(json["endpoint"], announcement.endpoint);
    return json.dump();
}

// Throws rdmachan::Error naming the key and the field.
Announcement parse_announcement(const std::string& key, const std::string& text) {
    Announcement announcement;
    try {
        const nlohmann::json json = nlohmann::json::parse(text);
        if (!json.is_object()) throw Error("not a JSON object");
        if (!json.contains("rank") || !json["rank"].is_number_unsigned()) throw Error("field 'rank' is missing or not a number");
        if (!json.contains("session") || !json["session"].is_string() ||
            !parse_hex_u64(json["session"].get<std::string>(), announcement.session)) {
            throw Error("field 'session' is missing or not 16 hex digits");
        }
        if (!json.contains("namespace") || !json["namespace"].is_string() || json["namespace"].get<std::string>().empty()) {
            throw Error("field 'namespace' is missing or not a name");
        }
        announcement.job = json["namespace"].get<std::string>();
        if (!json.contains("expires_unix_ms") || !json["expires_unix_ms"].is_number_integer()) {
            throw Error("field 'expires_unix_ms' is missing or not a number");
        }
        if (!json.contains("endpoint")) throw Error("field 'endpoint' is missing");
        const std::uint64_t rank = json["rank"].get<std::uint64_t>();
        if (rank > UINT32_MAX) throw Error("field 'rank' is out of range");
        announcement.rank = static_cast<std::uint32_t>(rank);
        announcement.expires_unix_ms = json["expires_unix_ms"].get<std::int64_t>();
        from_json(json["endpoint"], announcement.endpoint);
    } catch (const nlohmann::json::exception& error) {
        throw Error("PMIx peer replacement: the value of key '" + key + "' is not valid JSON: " + error.what());
    } catch (const Error& error) {
        throw Error("PMIx peer replacement: the value of key '" + key + "': " + error.what());
    }
    if (announcement.endpoint.rank != announcement.rank) {
        throw Error("PMIx peer replacement: the value of key '" + key + "' announces rank " +
                    std::to_string(announcement.rank) + " with the endpoint of rank " + std::to_string(announcement.endpoint.rank));
    }
    if (announcement.endpoint.session != announcement.session) {
        throw Error("PMIx peer replacement: the value of key '" + key + "': its session and its endpoint's differ");
    }
    return announcement;
}

// An acknowledgement: RC the queue pair the live rank made for the replacement, DC nothing;
// or a refusal with its reason (the rank named is alive).
struct Acknowledgement {
    std::optional<RcEntry> entry;
    std::string refused;
};

std::string acknowledgement_text(const std::optional<RcEntry>& entry, const std::string& refused) {
    nlohmann::json json = nlohmann::json::object();
    if (!refused.empty()) {
        json["refused"] = refused;
        return json.dump();
    }
    json["rc"] = nlohmann::json::array();
    if (entry) json["rc"].push_back({{"peer", entry->peer}, {"qpn", entry->qpn}, {"psn", entry->psn}});
    return json.dump();
}

Acknowledgement parse_acknowledgement(const std::string& key, std::uint32_t from_rank, std::uint32_t replaced_rank,
                                      const std::string& text) {
    Acknowledgement acknowledgement;
    const std::string what = "PMIx peer replacement: rank " + std::to_string(from_rank) + "'s acknowledgement (key '" + key + "')";
    try {
        const nlohmann::json json = nlohmann::json::parse(text);
        if (!json.is_object()) throw Error("not a JSON object");
        if (json.contains("refused")) {
            acknowledgement.refused = json["refused"].is_string() ? json["refused"].get<std::string>() : "refused";
            return acknowledgement;
        }
        if (!json.contains("rc") || !json["rc"].is_array()) throw Error("field 'rc' is missing or not an array");
        if (json["rc"].size() > 1) throw Error("field 'rc' holds " + std::to_string(json["rc"].size()) + " entries, not one");
        if (!json["rc"].empty()) {
            const nlohmann::json& rc = json["rc"][0];
            auto field = [&rc](const char* name, std::uint64_t limit) {
                if (!rc.is_object() || !rc.contains(name) || !rc[name].is_number_unsigned() || rc[name].get<std::uint64_t>() > limit) {
                    throw Error(std::string("field 'rc[0].") + name + "' is missing or out of range");
                }
                return static_cast<std::uint32_t>(rc[name].get<std::uint64_t>());
            };
            const RcEntry entry{field("peer", UINT32_MAX), field("qpn", 0xffffff), field("psn", 0xffffff)};
            if (entry.peer != replaced_rank) {
                throw Error("its RC entry is for rank " + std::to_string(entry.peer) + ", not rank " + std::to_string(replaced_rank));
            }
            acknowledgement.entry = entry;
        }
    } catch (const nlohmann::json::exception& error) {
        throw Error(what + " is not valid JSON: " + error.what());
    } catch (const Error& error) {
        throw Error(what + ": " + error.what());
    }
    return acknowledgement;
}

// The watch: a thread does the lookups, poll_events() only takes what it found.
class PmixWatch final : public PeerWatch {
  public:
    PmixWatch(std::shared_ptr<PmixSession> session, std::string job, std::uint64_t sequence, std::uint32_t rank,
              std::uint32_t world_size, std::uint64_t first_index, std::map<std::uint32_t, std::string> holders)
        : session_(std::move(session)), job_(std::move(job)), sequence_(sequence), rank_(rank), world_size_(world_size),
          next_index_(first_index),
          period_(std::max<std::chrono::milliseconds>(std::chrono::milliseconds(50), std::chrono::milliseconds(world_size))),
          holders_(std::move(holders)) {
        thread_ = std::thread([this] { run(); });
    }
    ~PmixWatch() override {
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        thread_.join();
    }

    std::vector<RendezvousEvent> poll_events() override {
        const std::lock_guard<std::mutex> lock(mutex_);
        std::vector<RendezvousEvent> events;
        events.swap(events_);
        return events;
    }

    void acknowledge_replacement(std::uint32_t peer, std::uint64_t session, const std::optional<RcEntry>& entry) override {
        std::uint64_t index = 0;
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            for (const auto& [candidate, seen] : outstanding_) {
                if (seen.rank == peer && seen.session == session) index = candidate;
            }
        }
        if (index == 0) {
            throw Error("PMIx peer replacement (rank " + std::to_string(rank_) + "): no announced replacement of rank " +
                        std::to_string(peer) + " with session " + to_hex_u64(session) + " is waiting (it gave up)");
        }
        session_->publish(pmix_acknowledgement_key(job_, sequence_, index, rank_), acknowledgement_text(entry, {}));
    }

    std::string spawn_replacement(std::uint32_t peer, const std::vector<std::string>& command) override {
        if (peer >= world_size_) {
            throw Error("spawn_replacement: rank " + std::to_string(peer) + " is outside the job's " +
                        std::to_string(world_size_) + " ranks");
        }
        if (peer == rank_) throw Error("spawn_replacement: rank " + std::to_string(peer) + " is this process: it is alive");
        return session_->spawn(command, {std::string(kPmixReplacesVariable) + "=" + job_ + ":" + std::to_string(peer)});
    }

    std::uint64_t finished_rounds() const override { return finished_rounds_.load(std::memory_order_acquire); }

  private:
    struct Seen {
        std::uint32_t rank = 0;
        std::uint64_t session = 0;
        std::string job;  // the replacement's namespace
        std::int64_t expires_unix_ms = 0;
    };

    void run() {
        std::unique_lock<std::mutex> lock(mutex_);
        while (!stopping_) {
            lock.unlock();
            look();
            // Released after what the round found is in events_: a caller that sees the count
            // also sees its events.
            finished_rounds_.fetch_add(1, std::memory_order_release);
            lock.lock();
            wake_.wait_for(lock, period_, [this] { return stopping_; });
        }
    }

    // One round of lookups: the next announcement, and `ready` for each one still outstanding.
    void look() {
        std::vector<std::string> keys{pmix_announcement_key(job_, sequence_, next_index_)};
        std::vector<std::uint64_t> indices;
        {
            const std::lock_guard<std::mutex> lock(mutex_);
            for (const auto& [index, seen] : outstanding_) {
                keys.push_back(pmix_ready_key(job_, sequence_, index));
                indices.push_back(index);
            }
        }
        std::vector<std::optional<std::string>> values;
        try {
            values = session_->lookup(keys);
            lookup_failure_logged_ = false;
        } catch (const Error& error) {
            // The launcher's data server is unreachable: said once, tried again next round.
            if (!lookup_failure_logged_) logger().warn("PMIx peer replacement (rank {}): {}", rank_, error.what());
            lookup_failure_logged_ = true;
            return;
        }
        std::vector<RendezvousEvent> found;
        std::optional<std::pair<std::uint64_t, Seen>> announced;
        if (values[0]) {
            try {
                Announcement announcement = parse_announcement(keys[0], *values[0]);
                if (announcement.rank >= world_size_) {
                    throw Error("it names rank " + std::to_string(announcement.rank) + ", outside the job's " +
                                std::to_string(world_size_) + " ranks");
                }
                if (announcement.rank == rank_) {
                    // This rank is alive: its refusal tells the would-be replacement at once.
                    logger().warn("PMIx peer replacement: a process (session {}) announced itself as rank {}, which is this live process: refused",
                                  to_hex_u64(announcement.session), rank_);
                    session_->publish(pmix_acknowledgement_key(job_, sequence_, next_index_, rank_),
                                      acknowledgement_text(std::nullopt, "rank " + std::to_string(rank_) + " is alive"));
                } else {
                    // As the replacement itself checked: only a rank whose process ended is
                    // replaced. An announcement for a live one (another process's mistake, or
                    // a race with the check) is never offered to the application.
                    const auto holder = holders_.find(announcement.rank);
                    const std::string holder_job = holder != holders_.end() ? holder->second : job_;
                    const std::uint32_t holder_rank = holder != holders_.end() ? 0 : announcement.rank;
                    const PmixSession::ProcessState state = session_->process_state(holder_job, holder_rank);
                    if (!state.ended) {
                        throw Error("rank " + std::to_string(announcement.rank) + " is alive: its process (pid " +
                                    std::to_string(state.pid) + ", namespace " + holder_job + ") is in state '" + state.state + "'");
                    }
                    Endpoint endpoint = std::move(announcement.endpoint);
                    std::erase_if(endpoint.rc, [this](const RcEntry& entry) { return entry.peer != rank_; });
                    found.push_back({RendezvousEvent::Kind::replacement, announcement.rank, announcement.session, std::move(endpoint)});
                    announced = {next_index_, Seen{announcement.rank, announcement.session, announcement.job,
                                                   announcement.expires_unix_ms}};
                }
            } catch (const Error& error) {
                logger().warn("PMIx peer replacement (rank {}): announcement {} ignored: {}", rank_, next_index_, error.what());
            }
            ++next_index_;
        }
        const std::int64_t now = unix_milliseconds(SystemClock::now());
        const std::lock_guard<std::mutex> lock(mutex_);
        for (std::size_t position = 0; position < indices.size(); ++position) {
            const auto seen = outstanding_.find(indices[position]);
            if (seen == outstanding_.end()) continue;
            if (values[position + 1]) {
                holders_[seen->second.rank] = seen->second.job;
                found.push_back({RendezvousEvent::Kind::ready, seen->second.rank, seen->second.session, {}});
                outstanding_.erase(seen);
            } else if (now > seen->second.expires_unix_ms + kExpiryGraceMilliseconds) {
                // Gave up (its deadline passed) or died before connecting: the rank stays unusable.
                found.push_back({RendezvousEvent::Kind::failed, seen->second.rank, seen->second.session, {}});
                outstanding_.erase(seen);
            }
        }
        if (announced) outstanding_.emplace(announced->first, announced->second);
        for (RendezvousEvent& event : found) events_.push_back(std::move(event));
    }

    // Clocks of different hosts differ a little; a replacement that finishes just on its
    // deadline is not reported as given up.
    static constexpr std::int64_t kExpiryGraceMilliseconds = 2000;

    const std::shared_ptr<PmixSession> session_;
    const std::string job_;
    const std::uint64_t sequence_;
    const std::uint32_t rank_;
    const std::uint32_t world_size_;
    std::uint64_t next_index_;  // the watch thread's alone
    const std::chrono::milliseconds period_;
    std::atomic<std::uint64_t> finished_rounds_{0};
    bool lookup_failure_logged_ = false;  // the watch thread's alone
    // The namespace of each replaced rank's current process (rank 0 there); the watch thread's.
    std::map<std::uint32_t, std::string> holders_;
    std::mutex mutex_;
    std::condition_variable wake_;
    bool stopping_ = false;
    std::map<std::uint64_t, Seen> outstanding_;  // announcements seen, neither ready nor expired
    std::vector<RendezvousEvent> events_;
    std::thread thread_;
};

}  // namespace

PmixSession::Replaces parse_pmix_replaces(std::string_view text) {
    const std::string what = std::string(kPmixReplacesVariable) + "='" + std::string(text) + "'";
    const std::size_t colon = text.rfind(':');
    if (colon == std::string_view::npos || colon == 0 || colon + 1 == text.size()) {
        throw Error(what + ": expected <namespace>:<rank>");
    }
    PmixSession::Replaces replaces;
    replaces.job = std::string(text.substr(0, colon));
    const std::string_view digits = text.substr(colon + 1);
    const auto [end, error] = std::from_chars(digits.data(), digits.data() + digits.size(), replaces.rank);
    if (error != std::errc() || end != digits.data() + digits.size()) {
        throw Error(what + ": the rank '" + std::string(digits) + "' is not a number");
    }
    return replaces;
}

std::string pmix_announcement_key(const std::string& job, std::uint64_t sequence, std::uint64_t index) {
    return key_prefix(job, sequence) + std::to_string(index);
}
std::string pmix_acknowledgement_key(const std::string& job, std::uint64_t sequence, std::uint64_t index, std::uint32_t from_rank) {
    return key_prefix(job, sequence) + std::to_string(index) + ".from." + std::to_string(from_rank);
}
std::string pmix_ready_key(const std::string& job, std::uint64_t sequence, std::uint64_t index) {
    return key_prefix(job, sequence) + std::to_string(index) + ".ready";
}

PmixReplacementTable pmix_announce_replacement(PmixSession& session, const Endpoint& mine, std::uint32_t world_size,
                                               PmixSession::Clock::time_point deadline) {
    if (!session.replaces()) throw Error("PMIx peer replacement: this process was not started to replace a rank");
    const PmixSession::Replaces replaces = *session.replaces();
    const std::string me = "PMIx peer replacement of rank " + std::to_string(replaces.rank) + " of namespace " + replaces.job;
    if (mine.rank != replaces.rank) throw Error(me + ": the endpoint to announce is rank " + std::to_string(mine.rank) + "'s");
    PmixReplacementTable result;
    result.sequence = PmixSession::take_exchange_sequence();
    const std::string& job = replaces.job;

    // Every earlier announcement: a newer endpoint for the ranks already replaced, and whether
    // one is still in progress.
    std::map<std::uint32_t, Announcement> replaced;
    const std::int64_t now = unix_milliseconds(SystemClock::now());
    std::uint64_t index = 1;
    for (;; ++index) {
        const std::string key = pmix_announcement_key(job, result.sequence, index);
        const auto values = session.lookup({key, pmix_ready_key(job, result.sequence, index)});
        if (!values[0]) break;
        Announcement earlier;
        try {
            earlier = parse_announcement(key, *values[0]);
        } catch (const Error& error) {
            logger().warn("{}: announcement {} ignored: {}", me, index, error.what());
            continue;
        }
        if (values[1]) {
            replaced[earlier.rank] = std::move(earlier);
        } else if (now <= earlier.expires_unix_ms) {
            throw Error(me + ": rank " + std::to_string(earlier.rank) + " is being replaced (session " +
                        to_hex_u64(earlier.session) + ", announcement " + std::to_string(index) + ", for " +
                        std::to_string(earlier.expires_unix_ms - now) + " ms more); one replacement at a time");
        }
    }
    result.index = index;

    // Only a rank whose process ended is replaced: the launcher knows (its process table), and
    // the rank's own watch would refuse too. The process is the latest replacement's, if any.
    {
        const auto latest = replaced.find(mine.rank);
        const std::string holder_job = latest != replaced.end() ? latest->second.job : job;
        const std::uint32_t holder_rank = latest != replaced.end() ? 0 : mine.rank;
        const PmixSession::ProcessState state = session.process_state(holder_job, holder_rank);
        if (!state.ended) {
            throw Error(me + ": rank " + std::to_string(mine.rank) + " is alive: its process (pid " + std::to_string(state.pid) +
                        ", namespace " + holder_job + ") is in state '" + state.state +
                        "'; only a rank whose process ended is replaced");
        }
    }

    const std::string key = pmix_announcement_key(job, result.sequence, index);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - PmixSession::Clock::now());
    const Announcement announcement{mine.rank, mine.session, session.job(), unix_milliseconds(SystemClock::now() + left), mine};
    session.publish(key, announcement_text(announcement));
    // Two processes may publish the same index at once; the data store keeps the first.
    const auto kept = session.lookup({key});
    if (!kept[0]) throw Error(me + ": its announcement (key '" + key + "') cannot be read back");
    const Announcement winner = parse_announcement(key, *kept[0]);
    if (winner.session != mine.session) {
        throw Error(me + ": another process (session " + to_hex_u64(winner.session) + ", for rank " +
                    std::to_string(winner.rank) + ") announced itself as replacement " + std::to_string(index) +
                    " at the same time; one replacement at a time");
    }

    // Each live rank's endpoint: from its own replacement's announcement, else as the job's
    // first exchange published it.
    result.table.resize(world_size);
    for (std::uint32_t peer = 0; peer < world_size; ++peer) {
        if (peer == mine.rank) {
            result.table[peer] = mine;
            continue;
        }
        if (auto found = replaced.find(peer); found != replaced.end()) {
            result.table[peer] = found->second.endpoint;
        } else {
            const std::string key = pmix_common_row_key(result.sequence, mine.dc.empty());
            const std::string text = session.get(job, peer, key, deadline);
            try {
                const std::string row = pmix_row_for(text, std::nullopt, mine.rank, "key '" + key + "'");
                result.table[peer] = handshake::parse_table_row(nlohmann::json::parse(row), peer, mine.rank);
            } catch (const nlohmann::json::exception& error) {
                throw Error(me + ": rank " + std::to_string(peer) + "'s endpoint (key '" + key + "') is not JSON: " +
                            error.what());
            } catch (const Error& error) {
                throw Error(me + ": rank " + std::to_string(peer) + "'s endpoint: " + error.what());
            }
            if (result.table[peer].rank != peer) {
                throw Error(me + ": rank " + std::to_string(peer) + " published the endpoint of rank " +
                            std::to_string(result.table[peer].rank));
            }
        }
        result.table[peer].rc.clear();
    }

    for (const auto& [rank, earlier] : replaced) result.holders[rank] = earlier.job;

    // Every other rank acknowledges: RC with the queue pair it made for this process.
    std::vector<std::uint32_t> waiting;
    for (std::uint32_t peer = 0; peer < world_size; ++peer)
        if (peer != mine.rank) waiting.push_back(peer);
    while (!waiting.empty()) {
        std::vector<std::string> keys;
        for (std::uint32_t peer : waiting) keys.push_back(pmix_acknowledgement_key(job, result.sequence, index, peer));
        const auto values = session.lookup(keys);
        std::vector<std::uint32_t> still;
        for (std::size_t position = 0; position < waiting.size(); ++position) {
            const std::uint32_t peer = waiting[position];
            if (!values[position]) {
                still.push_back(peer);
                continue;
            }
            const Acknowledgement acknowledgement = parse_acknowledgement(keys[position], peer, mine.rank, *values[position]);
            if (!acknowledgement.refused.empty()) {
                throw Error(me + ": rank " + std::to_string(peer) + " refused it: " + acknowledgement.refused);
            }
            if (acknowledgement.entry) result.table[peer].rc.push_back(*acknowledgement.entry);
        }
        waiting.swap(still);
        if (waiting.empty()) break;
        if (PmixSession::Clock::now() >= deadline) {
            std::string ranks;
            for (std::uint32_t peer : waiting) ranks += (ranks.empty() ? "" : ", ") + std::to_string(peer);
            throw Error(me + ": rank(s) " + ranks + " did not connect this replacement before the deadline (each live " +
                        "rank must poll_peer_events() and reconnect(" + std::to_string(mine.rank) + "))");
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return result;
}

void pmix_announce_connected(PmixSession& session, const PmixReplacementTable& replacement, std::uint64_t my_session) {
    const PmixSession::Replaces& replaces = *session.replaces();
    session.publish(pmix_ready_key(replaces.job, replacement.sequence, replacement.index), to_hex_u64(my_session));
}

std::shared_ptr<PeerWatch> watch_through_pmix(std::shared_ptr<PmixSession> session, std::string job,
                                              std::uint64_t sequence, std::uint32_t rank, std::uint32_t world_size,
                                              std::uint64_t first_index, std::map<std::uint32_t, std::string> holders) {
    return std::make_shared<PmixWatch>(std::move(session), std::move(job), sequence, rank, world_size, first_index,
                                       std::move(holders));
}

}  // namespace rdmachan::detail
