// Verbs devices behind the transport interface. On an mlx5 device (mlx5dv_is_supported) queue
// pairs and completion queues are created through mlx5dv and driven by the ring family: the
// direct data path. On any other verbs device (soft-RoCE, other vendors) the generic
// ibv_post_send / ibv_poll_cq path is used.
#pragma once

#include <memory>
#include <string_view>

#include "transport/device_interface.hpp"

namespace rdmachan::transport {

// direct: drive the device through the mlx5 rings (only for mlx5 devices).
std::shared_ptr<Device> open_verbs_device(std::string_view name, bool direct);

}  // namespace rdmachan::transport
