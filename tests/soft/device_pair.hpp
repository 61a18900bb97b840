// Test fixture: two software devices in this process, an initiator endpoint on one and a target
// endpoint on the other, connected both ways. The devices read their settings
// (RDMACHAN_SOFT_TRANSPORT, RDMACHAN_SOFT_ZERO_HOP) when they open, so the fixture sets them
// first and puts the environment back when it goes.
#pragma once

#include <memory>
#include <optional>

#include "tests/soft/scoped_environment.hpp"
#include "tests/soft/soft_endpoint.hpp"

namespace rdmachan::test {

struct DevicePairSettings {
    const char* transport = "auto";  // RDMACHAN_SOFT_TRANSPORT
    const char* zero_hop = nullptr;  // RDMACHAN_SOFT_ZERO_HOP; nullptr leaves the device's default
    EndpointOptions target;
    EndpointOptions initiator;
};

// Both endpoints' buffers from their devices' arenas (allocate_memory), on the same-host path.
inline DevicePairSettings allocated_pair_settings(const char* zero_hop = nullptr) {
    DevicePairSettings settings;
    settings.zero_hop = zero_hop;
    settings.target.allocated = true;
    settings.initiator.allocated = true;
    return settings;
}

class DevicePair {
    // The first member, so the variables are set before the devices below open.
    struct ScopedSettings {
        Environment transport;
        std::optional<Environment> zero_hop;
        explicit ScopedSettings(const DevicePairSettings& settings) : transport("RDMACHAN_SOFT_TRANSPORT", settings.transport) {
            if (settings.zero_hop != nullptr) zero_hop.emplace("RDMACHAN_SOFT_ZERO_HOP", settings.zero_hop);
        }
    } settings_;

public:
    explicit DevicePair(const DevicePairSettings& settings = {})
        : settings_(settings),
          target_device(soft::Device::open()),
          initiator_device(soft::Device::open()),
          target(target_device, settings.target),
          initiator(initiator_device, settings.initiator) {
        initiator.connect(target.address());
        target.connect(initiator.address());
        remote = target.address();
    }

    std::shared_ptr<soft::Device> target_device;
    std::shared_ptr<soft::Device> initiator_device;
    SoftEndpoint target;
    SoftEndpoint initiator;
    Address remote{};  // the target's buffer and rkey, as the initiator addresses them
};

// Two devices in this process, RC QPs connected over TCP (the same-host path forced off), the
// initiator's path to the target settled by a first request.
struct TcpDevicePair : DevicePair {
    explicit TcpDevicePair(const EndpointOptions& options = {}) : DevicePair({"tcp", nullptr, options, options}) {
        REQUIRE(settle_path(initiator, remote));
    }
};

}  // namespace rdmachan::test
