// Ends the program, saying what hung, if the guarded scope takes longer than `limit`: for tests
// whose failure could be a call that never returns (a blocking read of an empty completion
// channel, an ibv_destroy_cq waiting for acknowledgements that never come), which would otherwise
// hang the run until CTest's or the VM's own timeout.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace rdmachan::test {

class Watchdog {
public:
    Watchdog(std::chrono::seconds limit, const char* what)
        : thread_([this, limit, what] {
              std::unique_lock<std::mutex> lock(mutex_);
              if (!done_condition_.wait_for(lock, limit, [this] { return done_; })) {
                  std::fprintf(stderr, "FAILED: %s did not return within %lld s\n", what,
                               static_cast<long long>(limit.count()));
                  std::_Exit(1);
              }
          }) {}
    Watchdog(const Watchdog&) = delete;
    Watchdog& operator=(const Watchdog&) = delete;
    ~Watchdog() {
        {
            std::lock_guard<std::mutex> lock(mutex_);
            done_ = true;
        }
        done_condition_.notify_one();
        thread_.join();
    }

private:
    std::mutex mutex_;
    std::condition_variable done_condition_;
    bool done_ = false;
    std::thread thread_;
};

}  // namespace rdmachan::test
