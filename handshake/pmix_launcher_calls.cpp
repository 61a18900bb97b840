// PmixSession's calls into the launcher for peer replacement (pmix_bootstrap.hpp): its data
// store (publish, lookup), its process table and PMIx_Spawn. Each is a non-blocking call waited
// for with a deadline (pmix_waits.hpp): the launcher answers these at once, so a minute without
// an answer means it is lost, and this process says so instead of waiting without end.
#include <pmix.h>

#include <cstdlib>
#include <cstring>

#include "handshake/pmix_session_state.hpp"
#include "handshake/pmix_waits.hpp"
#include "rdmachan/error.hpp"

namespace rdmachan::detail {

namespace {

constexpr std::chrono::seconds kLauncherAnswer{60};

std::string no_answer() { return "no answer from the launcher within " + std::to_string(kLauncherAnswer.count()) + " s"; }

// This process as the errors name it.
std::string who(const PmixSession::State& state) {
    return "PMIx (namespace " + state.job + ", rank " + std::to_string(state.self.rank) + ")";
}

// Each wait keeps what it gave libpmix until libpmix is done with it (the callback may come
// after this process stopped waiting), and what the callback found.
struct PublishWait : OperationWait {
    pmix_info_t info{};
    ~PublishWait() { PMIX_INFO_DESTRUCT(&info); }
};

struct LookupWait : OperationWait {
    std::optional<std::string> value;
};

struct QueryWait : OperationWait {
    pmix_query_t query{};
    std::uint32_t rank = 0;
    std::optional<PmixSession::ProcessState> found;
    ~QueryWait() { PMIX_QUERY_DESTRUCT(&query); }
};

struct SpawnWait : OperationWait {
    pmix_app_t app{};
    std::string job;
    ~SpawnWait() { PMIX_APP_DESTRUCT(&app); }  // frees cmd, argv and env with free()
};

void lookup_finished(pmix_status_t status, pmix_pdata_t data[], std::size_t count, void* context) {
    finish_operation<LookupWait>(context, status, [&](LookupWait& wait) {
        for (std::size_t index = 0; index < count; ++index) {
            if (data[index].value.type == PMIX_STRING && data[index].value.data.string != nullptr) {
                wait.value = std::string(data[index].value.data.string);
            }
        }
    });
}

void query_finished(pmix_status_t status, pmix_info_t* results, std::size_t result_count, void* context,
                    pmix_release_cbfunc_t release, void* release_context) {
    finish_operation<QueryWait>(context, status, [&](QueryWait& wait) {
        auto take = [&](const pmix_proc_info_t& info) {
            if (info.proc.rank != wait.rank) return;
            // Every state above PMIX_PROC_STATE_UNTERMINATED is one of an ended process.
            wait.found = PmixSession::ProcessState{info.state > PMIX_PROC_STATE_UNTERMINATED,
                                                   PMIx_Proc_state_string(info.state), info.pid};
        };
        for (std::size_t index = 0; status == PMIX_SUCCESS && index < result_count; ++index) {
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
    });
    if (release != nullptr) release(release_context);
}

void spawn_finished(pmix_status_t status, pmix_nspace_t job, void* context) {
    finish_operation<SpawnWait>(context, status, [&](SpawnWait& wait) {
        if (job != nullptr) wait.job = std::string(job, strnlen(job, PMIX_MAX_NSLEN));
    });
}

char** string_array(const std::vector<std::string>& texts) {
    auto** array = static_cast<char**>(calloc(texts.size() + 1, sizeof(char*)));
    for (std::size_t index = 0; index < texts.size(); ++index) array[index] = strdup(texts[index].c_str());
    return array;
}

}  // namespace

void PmixSession::publish(const std::string& key, const std::string& value) {
    const std::string me = who(*state_);
    auto publish_wait = std::make_shared<PublishWait>();
    PMIX_INFO_LOAD(&publish_wait->info, key.c_str(), value.c_str(), PMIX_STRING);  // copies both
    const pmix_status_t status = call_and_wait(publish_wait, Clock::now() + kLauncherAnswer, [&](void* data) {
        return PMIx_Publish_nb(&publish_wait->info, 1, operation_finished, data);
    });
    if (status == PMIX_ERR_TIMEOUT) throw Error(me + ": PMIx_Publish of key '" + key + "': " + no_answer());
    if (status != PMIX_SUCCESS) throw Error(me + ": PMIx_Publish of key '" + key + "' failed: " + status_text(status));
}

std::vector<std::optional<std::string>> PmixSession::lookup(const std::vector<std::string>& keys) {
    // One key per lookup: given several keys that another job published, Open MPI 4.1.4's data
    // server answers only the last one (measured here), so a key would look unpublished. And
    // PMIx_Lookup_nb rather than PMIx_Lookup, which in libpmix 4.2.2 never frees the key array
    // it builds (a few dozen bytes per call, and a watch looks up every few tens of ms for the
    // life of the job); this array is ours, and PMIx_Lookup_nb has packed it when it returns.
    std::vector<std::optional<std::string>> values(keys.size());
    const std::string me = who(*state_);
    for (std::size_t index = 0; index < keys.size(); ++index) {
        std::string key = keys[index];
        char* key_array[] = {key.data(), nullptr};
        auto lookup_wait = std::make_shared<LookupWait>();
        // Without PMIX_WAIT the data server answers at once with what it has.
        const pmix_status_t status = call_and_wait(lookup_wait, Clock::now() + kLauncherAnswer, [&](void* data) {
            return PMIx_Lookup_nb(key_array, nullptr, 0, lookup_finished, data);
        });
        if (status == PMIX_ERR_TIMEOUT) throw Error(me + ": PMIx_Lookup_nb of '" + key + "': " + no_answer());
        if (status != PMIX_SUCCESS && status != PMIX_ERR_NOT_FOUND) {
            throw Error(me + ": PMIx_Lookup_nb of '" + key + "' failed: " + status_text(status));
        }
        if (status == PMIX_SUCCESS) {
            const std::lock_guard<std::mutex> lock(lookup_wait->mutex);
            values[index] = std::move(lookup_wait->value);
        }
    }
    return values;
}

PmixSession::ProcessState PmixSession::process_state(const std::string& job, std::uint32_t rank) {
    const std::string what = "PMIx: the state of rank " + std::to_string(rank) + " of namespace " + job;
    auto query_wait = std::make_shared<QueryWait>();
    query_wait->rank = rank;
    pmix_query_t& query = query_wait->query;
    PMIX_QUERY_CONSTRUCT(&query);
    query.keys = static_cast<char**>(calloc(2, sizeof(char*)));
    query.keys[0] = strdup(PMIX_QUERY_PROC_TABLE);
    PMIX_INFO_CREATE(query.qualifiers, 1);
    query.nqual = 1;
    PMIX_INFO_LOAD(&query.qualifiers[0], PMIX_NSPACE, job.c_str(), PMIX_STRING);
    const pmix_status_t status = call_and_wait(query_wait, Clock::now() + kLauncherAnswer, [&](void* data) {
        return PMIx_Query_info_nb(&query, 1, query_finished, data);
    });
    if (status == PMIX_ERR_TIMEOUT) throw Error(what + ": PMIx_Query_info(" PMIX_QUERY_PROC_TABLE "): " + no_answer());
    if (status != PMIX_SUCCESS) throw Error(what + ": PMIx_Query_info(" PMIX_QUERY_PROC_TABLE "): " + status_text(status));
    const std::lock_guard<std::mutex> lock(query_wait->mutex);
    if (!query_wait->found) throw Error(what + ": the launcher's process table has no such rank");
    return *query_wait->found;
}

std::string PmixSession::spawn(const std::vector<std::string>& command, const std::vector<std::string>& environment) {
    if (command.empty()) throw Error("PMIx_Spawn: no command given");
    const std::string me = who(*state_);
    auto spawn_wait = std::make_shared<SpawnWait>();
    pmix_app_t& app = spawn_wait->app;
    PMIX_APP_CONSTRUCT(&app);
    app.cmd = strdup(command.front().c_str());
    app.argv = string_array(command);
    app.env = string_array(environment);
    app.maxprocs = 1;
    const pmix_status_t status = call_and_wait(spawn_wait, Clock::now() + kLauncherAnswer, [&](void* data) {
        return PMIx_Spawn_nb(nullptr, 0, &app, 1, spawn_finished, data);
    });
    if (status == PMIX_ERR_TIMEOUT) {
        throw Error(me + ": PMIx_Spawn of '" + command.front() +
                    "': " + no_answer() + " (the process may still start)");
    }
    if (status != PMIX_SUCCESS) throw Error(me + ": PMIx_Spawn of '" + command.front() + "' failed: " + status_text(status));
    const std::lock_guard<std::mutex> lock(spawn_wait->mutex);
    if (spawn_wait->job.empty()) throw Error(me + ": PMIx_Spawn of '" + command.front() + "' named no namespace");
    return spawn_wait->job;
}

}  // namespace rdmachan::detail
