// The PMIx bootstrap: endpoints through the launcher's PMIx server. Key design and why in
// README.md here ("PMIx bootstrap"). Compiled only when libpmix-dev was found.
#include "handshake/pmix_bootstrap.hpp"

#include <pmix.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
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

// Many gets at once: every one is started (PMIx_Get_nb) before any is waited for. libpmix
// carries each get to its progress thread and the answer back; made one at a time, each get
// costs the caller two thread switches, which with more ranks than cores is most of the read
// (docs/SCALE.md: at 256 ranks on 2 cores, 512 blocking gets per rank took 5-6 s). Started
// together, the progress thread answers them in one run.
struct BatchGet {
    struct Request {
        std::uint32_t peer = 0;
        std::string key;
    };
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<Request> requests;
    std::vector<std::string> values;
    std::vector<pmix_status_t> statuses;  // PMIX_ERR_NOT_FOUND until answered
    std::vector<std::string> wrong_types;  // a value that was not a string: its type
    std::size_t unanswered = 0;
    pmix_info_t info[2];  // kept until every callback has come: the _nb calls refer to it
};

// What one get's callback needs: the batch, and which request it answers.
struct BatchGetAnswer {
    std::shared_ptr<BatchGet> batch;
    std::size_t index = 0;
};

void batch_get_answered(pmix_status_t status, pmix_value_t* value, void* data) {
    std::unique_ptr<BatchGetAnswer> answer(static_cast<BatchGetAnswer*>(data));
    BatchGet& batch = *answer->batch;
    bool last = false;
    {
        const std::lock_guard<std::mutex> lock(batch.mutex);
        batch.statuses[answer->index] = value == nullptr && status == PMIX_SUCCESS ? PMIX_ERR_NOT_FOUND : status;
        if (status == PMIX_SUCCESS && value != nullptr) {
            if (value->type == PMIX_STRING && value->data.string != nullptr) {
                batch.values[answer->index] = value->data.string;
            } else {
                batch.wrong_types[answer->index] = PMIx_Data_type_string(value->type);
            }
        }
        last = --batch.unanswered == 0;
    }
    // The value is the callback's to release, as PMIx_Get's is its caller's (LeakSanitizer
    // showed one pmix_value_t left per get while it was not released here).
    if (value != nullptr) PMIX_VALUE_RELEASE(value);
    // Only the last answer wakes the reader: a wake per answer cost a thread switch per get.
    if (last) batch.changed.notify_all();
}

