// A fault-injecting wrapper around any device of the transport interface, for tests: refused
// posts, error completions with chosen statuses and syndromes, and completions held back. The
// channel code above it cannot tell it from a device that misbehaves by itself, which is the
// point: every error path of the engine runs on demand.
//
//   auto plan = std::make_shared<rdmachan::transport::FaultPlan>();
//   rdmachan::transport::FaultInjection injection(plan);   // devices opened from now on are wrapped
//   plan->corrupt_completions = 1; plan->corrupt_status = ...;
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>

#include "transport/device_interface.hpp"

namespace rdmachan::transport {

struct FaultPlan {
    // The next `refuse_posts` calls to post_send/post_receive (any QP) post nothing and return
    // `refusal`.
    std::uint32_t refuse_posts = 0;
    mlx5::PostResult refusal = mlx5::PostResult::invalid_request;
    // The next `corrupt_completions` completions of queue pair `corrupt_qpn` (0: of any) carry
    // `corrupt_status` and `corrupt_syndrome` instead of what the device reported.
    std::uint32_t corrupt_completions = 0;
    std::uint32_t corrupt_qpn = 0;
    mlx5::CompletionStatus corrupt_status = mlx5::CompletionStatus::remote_access_error;
    std::uint8_t corrupt_syndrome = 0x13;
    // Every completion is handed out only this long after the device produced it (measured
    // from when a poll first finds it in the device's queue).
    std::chrono::microseconds delay{0};
    // Every completion is held until a queue pair of the device is moved to ERR, then handed out:
    // a completion that arrives only once the consumer has given up, whatever the scheduling.
    bool hold_until_error = false;

    // The next `refuse_address_vectors` DC address vectors asked for throw, as a failed
    // ibv_create_ah would (made at a DC peer's first use).
    std::uint32_t refuse_address_vectors = 0;

    // Set when a queue pair of the device was moved to ERR (releases what hold_until_error held).
    bool moved_to_error = false;

    // What was injected, for the tests' own checks.
    std::uint64_t refused = 0;
    std::uint64_t corrupted = 0;
    std::uint64_t delayed = 0;
};

std::shared_ptr<Device> make_fault_injecting_device(std::shared_ptr<Device> inner, std::shared_ptr<FaultPlan> plan);

// While one exists, open_device() wraps the devices it returns with this plan. One at a time;
// not for use while other threads open devices.
class FaultInjection {
public:
    explicit FaultInjection(std::shared_ptr<FaultPlan> plan);
    ~FaultInjection();
    FaultInjection(const FaultInjection&) = delete;
    FaultInjection& operator=(const FaultInjection&) = delete;
};

// The hook open_device() consults; null when no FaultInjection exists.
std::shared_ptr<FaultPlan> active_fault_plan();

}  // namespace rdmachan::transport
