// PMIx calls with a deadline (pmix_waits.hpp).
#include "handshake/pmix_waits.hpp"

#include <atomic>
#include <string>
#include <thread>

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

namespace {

// One PMIx_Init on its helper thread.
struct InitializeWait : OperationWait {
    bool abandoned = false;  // the caller stopped waiting: the helper finalizes what it opened
    pmix_proc_t self{};
};

// Set while a PMIx_Init that was given up has not returned: it holds libpmix's lock, and a
// second PMIx_Init would wait on that lock for as long.
std::atomic<bool> initialization_stuck{false};

void initialize_on_helper(const std::shared_ptr<InitializeWait>& wait) {
    pmix_proc_t self{};
    const pmix_status_t status = PMIx_Init(&self, nullptr, 0);
    std::unique_lock<std::mutex> lock(wait->mutex);
    if (wait->abandoned) {
        lock.unlock();
        if (status == PMIX_SUCCESS) PMIx_Finalize(nullptr, 0);
        initialization_stuck.store(false);
        return;
    }
    wait->status = status;
    wait->self = self;
    wait->done = true;
    lock.unlock();
    wait->done_changed.notify_all();
}

}  // namespace

void initialize_pmix(pmix_proc_t& self, std::chrono::steady_clock::time_point deadline) {
    if (initialization_stuck.load()) {
        throw Error("PMIx_Init: an earlier PMIx_Init of this process never returned and still holds libpmix's lock "
                    "(its launcher's server never answered it): PMIx is unusable in this process; start it again");
    }
    const auto started = std::chrono::steady_clock::now();
    auto wait = std::make_shared<InitializeWait>();
    std::thread helper([wait] { initialize_on_helper(wait); });
    std::unique_lock<std::mutex> lock(wait->mutex);
    if (!wait->done_changed.wait_until(lock, deadline, [&] { return wait->done; })) {
        wait->abandoned = true;
        initialization_stuck.store(true);
        lock.unlock();
        helper.detach();
        const auto waited = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - started);
        throw Error("PMIx_Init did not return within " + std::to_string(waited.count()) +
                    " ms (the deadline): the launcher's PMIx server accepted this process's connection but never "
                    "answered it (handshake/README.md, \"A launcher that never answers\": Open MPI 4.1's mpirun with "
                    "PMIx 4.2 loses a process started by PMIx_Spawn this way after another of its processes died); "
                    "PMIx is unusable in this process: start it again");
    }
    lock.unlock();
    helper.join();
    if (wait->status != PMIX_SUCCESS) {
        throw Error(std::string("PMIx_Init failed: ") + PMIx_Error_string(wait->status) +
                    " (was this process started by a PMIx launcher such as mpirun, srun --mpi=pmix or prterun?)");
    }
    self = wait->self;
}

void operation_finished(pmix_status_t status, void* data) {
    finish_operation<OperationWait>(data, status, [](OperationWait&) {});
}

pmix_status_t await_operation(pmix_status_t started, std::shared_ptr<OperationWait>* holder,
                              const std::shared_ptr<OperationWait>& wait, std::chrono::steady_clock::time_point until) {
    if (started == PMIX_OPERATION_SUCCEEDED) {
        delete holder;
        return PMIX_SUCCESS;
    }
    if (started != PMIX_SUCCESS) {
        delete holder;
        return started;
    }
    std::unique_lock<std::mutex> lock(wait->mutex);
    if (!wait->done_changed.wait_until(lock, until, [&] { return wait->done; })) return PMIX_ERR_TIMEOUT;
    return wait->status;
}

}  // namespace rdmachan::detail
