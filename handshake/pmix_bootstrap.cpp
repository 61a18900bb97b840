// The PMIx bootstrap: endpoints through the launcher's PMIx server. Key design and why in
// README.md here ("PMIx bootstrap"). Compiled only when libpmix-dev was found.
#include "handshake/pmix_bootstrap.hpp"

#include <pmix.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

struct PmixSession::State {
    pmix_proc_t self{};
    std::uint32_t world_size = 0;
    std::string job;
    std::uint64_t last_exchange_bytes = 0;
    std::optional<PmixSession::Replaces> replaces;
    std::uint64_t last_sequence = 0;
};

namespace {

std::atomic<std::uint64_t> exchanges_started{0};

std::string status_text(pmix_status_t status) { return PMIx_Error_string(status); }

// PMIX_TIMEOUT takes whole seconds: the time left, rounded up, at least one.
int timeout_seconds(std::chrono::milliseconds left) {
    const auto seconds = (std::max<std::int64_t>(left.count(), 1) + 999) / 1000;
    return static_cast<int>(std::min<std::int64_t>(seconds, 1 << 30));
}

std::chrono::milliseconds time_left(PmixSession::Clock::time_point deadline) {
    return std::max(std::chrono::milliseconds(0), std::chrono::duration_cast<std::chrono::milliseconds>(
                                                      deadline - PmixSession::Clock::now()));
}

// One non-blocking fence. The state is shared with libpmix's callback, which may come after
// this process stopped waiting (deadline), so it lives on the heap until both are done.
struct FenceWait {
    std::mutex mutex;
    std::condition_variable done_changed;
    bool done = false;
    pmix_status_t status = PMIX_SUCCESS;
    pmix_proc_t everyone{};
    pmix_info_t info[2];
    std::size_t info_count = 0;
};

void fence_finished(pmix_status_t status, void* data) {
    auto* holder = static_cast<std::shared_ptr<FenceWait>*>(data);
    {
        const std::lock_guard<std::mutex> lock((*holder)->mutex);
        (*holder)->done = true;
        (*holder)->status = status;
    }
    (*holder)->done_changed.notify_all();
    delete holder;
}

// Fences every rank of the job; with `collect`, every rank's committed data reaches every
// rank. The server enforces PMIX_TIMEOUT; the local wait adds a grace period so a server that
// ignores it cannot hang this process either.
void fence(const PmixSession::State& state, bool collect, PmixSession::Clock::time_point deadline,
           const std::string& what) {
    const std::chrono::milliseconds left = time_left(deadline);
    const std::string me = "PMIx bootstrap (rank " + std::to_string(state.self.rank) + " of " +
                           std::to_string(state.world_size) + ", namespace " + state.job + ")";
    auto wait = std::make_shared<FenceWait>();
    PMIX_LOAD_PROCID(&wait->everyone, state.self.nspace, PMIX_RANK_WILDCARD);
    bool collect_data = collect;
    int seconds = timeout_seconds(left);
    PMIX_INFO_LOAD(&wait->info[0], PMIX_COLLECT_DATA, &collect_data, PMIX_BOOL);
    PMIX_INFO_LOAD(&wait->info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    wait->info_count = 2;
    auto* holder = new std::shared_ptr<FenceWait>(wait);
    const pmix_status_t started = PMIx_Fence_nb(&wait->everyone, 1, wait->info, wait->info_count, fence_finished, holder);
    pmix_status_t status = PMIX_SUCCESS;
    if (started == PMIX_OPERATION_SUCCEEDED) {
        delete holder;  // completed at once; no callback comes
    } else if (started != PMIX_SUCCESS) {
        delete holder;
        status = started;
    } else {
        std::unique_lock<std::mutex> lock(wait->mutex);
        const bool finished = wait->done_changed.wait_until(lock, deadline + std::chrono::seconds(2),
                                                             [&] { return wait->done; });
        status = finished ? wait->status : PMIX_ERR_TIMEOUT;
    }
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

std::shared_ptr<PmixSession> PmixSession::open() {
    auto state = std::make_unique<State>();
    const pmix_status_t status = PMIx_Init(&state->self, nullptr, 0);
    if (status != PMIX_SUCCESS) {
        throw Error("PMIx bootstrap: PMIx_Init failed: " + status_text(status) +
                    " (was this process started by a PMIx launcher such as mpirun, srun --mpi=pmix or prterun?)");
    }
    state->job = state->self.nspace;
    std::shared_ptr<PmixSession> session(new PmixSession(std::move(state)));  // finalizes from here on
    const State& opened = *session->state_;
    const std::string me = "PMIx bootstrap (rank " + std::to_string(opened.self.rank) + ", namespace " + opened.job + ")";
    const std::uint32_t size = session->job_size(opened.job);
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

void PmixSession::publish(const std::string& key, const std::string& value) {
    pmix_info_t info;
    PMIX_INFO_LOAD(&info, key.c_str(), value.c_str(), PMIX_STRING);  // copies both
    const pmix_status_t status = PMIx_Publish(&info, 1);
    PMIX_INFO_DESTRUCT(&info);
    if (status != PMIX_SUCCESS) {
        throw Error("PMIx (namespace " + state_->job + ", rank " + std::to_string(state_->self.rank) +
                    "): PMIx_Publish of key '" + key + "' failed: " + status_text(status));
    }
}

namespace {

// One non-blocking lookup, for the reason fence() is one: its state lives on the heap until both
// libpmix's callback and this process are done with it.
struct LookupWait {
    std::mutex mutex;
    std::condition_variable done_changed;
    bool done = false;
    pmix_status_t status = PMIX_SUCCESS;
    std::optional<std::string> value;
};

void lookup_finished(pmix_status_t status, pmix_pdata_t data[], std::size_t count, void* context) {
    auto* holder = static_cast<std::shared_ptr<LookupWait>*>(context);
    {
        const std::lock_guard<std::mutex> lock((*holder)->mutex);
        (*holder)->status = status;
        for (std::size_t index = 0; index < count; ++index) {
            if (data[index].value.type == PMIX_STRING && data[index].value.data.string != nullptr) {
                (*holder)->value = std::string(data[index].value.data.string);
            }
        }
        (*holder)->done = true;
    }
    (*holder)->done_changed.notify_all();
    delete holder;
}

}  // namespace

std::vector<std::optional<std::string>> PmixSession::lookup(const std::vector<std::string>& keys) {
    // One key per lookup: given several keys that another job published, Open MPI 4.1.4's data
    // server answers only the last one (measured here), so a key would look unpublished. And
    // PMIx_Lookup_nb rather than PMIx_Lookup, which in libpmix 4.2.2 never frees the key array
    // it builds (a few dozen bytes per call, and a watch looks up every few tens of ms for the
    // life of the job); this array is ours, and PMIx_Lookup_nb has packed it when it returns.
    std::vector<std::optional<std::string>> values(keys.size());
    const std::string me = "PMIx (namespace " + state_->job + ", rank " + std::to_string(state_->self.rank) + ")";
    for (std::size_t index = 0; index < keys.size(); ++index) {
        std::string key = keys[index];
        char* key_array[] = {key.data(), nullptr};
        auto wait = std::make_shared<LookupWait>();
        auto* holder = new std::shared_ptr<LookupWait>(wait);
        // Without PMIX_WAIT the data server answers at once with what it has.
        const pmix_status_t started = PMIx_Lookup_nb(key_array, nullptr, 0, lookup_finished, holder);
        if (started != PMIX_SUCCESS) {
            delete holder;
            throw Error(me + ": PMIx_Lookup_nb of '" + key + "' failed: " + status_text(started));
        }
        std::unique_lock<std::mutex> lock(wait->mutex);
        // The server answers a lookup at once; a minute without an answer is a lost server.
        if (!wait->done_changed.wait_for(lock, std::chrono::seconds(60), [&] { return wait->done; })) {
            throw Error(me + ": PMIx_Lookup_nb of '" + key + "': no answer from the launcher within 60 s");
        }
        if (wait->status != PMIX_SUCCESS && wait->status != PMIX_ERR_NOT_FOUND) {
            throw Error(me + ": PMIx_Lookup_nb of '" + key + "' failed: " + status_text(wait->status));
        }
        if (wait->status == PMIX_SUCCESS) values[index] = std::move(wait->value);
    }
    return values;
}

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

std::uint32_t PmixSession::job_size(const std::string& job) {
    pmix_proc_t everyone;
    PMIX_LOAD_PROCID(&everyone, job.c_str(), PMIX_RANK_WILDCARD);
    pmix_value_t* value = nullptr;
    const pmix_status_t status = PMIx_Get(&everyone, PMIX_JOB_SIZE, nullptr, 0, &value);
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

PmixSession::ProcessState PmixSession::process_state(const std::string& job, std::uint32_t rank) {
    const std::string what = "PMIx: the state of rank " + std::to_string(rank) + " of namespace " + job;
    pmix_query_t query;
    PMIX_QUERY_CONSTRUCT(&query);
    query.keys = static_cast<char**>(calloc(2, sizeof(char*)));
    query.keys[0] = strdup(PMIX_QUERY_PROC_TABLE);
    PMIX_INFO_CREATE(query.qualifiers, 1);
    query.nqual = 1;
    PMIX_INFO_LOAD(&query.qualifiers[0], PMIX_NSPACE, job.c_str(), PMIX_STRING);
    pmix_info_t* results = nullptr;
    std::size_t result_count = 0;
    const pmix_status_t status = PMIx_Query_info(&query, 1, &results, &result_count);
    PMIX_QUERY_DESTRUCT(&query);
    std::optional<ProcessState> found;
    auto take = [&](const pmix_proc_info_t& info) {
        if (info.proc.rank != rank) return;
        // Every state above PMIX_PROC_STATE_UNTERMINATED is one of an ended process.
        found = ProcessState{info.state > PMIX_PROC_STATE_UNTERMINATED, PMIx_Proc_state_string(info.state), info.pid};
    };
    if (status == PMIX_SUCCESS) {
        for (std::size_t index = 0; index < result_count; ++index) {
            if (results[index].value.type != PMIX_DATA_ARRAY || results[index].value.data.darray == nullptr) continue;
            const pmix_data_array_t& table = *results[index].value.data.darray;
            // Open MPI 4.1 answers an array of pmix_info_t each holding one pmix_proc_info_t; the
            // standard's form is an array of pmix_proc_info_t. Both are read.
            for (std::size_t entry = 0; entry < table.size; ++entry) {
                if (table.type == PMIX_PROC_INFO) {
                    take(static_cast<const pmix_proc_info_t*>(table.array)[entry]);
                } else if (table.type == PMIX_INFO) {
                    const pmix_info_t& info = static_cast<const pmix_info_t*>(table.array)[entry];
                    if (info.value.type == PMIX_PROC_INFO && info.value.data.pinfo != nullptr) take(*info.value.data.pinfo);
                }
            }
        }
    }
    if (results != nullptr) PMIX_INFO_FREE(results, result_count);
    if (status != PMIX_SUCCESS) throw Error(what + ": PMIx_Query_info(" PMIX_QUERY_PROC_TABLE "): " + status_text(status));
    if (!found) throw Error(what + ": the launcher's process table has no such rank");
    return *found;
}

std::string PmixSession::spawn(const std::vector<std::string>& command, const std::vector<std::string>& environment) {
    if (command.empty()) throw Error("PMIx_Spawn: no command given");
    // PMIX_APP_DESTRUCT frees cmd, argv and env with free(): they are strdup'ed.
    auto strings = [](const std::vector<std::string>& texts) {
        auto** array = static_cast<char**>(calloc(texts.size() + 1, sizeof(char*)));
        for (std::size_t index = 0; index < texts.size(); ++index) array[index] = strdup(texts[index].c_str());
        return array;
    };
    pmix_app_t app;
    PMIX_APP_CONSTRUCT(&app);
    app.cmd = strdup(command.front().c_str());
    app.argv = strings(command);
    app.env = strings(environment);
    app.maxprocs = 1;
    char job[PMIX_MAX_NSLEN + 1] = {};
    const pmix_status_t status = PMIx_Spawn(nullptr, 0, &app, 1, job);
    PMIX_APP_DESTRUCT(&app);
    if (status != PMIX_SUCCESS) {
        throw Error("PMIx (namespace " + state_->job + ", rank " + std::to_string(state_->self.rank) + "): PMIx_Spawn of '" +
                    command.front() + "' failed: " + status_text(status));
    }
    return job;
}

}  // namespace rdmachan::detail
