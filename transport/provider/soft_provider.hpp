// The software mlx5 device behind the transport interface: its rings are driven by the ring
// family (mlx5_ring_queues.hpp), its control plane is the soft device's own.
#pragma once

#include <memory>

#include "transport/device_interface.hpp"
#include "transport/soft/device.hpp"

namespace rdmachan::transport {

std::shared_ptr<Device> make_soft_device(std::shared_ptr<soft::Device> device);

}  // namespace rdmachan::transport
