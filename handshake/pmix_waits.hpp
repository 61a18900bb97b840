// PMIx calls with a deadline. libpmix's blocking calls wait on a condition variable with no end
// (PMIx_Init included), and a launcher's server that never answers would hang this process: the
// calls here wait until a deadline and then throw or report a timeout. Included only by the
// files compiled with libpmix (pmix_bootstrap.cpp, pmix_launcher_calls.cpp).
#pragma once

#include <pmix.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>

namespace rdmachan::detail {

// PMIx_Init, run on a helper thread while this one waits until `deadline`. Fills `self`.
// Throws rdmachan::Error naming PMIx_Init's return code, or saying it did not return in time:
// the helper thread is then left in libpmix, which holds its own lock while it waits, so every
// later initialize_pmix of this process fails at once, saying why (until that PMIx_Init
// returns, if ever; it is then finalized).
void initialize_pmix(pmix_proc_t& self, std::chrono::steady_clock::time_point deadline);

// What one non-blocking PMIx call shares with its callback (a pmix_op_cbfunc_t): the callback
// may come after this process stopped waiting, so it lives on the heap until both are done.
struct OperationWait {
    std::mutex mutex;
    std::condition_variable done_changed;
    bool done = false;
    pmix_status_t status = PMIX_SUCCESS;
};

// The callback's side: `data` is what call_and_wait gave the _nb call. Reads the callback's data
// with `fill(Wait&)` under the wait's lock, marks it done with `status`, and frees `data`.
template <typename Wait, typename Fill>
void finish_operation(void* data, pmix_status_t status, Fill&& fill) {
    auto* holder = static_cast<std::shared_ptr<OperationWait>*>(data);
    {
        const std::lock_guard<std::mutex> lock((*holder)->mutex);
        fill(static_cast<Wait&>(**holder));
        (*holder)->status = status;
        (*holder)->done = true;
    }
    (*holder)->done_changed.notify_all();
    delete holder;
}

// A pmix_op_cbfunc_t for calls whose callback carries nothing but a status.
void operation_finished(pmix_status_t status, void* data);

// Waits for the _nb call whose `started` status is given, `holder` being the data passed to it:
// PMIX_OPERATION_SUCCEEDED (done at once, no callback comes) is success, another error is
// returned as it is; otherwise the callback's status, or PMIX_ERR_TIMEOUT once `until` passed.
// `wait` is read, not `holder`, which the callback may already have freed.
pmix_status_t await_operation(pmix_status_t started, std::shared_ptr<OperationWait>* holder,
                              const std::shared_ptr<OperationWait>& wait, std::chrono::steady_clock::time_point until);

// One non-blocking call and its wait: `start(void* data)` makes the _nb call with `data` as its
// callback's argument and returns what the call returned; see await_operation for the result.
template <typename Start>
pmix_status_t call_and_wait(const std::shared_ptr<OperationWait>& wait, std::chrono::steady_clock::time_point until,
                            Start&& start) {
    auto* holder = new std::shared_ptr<OperationWait>(wait);
    return await_operation(start(static_cast<void*>(holder)), holder, wait, until);
}

}  // namespace rdmachan::detail
