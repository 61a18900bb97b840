// The PMIx bootstrap: endpoints through the launcher's PMIx server. Key design and why in
// README.md here ("PMIx bootstrap"). Compiled only when libpmix-dev was found.
#include "handshake/pmix_bootstrap.hpp"

#include <pmix.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <nlohmann/json.hpp>

#include "handshake/pmix_session_state.hpp"
#include "handshake/pmix_waits.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::detail {

namespace {

std::atomic<std::uint64_t> exchanges_started{0};

// One non-blocking fence: its arguments stay with the wait, which libpmix's callback may
// outlive this process's waiting for.
struct FenceWait : OperationWait {
    pmix_proc_t everyone{};
    pmix_info_t info[2];
};

// Fences every rank of the job; with `collect`, every rank's committed data reaches every
// rank. The server enforces PMIX_TIMEOUT; the local wait adds a grace period so a server that
// ignores it cannot hang this process either.
void fence(const PmixSession::State& state, bool collect, PmixSession::Clock::time_point deadline,
           const std::string& what) {
    const std::chrono::milliseconds left = time_left(deadline);
    const std::string me = "PMIx bootstrap (rank " + std::to_string(state.self.rank) + " of " +
                           std::to_string(state.world_size) + ", namespace " + state.job + ")";
    auto fence_wait = std::make_shared<FenceWait>();
    PMIX_LOAD_PROCID(&fence_wait->everyone, state.self.nspace, PMIX_RANK_WILDCARD);
    bool collect_data = collect;
    int seconds = timeout_seconds(left);
    PMIX_INFO_LOAD(&fence_wait->info[0], PMIX_COLLECT_DATA, &collect_data, PMIX_BOOL);
    PMIX_INFO_LOAD(&fence_wait->info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    const pmix_status_t status = call_and_wait(fence_wait, deadline + std::chrono::seconds(2), [&](void* data) {
        return PMIx_Fence_nb(&fence_wait->everyone, 1, fence_wait->info, 2, operation_finished, data);
    });
    if (status == PMIX_ERR_TIMEOUT) {
        throw Error(me + ": the fence " + what + " did not complete within its deadline (" +
                    std::to_string(left.count()) +
                    " ms left when it began): some rank never reached it (it failed, hangs, or never called "
                    "connect()); PMIx: " + status_text(status));
    }
    if (status != PMIX_SUCCESS) throw Error(me + ": the fence " + what + " failed: PMIx_Fence: " + status_text(status));
}

void put_string(const std::string& me, const std::string& key, const std::string& text) {
    pmix_value_t value;
    PMIX_VALUE_CONSTRUCT(&value);
    value.type = PMIX_STRING;
    value.data.string = const_cast<char*>(text.c_str());  // PMIx_Put copies it
    const pmix_status_t status = PMIx_Put(PMIX_GLOBAL, key.c_str(), &value);
    if (status != PMIX_SUCCESS) throw Error(me + ": PMIx_Put of key '" + key + "' failed: " + status_text(status));
}

// The string PMIx_Get answered in `value`, which this releases. `what` names the key and its
// owner for the error when the value is of another type (a rank that published something else).
std::string take_string(pmix_value_t* value, const std::string& what) {
    if (value->type != PMIX_STRING || value->data.string == nullptr) {
        const std::string type = PMIx_Data_type_string(value->type);
        PMIX_VALUE_RELEASE(value);
        throw Error(what + " as " + type + ", not a string");
    }
    std::string text = value->data.string;
    PMIX_VALUE_RELEASE(value);
    return text;
}

// The string `key` that `peer` published, looking only at what the fence delivered
// (PMIX_OPTIONAL), so a key nobody published fails at once instead of waiting.
std::string get_string(const PmixSession::State& state, const std::string& me, std::uint32_t peer,
                       const std::string& key, PmixSession::Clock::time_point deadline) {
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, state.self.nspace, peer);
    pmix_info_t info[2];
    bool optional = true;
    int seconds = timeout_seconds(time_left(deadline));
    PMIX_INFO_LOAD(&info[0], PMIX_OPTIONAL, &optional, PMIX_BOOL);
    PMIX_INFO_LOAD(&info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    pmix_value_t* value = nullptr;
    const pmix_status_t status = PMIx_Get(&proc, key.c_str(), info, 2, &value);
    if (status != PMIX_SUCCESS || value == nullptr) {
        if (value != nullptr) PMIX_VALUE_RELEASE(value);
        throw Error(me + ": rank " + std::to_string(peer) + " never published key '" + key +
                    "' (PMIx_Get: " + status_text(status) + ")");
    }
    return take_string(value, me + ": rank " + std::to_string(peer) + " published key '" + key + "'");
}

// Launchers give a uint32 (Open MPI, PRRTE); accept the other unsigned widths too. 0 when the
// value is not an unsigned number.
std::uint64_t unsigned_value(const pmix_value_t& value) {
    switch (value.type) {
        case PMIX_UINT32: return value.data.uint32;
        case PMIX_UINT64: return value.data.uint64;
        case PMIX_UINT16: return value.data.uint16;
        case PMIX_SIZE: return value.data.size;
        default: return 0;
    }
}

nlohmann::json parse_json(const std::string& me, std::uint32_t peer, const std::string& key, const std::string& text) {
    try {
        return nlohmann::json::parse(text);
    } catch (const nlohmann::json::exception& error) {
        throw Error(me + ": the value of key '" + key + "' from rank " + std::to_string(peer) +
                    " is not JSON: " + error.what());
    }
}

}  // namespace

std::shared_ptr<PmixSession> PmixSession::open(Clock::time_point deadline) {
    auto state = std::make_unique<State>();
    try {
        initialize_pmix(state->self, deadline);
    } catch (const Error& error) {
        throw Error(std::string("PMIx bootstrap: ") + error.what());
    }
    state->job = state->self.nspace;
    std::shared_ptr<PmixSession> session(new PmixSession(std::move(state)));  // finalizes from here on
    const State& opened = *session->state_;
    const std::string me = "PMIx bootstrap (rank " + std::to_string(opened.self.rank) + ", namespace " + opened.job + ")";
    const std::uint32_t size = session->job_size(opened.job, deadline);
    if (opened.self.rank >= size) {
        throw Error(me + ": PMIx says rank " + std::to_string(opened.self.rank) + " of " + std::to_string(size) + " ranks");
    }
    session->state_->world_size = size;
    return session;
}

PmixSession::PmixSession(std::unique_ptr<State> state) : state_(std::move(state)) {}

PmixSession::~PmixSession() { PMIx_Finalize(nullptr, 0); }

std::uint32_t PmixSession::rank() const { return state_->self.rank; }
std::uint32_t PmixSession::world_size() const { return state_->world_size; }
const std::string& PmixSession::job() const { return state_->job; }
std::uint64_t PmixSession::last_exchange_bytes() const { return state_->last_exchange_bytes; }

std::vector<Endpoint> PmixSession::exchange(const Endpoint& mine, Clock::time_point deadline) {
    State& state = *state_;
    const std::uint32_t my_rank = state.self.rank;
    const std::string me = "PMIx bootstrap (rank " + std::to_string(my_rank) + " of " +
                           std::to_string(state.world_size) + ", namespace " + state.job + ")";
    if (mine.rank != my_rank) {
        throw Error(me + ": the endpoint to publish is rank " + std::to_string(mine.rank) + "'s");
    }
    const std::uint64_t sequence = take_exchange_sequence();
    state.last_sequence = sequence;

    // Publish: the endpoint without its RC entries under one key, and each RC entry under the
    // key of the rank it is for, so each peer fetches one small value from this rank.
    Endpoint common = mine;
    common.rc.clear();
    put_string(me, pmix_endpoint_key(sequence), serialize_endpoint(common));
    for (const RcEntry& entry : mine.rc) {
        if (entry.peer >= state.world_size) {
            throw Error(me + ": the endpoint has an RC entry for rank " + std::to_string(entry.peer) +
                        ", outside the world of " + std::to_string(state.world_size));
        }
        Endpoint only_entry;
        only_entry.rc.push_back(entry);
        nlohmann::json json;
        to_json(json, only_entry);
        put_string(me, pmix_rc_key(sequence, entry.peer), json["rc"][0].dump());
    }
    if (const pmix_status_t status = PMIx_Commit(); status != PMIX_SUCCESS) {
        throw Error(me + ": PMIx_Commit failed: " + status_text(status));
    }

    fence(state, true, deadline, "exchanging endpoints");

    // Read: every peer's common endpoint, plus (RC) the entry it created for this rank. The
    // schema's reader (from_json) checks the reassembled endpoint field by field.
    std::vector<Endpoint> table(state.world_size);
    state.last_exchange_bytes = 0;
    for (std::uint32_t peer = 0; peer < state.world_size; ++peer) {
        const std::string endpoint_key = pmix_endpoint_key(sequence);
        const std::string endpoint_text = get_string(state, me, peer, endpoint_key, deadline);
        state.last_exchange_bytes += endpoint_text.size();
        nlohmann::json json = parse_json(me, peer, endpoint_key, endpoint_text);
        if (!json.is_object()) throw Error(me + ": the value of key '" + endpoint_key + "' from rank " +
                                           std::to_string(peer) + " is not a JSON object");
        json["rc"] = nlohmann::json::array();
        const bool peer_in_dc_mode = json.contains("dc") && json["dc"].is_array() && !json["dc"].empty();
        if (!peer_in_dc_mode) {
            const std::string rc_key = pmix_rc_key(sequence, my_rank);
            const std::string rc_text = get_string(state, me, peer, rc_key, deadline);
            state.last_exchange_bytes += rc_text.size();
            json["rc"].push_back(parse_json(me, peer, rc_key, rc_text));
        }
        try {
            from_json(json, table[peer]);
        } catch (const Error& error) {
            throw Error(me + ": the endpoint rank " + std::to_string(peer) + " published: " + error.what());
        }
    }
    return table;
}

void PmixSession::barrier(Clock::time_point deadline) { fence(*state_, false, deadline, "before first use (barrier)"); }

std::uint64_t PmixSession::take_exchange_sequence() { return ++exchanges_started; }
std::uint64_t PmixSession::last_exchange_sequence() const { return state_->last_sequence; }

void PmixSession::set_replaces(Replaces replaces) { state_->replaces = std::move(replaces); }
const std::optional<PmixSession::Replaces>& PmixSession::replaces() const { return state_->replaces; }

std::string PmixSession::get(const std::string& job, std::uint32_t rank, const std::string& key, Clock::time_point deadline) {
    pmix_proc_t proc;
    PMIX_LOAD_PROCID(&proc, job.c_str(), rank);
    pmix_info_t info;
    int seconds = timeout_seconds(time_left(deadline));
    PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &seconds, PMIX_INT);
    pmix_value_t* value = nullptr;
    const pmix_status_t status = PMIx_Get(&proc, key.c_str(), &info, 1, &value);
    PMIX_INFO_DESTRUCT(&info);
    const std::string what = "PMIx: key '" + key + "' of rank " + std::to_string(rank) + " of namespace " + job;
    if (status != PMIX_SUCCESS || value == nullptr) {
        if (value != nullptr) PMIX_VALUE_RELEASE(value);
        throw Error(what + ": PMIx_Get: " + status_text(status));
    }
    return take_string(value, what + " was published");
}