// The strings the requests name, each `key` as `peer` published it, looking only at what the
// fence delivered (PMIX_OPTIONAL). Throws naming the first request that failed, in order; a key
// that was never published adds `why_missing` (what may explain it) to the error.
std::vector<std::string> get_strings(const PmixSession::State& state, const std::string& me,
                                     std::vector<BatchGet::Request> requests, PmixSession::Clock::time_point deadline,
                                     const std::string& why_missing) {
    auto batch = std::make_shared<BatchGet>();
    batch->requests = std::move(requests);
    const std::size_t count = batch->requests.size();
    batch->values.resize(count);
    batch->statuses.assign(count, PMIX_ERR_NOT_FOUND);
    batch->wrong_types.resize(count);
    bool optional = true;
    int seconds = timeout_seconds(time_left(deadline));
    PMIX_INFO_LOAD(&batch->info[0], PMIX_OPTIONAL, &optional, PMIX_BOOL);
    PMIX_INFO_LOAD(&batch->info[1], PMIX_TIMEOUT, &seconds, PMIX_INT);
    for (std::size_t index = 0; index < count; ++index) {
        pmix_proc_t proc;
        PMIX_LOAD_PROCID(&proc, state.self.nspace, batch->requests[index].peer);
        {
            const std::lock_guard<std::mutex> lock(batch->mutex);
            ++batch->unanswered;
        }
        auto* answer = new BatchGetAnswer{batch, index};
        const pmix_status_t started =
            PMIx_Get_nb(&proc, batch->requests[index].key.c_str(), batch->info, 2, batch_get_answered, answer);
        if (started != PMIX_SUCCESS) {
            // No callback comes for a get that did not start.
            delete answer;
            const std::lock_guard<std::mutex> lock(batch->mutex);
            batch->statuses[index] = started;
            --batch->unanswered;
        }
    }
    std::unique_lock<std::mutex> lock(batch->mutex);
    // The server enforces PMIX_TIMEOUT; the grace period keeps a server that ignores it from
    // holding this process past its deadline by more.
    if (!batch->changed.wait_until(lock, deadline + std::chrono::seconds(2), [&] { return batch->unanswered == 0; })) {
        throw Error(me + ": " + std::to_string(batch->unanswered) + " of " + std::to_string(count) +
                    " PMIx gets of the peers' endpoints were not answered within the deadline");
    }
    for (std::size_t index = 0; index < count; ++index) {
        const BatchGet::Request& request = batch->requests[index];
        if (batch->statuses[index] != PMIX_SUCCESS) {
            throw Error(me + ": rank " + std::to_string(request.peer) + " never published key '" + request.key +
                        "' (PMIx_Get: " + status_text(batch->statuses[index]) + ")" + why_missing);
        }
        if (!batch->wrong_types[index].empty()) {
            throw Error(me + ": rank " + std::to_string(request.peer) + " published key '" + request.key + "' as " +
                        batch->wrong_types[index] + ", not a string");
        }
    }
    return std::move(batch->values);
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
const PmixSession::ExchangePhases& PmixSession::last_exchange_phases() const { return state_->last_phases; }

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
    const Clock::time_point started = Clock::now();

    // Publish the row keys (pmix_row_text): one value per reader and peer, in the table row form
    // the rendezvous's fast scanner reads. RC: the row's common part and the entries of one block
    // of consecutive peers (pmix_rc_block_size), a key per block: every PMIx_Put waits for
    // libpmix's progress thread, so a key per peer made N puts per rank (at 256 ranks on 2 cores
    // the publishing alone took up to 3.9 s), while one key of all N entries would make every
    // reader fetch N² bytes. A block of about √N entries is √N puts, and √N entries read per
    // peer. DC: the common part alone, one key.
    const bool rc_mode = mine.dc.empty();
    Endpoint common = mine;
    common.rc.clear();
    const std::uint32_t block_size = pmix_rc_block_size(state.world_size);
    const std::uint32_t block_count = (state.world_size + block_size - 1) / block_size;
    const handshake::TableRowText row = handshake::table_row_text(common);
    if (rc_mode) {
        std::vector<const RcEntry*> entry_for(state.world_size, nullptr);
        for (const RcEntry& entry : mine.rc) {
            if (entry.peer >= state.world_size) {
                throw Error(me + ": the endpoint has an RC entry for rank " + std::to_string(entry.peer) +
                            ", outside the world of " + std::to_string(state.world_size));
            }
            entry_for[entry.peer] = &entry;
        }
        for (std::uint32_t block = 0; block < block_count; ++block) {
            const std::uint32_t first = block * block_size;
            const std::uint32_t end = std::min(state.world_size, first + block_size);
            put_string(me, pmix_row_block_key(sequence, block),
                       pmix_row_text(row, std::span(entry_for).subspan(first, end - first)));
        }
    } else {
        put_string(me, pmix_row_key(sequence), pmix_row_text(row, {}));
    }
    if (const pmix_status_t status = PMIx_Commit(); status != PMIX_SUCCESS) {
        throw Error(me + ": PMIx_Commit failed: " + status_text(status));
    }

    const Clock::time_point published = Clock::now();
    fence(state, true, deadline, "exchanging endpoints");
    const Clock::time_point fenced = Clock::now();

    // Read: one get per peer, all started together (get_strings), of the key that holds this
    // rank's entry (RC) or the common part (DC). The rows go through the rendezvous's table
    // scanner; a table it does not take is read row by row as JSON, which names the field.
    const std::uint32_t my_block = my_rank / block_size;
    const std::string key = rc_mode ? pmix_row_block_key(sequence, my_block) : pmix_row_key(sequence);
    std::vector<BatchGet::Request> requests(state.world_size);
    for (std::uint32_t peer = 0; peer < state.world_size; ++peer) requests[peer] = {peer, key};
    const std::vector<std::string> texts =
        get_strings(state, me, std::move(requests), deadline,
                    rc_mode ? "; a rank in DC mode publishes no RC block keys: do all ranks use RC mode?"
                            : "; a rank in RC mode publishes only RC block keys: do all ranks use DC mode?");
    state.last_exchange_bytes = 0;
    std::string frame = R"({"type":"table","rows":[)";
    struct RowSpan {
        std::size_t start = 0;
        std::size_t length = 0;
    };
    std::vector<RowSpan> rows(state.world_size);  // where each peer's row lies in `frame`
    for (std::uint32_t peer = 0; peer < state.world_size; ++peer) {
        state.last_exchange_bytes += texts[peer].size();
        const std::string what = me + ": key '" + key + "' from rank " + std::to_string(peer);
        if (peer != 0) frame += ',';
        rows[peer].start = frame.size();
        frame += pmix_row_for(texts[peer], rc_mode ? std::optional(my_rank - my_block * block_size) : std::nullopt,
                              my_rank, what);
        rows[peer].length = frame.size() - rows[peer].start;
    }
    frame += "]}";
    std::vector<Endpoint> table;
    if (!handshake::scan_table(frame, state.world_size, my_rank, table)) {
        table.resize(state.world_size);
        for (std::uint32_t peer = 0; peer < state.world_size; ++peer) {
            const nlohmann::json json = parse_json(me, peer, key, frame.substr(rows[peer].start, rows[peer].length));
            try {
                table[peer] = handshake::parse_table_row(json, peer, my_rank);
                if (table[peer].rank != peer) throw Error("field 'rank' = " + std::to_string(table[peer].rank));
            } catch (const Error& error) {
                throw Error(me + ": the endpoint rank " + std::to_string(peer) + " published under key '" + key +
                            "': " + error.what());
            }
        }
    }
    const auto seconds = [](Clock::duration span) { return std::chrono::duration<double>(span).count(); };
    state.last_phases = {seconds(published - started), seconds(fenced - published), seconds(Clock::now() - fenced)};
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
