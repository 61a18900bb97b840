#include "transport/verbs/device_selection.hpp"

#include <fmt/format.h>
#include <infiniband/mlx5dv.h>
#include <infiniband/verbs.h>

#include <cerrno>
#include <cstdlib>

#include "common/logger.hpp"
#include "transport/verbs/context.hpp"
#include "transport/verbs/device_list.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

namespace {

bool usable(const DeviceCandidate& candidate) {
    return candidate.problem.empty() && candidate.has_active_port;
}

std::string why_unusable(const DeviceCandidate& candidate) {
    if (!candidate.problem.empty()) return candidate.problem;
    return "no ACTIVE port";
}

std::string describe_candidates(std::span<const DeviceCandidate> candidates) {
    if (candidates.empty()) return "no RDMA device on this machine";
    std::string text;
    for (const DeviceCandidate& candidate : candidates) {
        if (!text.empty()) text += ", ";
        text += candidate.name;
        if (!usable(candidate)) text += " (" + why_unusable(candidate) + ")";
    }
    return text;
}

}  // namespace

const char* to_string(DeviceKind kind) noexcept {
    switch (kind) {
        case DeviceKind::mlx5:
            return "mlx5";
        case DeviceKind::verbs:
            return "verbs";
        case DeviceKind::soft:
            return "soft";
    }
    return "unknown";
}

DeviceDecision select_device(std::string_view request,
                             std::span<const DeviceCandidate> candidates) {
    if (request == "soft") {
        return {DeviceKind::soft, "", "software device requested explicitly"};
    }
    if (request.empty() || request == "auto") {
        for (const DeviceCandidate& candidate : candidates) {
            if (usable(candidate) && candidate.mlx5_direct) {
                return {DeviceKind::mlx5, candidate.name,
                        fmt::format(
                            "auto: {} supports the mlx5 direct data path and has an active port",
                            candidate.name)};
            }
        }
        for (const DeviceCandidate& candidate : candidates) {
            if (usable(candidate)) {
                return {DeviceKind::verbs, candidate.name,
                        fmt::format(
                            "auto: no usable mlx5 device; {} has an active port, using the generic "
                            "verbs data path",
                            candidate.name)};
            }
        }
        return {DeviceKind::soft, "",
                fmt::format("auto: no usable RDMA device ({}); falling back to the software device",
                            describe_candidates(candidates))};
    }
    for (const DeviceCandidate& candidate : candidates) {
        if (candidate.name != request) continue;
        if (!usable(candidate)) {
            throw VerbsError(
                fmt::format("select device '{}': the device exists but cannot be used: {}", request,
                            why_unusable(candidate)),
                ENODEV);
        }
        const DeviceKind kind = candidate.mlx5_direct ? DeviceKind::mlx5 : DeviceKind::verbs;
        return {kind, candidate.name,
                fmt::format("device {} requested explicitly ({} data path)", candidate.name,
                            kind == DeviceKind::mlx5 ? "mlx5 direct" : "generic verbs")};
    }
    throw VerbsError(
        fmt::format("select device '{}': no such device; expected auto, soft or one of: {}",
                    request, describe_candidates(candidates)),
        ENODEV);
}

std::string device_request_from_environment() {
    const char* value = std::getenv("RDMACHAN_DEVICE");
    if (value == nullptr || *value == '\0') return "auto";
    return value;
}

std::vector<DeviceCandidate> discover_device_candidates() {
    std::vector<DeviceCandidate> candidates;
    const DeviceList list;
    for (ibv_device* device : list.devices()) {
        DeviceCandidate candidate;
        candidate.name = ibv_get_device_name(device);
        candidate.mlx5_direct = mlx5dv_is_supported(device);
        try {
            const std::shared_ptr<Context> context = Context::open(candidate.name);
            for (std::uint8_t port = 1; port <= context->port_count(); ++port) {
                ibv_port_attr attributes{};
                if (ibv_query_port(context->handle(), port, &attributes) == 0 &&
                    attributes.state == IBV_PORT_ACTIVE) {
                    candidate.has_active_port = true;
                    break;
                }
            }
        } catch (const VerbsError& error) {
            candidate.problem = error.what();
        }
        candidates.push_back(std::move(candidate));
    }
    return candidates;
}

DeviceDecision select_device_on_this_machine(std::string_view request) {
    const std::vector<DeviceCandidate> candidates = discover_device_candidates();
    DeviceDecision decision = select_device(request, candidates);
    rdmachan::detail::logger().info("device selection: {} {} — {}", to_string(decision.kind),
                                    decision.device_name, decision.reason);
    return decision;
}

}  // namespace rdmachan::verbs
