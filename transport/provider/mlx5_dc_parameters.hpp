// The connection parameters of a ConnectX DC initiator and DC target, apart from the verbs
// calls that apply them, so a unit test can check them without hardware: both on the
// configured port, the target at the negotiated MTU.
#pragma once

#include <cstdint>

#include "transport/device_interface.hpp"
#include "transport/verbs/connection.hpp"

namespace rdmachan::transport::mlx5_dc {

inline verbs::ConnectionParameters initiator_parameters(std::uint8_t port, const ConnectSettings& settings) {
    verbs::ConnectionParameters parameters;
    parameters.port_num = port;
    parameters.path_mtu = settings.path_mtu;
    parameters.send_psn = settings.local_psn;
    parameters.timeout = settings.ack_timeout;
    parameters.retry_count = settings.retry_count;
    parameters.rnr_retry = settings.rnr_retry;
    parameters.max_read_atomic = settings.max_rd_atomic;
    parameters.source_gid_index = settings.source_gid_index;
    return parameters;
}

inline verbs::ConnectionParameters target_parameters(std::uint8_t port, std::uint32_t path_mtu,
                                                     std::uint8_t min_rnr_timer, unsigned access) {
    verbs::ConnectionParameters parameters;
    parameters.port_num = port;
    parameters.path_mtu = path_mtu;
    parameters.min_rnr_timer = min_rnr_timer;
    parameters.access_flags = access;
    return parameters;
}

}  // namespace rdmachan::transport::mlx5_dc
