// A thread that writes 64 KiB from the start of the initiator's buffer to one remote address,
// one write at a time, each waited for, until one is refused (remote access error) or anything
// else happens: what the deregistration-under-writes tests run against.
#pragma once

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>

#include "tests/soft/soft_endpoint.hpp"

namespace rdmachan::test {

class WriteStream {
public:
    WriteStream(SoftEndpoint& initiator, std::uint64_t address, std::uint32_t rkey)
        : thread_([this, &initiator, address, rkey] { run(initiator, address, rkey); }) {}
    ~WriteStream() { join(); }
    WriteStream(const WriteStream&) = delete;
    WriteStream& operator=(const WriteStream&) = delete;

    // Returns once a write succeeded, or after 10 s (started stays false then).
    void wait_started() const {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
        while (!started.load() && std::chrono::steady_clock::now() < until) std::this_thread::yield();
    }
    void join() {
        if (thread_.joinable()) thread_.join();
    }

    std::atomic<bool> started{false};
    std::atomic<int> succeeded{0};
    std::atomic<int> refused{0};
    std::atomic<int> other{0};  // anything else: a post refused, no completion, another status

private:
    void run(SoftEndpoint& initiator, std::uint64_t address, std::uint32_t rkey) {
        for (std::uint32_t i = 0; i < 1000000 && refused.load() == 0 && other.load() == 0; ++i) {
            std::memset(initiator.buffer(), static_cast<int>(i % 250 + 1), 65536);
            const mlx5::ScatterGatherElement source = initiator.local(0, 65536);
            const mlx5::SendWorkRequest write = write_request(i, &source, address, rkey);
            if (initiator.post(&write, 1) != mlx5::PostResult::ok) {
                ++other;
                return;
            }
            const auto completion = initiator.wait_send();
            if (completion && completion->status == mlx5::CompletionStatus::success) {
                ++succeeded;
                started.store(true);
            } else if (completion && completion->status == mlx5::CompletionStatus::remote_access_error) {
                ++refused;
            } else {
                ++other;
            }
        }
    }

    std::thread thread_;  // last: starts once the counters exist
};

// Waits until a zero-hop write of a peer holds `device`'s region `key` (between its checks and
// its move), so that what the caller does next meets a write in flight; returns the holder's pid,
// 0 if none held it before the deadline.
inline std::uint32_t wait_for_holder(const soft::Device& device, std::uint32_t key,
                                     std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (std::chrono::steady_clock::now() < until) {
        if (const std::uint32_t holder = device.zero_hop_holder(key); holder != 0) return holder;
        std::this_thread::yield();
    }
    return 0;
}

}  // namespace rdmachan::test
