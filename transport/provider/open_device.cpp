// Device selection and sharing: one device object per process and name, like one NIC shared
// by every channel of the process.
#include <cstdlib>
#include <map>
#include <mutex>

#include "rdmachan/error.hpp"
#include "common/logger.hpp"
#include "transport/device_interface.hpp"
#include "transport/fault/fault_injection.hpp"
#include "transport/provider/soft_provider.hpp"
#include "transport/provider/verbs_provider.hpp"
#include "transport/verbs/device_selection.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::transport {

const char* to_string(DeviceKind kind) noexcept {
    switch (kind) {
        case DeviceKind::soft: return "soft";
        case DeviceKind::mlx5: return "mlx5";
        case DeviceKind::verbs: return "verbs";
    }
    return "unknown";
}

namespace {

std::shared_ptr<Device> open_soft() {
    soft::DeviceOptions options;
    if (const char* address = std::getenv("RDMACHAN_SOFT_ADDRESS"); address != nullptr && *address != '\0') {
        options.address = address;
    }
    try {
        return make_soft_device(soft::Device::open(options));
    } catch (const soft::SoftDeviceError& error) {
        throw Error(std::string("open software device: ") + error.what());
    }
}

}  // namespace

namespace {

std::shared_ptr<Device> open_shared_device(std::string_view request);

}  // namespace

std::shared_ptr<Device> open_device(std::string_view request) {
    std::shared_ptr<Device> device = open_shared_device(request);
    if (std::shared_ptr<FaultPlan> plan = active_fault_plan()) return make_fault_injecting_device(std::move(device), plan);
    return device;
}

namespace {

std::shared_ptr<Device> open_shared_device(std::string_view request) {
    static std::mutex mutex;
    static std::map<std::string, std::weak_ptr<Device>, std::less<>> opened;

    std::string wanted(request.empty() ? "auto" : request);
    if (wanted == "auto") wanted = verbs::device_request_from_environment();
    verbs::DeviceDecision decision;
    try {
        decision = verbs::select_device_on_this_machine(wanted);
    } catch (const verbs::VerbsError& error) {
        throw Error(std::string("device '") + wanted + "': " + error.what());
    }
    const std::string key = decision.kind == verbs::DeviceKind::soft ? "soft" : decision.device_name;

    std::lock_guard lock(mutex);
    if (auto found = opened.find(key); found != opened.end()) {
        if (std::shared_ptr<Device> device = found->second.lock()) return device;
    }
    std::shared_ptr<Device> device;
    switch (decision.kind) {
        case verbs::DeviceKind::soft: device = open_soft(); break;
        case verbs::DeviceKind::mlx5: device = open_verbs_device(decision.device_name, true); break;
        case verbs::DeviceKind::verbs: device = open_verbs_device(decision.device_name, false); break;
    }
    detail::logger().info("device {}: {} ({})", device->name(), to_string(device->kind()), decision.reason);
    opened[key] = device;
    return device;
}

}  // namespace

}  // namespace rdmachan::transport