std::uint32_t PmixSession::job_size(const std::string& job, Clock::time_point deadline) {
    pmix_proc_t everyone;
    PMIX_LOAD_PROCID(&everyone, job.c_str(), PMIX_RANK_WILDCARD);
    pmix_info_t info;
    int seconds = timeout_seconds(time_left(deadline));
    PMIX_INFO_LOAD(&info, PMIX_TIMEOUT, &seconds, PMIX_INT);
    pmix_value_t* value = nullptr;
    const pmix_status_t status = PMIx_Get(&everyone, PMIX_JOB_SIZE, &info, 1, &value);
    PMIX_INFO_DESTRUCT(&info);
    if (status != PMIX_SUCCESS || value == nullptr) {
        if (value != nullptr) PMIX_VALUE_RELEASE(value);
        throw Error("PMIx: the launcher gave no job size for namespace '" + job + "' (PMIx_Get of " PMIX_JOB_SIZE ": " +
                    status_text(status == PMIX_SUCCESS ? PMIX_ERR_NOT_FOUND : status) + ")");
    }
    const std::uint64_t size = unsigned_value(*value);
    PMIX_VALUE_RELEASE(value);
    if (size == 0 || size > UINT32_MAX) {
        throw Error("PMIx: the job size of namespace '" + job + "' (" PMIX_JOB_SIZE ") is not a positive 32-bit number");
    }
    return static_cast<std::uint32_t>(size);
}

}  // namespace rdmachan::detail
