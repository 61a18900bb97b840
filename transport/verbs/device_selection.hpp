// Which device a process uses: RDMACHAN_DEVICE=auto|soft|<verbs device name>, or the same
// string through the API. The decision is a plain value computed from a list of candidates,
// so the rules are tested with a fake list; the software device itself lives in transport/soft.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace rdmachan::verbs {

enum class DeviceKind { mlx5, verbs, soft };

const char* to_string(DeviceKind kind) noexcept;

// What selection needs to know about one verbs device.
struct DeviceCandidate {
    std::string name;
    bool mlx5_direct = false;  // mlx5dv_is_supported: the direct (ring) data path can drive it
    bool has_active_port = false;
    std::string problem;  // why it cannot be used (e.g. ibv_open_device failed); empty if fine
};

struct DeviceDecision {
    DeviceKind kind = DeviceKind::soft;
    std::string device_name;  // empty for the software device
    std::string reason;       // for the log: which device and why
};

// request: "auto" (or empty) | "soft" | a verbs device name.
// auto: the first usable mlx5 device, else the first other usable verbs device, else soft.
// A device named explicitly must exist and be usable, else VerbsError naming it and listing
// what exists: asking for hardware and silently getting software would hide a broken setup.
DeviceDecision select_device(std::string_view request, std::span<const DeviceCandidate> candidates);

// RDMACHAN_DEVICE, or "auto" when unset or empty.
std::string device_request_from_environment();

// Opens every verbs device on this machine briefly to fill the candidates. An empty vector
// when there is no RDMA device at all (not an error).
std::vector<DeviceCandidate> discover_device_candidates();

// discover + select + log the decision and its reason.
DeviceDecision select_device_on_this_machine(std::string_view request);

}  // namespace rdmachan::verbs
