// The ConnectX DC provider's connection parameters (transport/provider/mlx5_dc_parameters.hpp),
// checked without hardware: the DC target is made ready on the configured port, the same one
// the initiators use (it was hard-coded to port 1 while the initiators took the setting).
#include <doctest/doctest.h>

#include "transport/provider/mlx5_dc_parameters.hpp"

using namespace rdmachan::transport;

TEST_CASE("mlx5 DC: target and initiators on the configured port, each with its own settings") {
    for (const std::uint8_t port : {std::uint8_t{1}, std::uint8_t{2}}) {
        CAPTURE(static_cast<int>(port));
        ConnectSettings settings;
        settings.path_mtu = 2048;
        settings.local_psn = 0xabcdef;
        settings.ack_timeout = 16;
        settings.retry_count = 3;
        settings.rnr_retry = 5;
        settings.max_rd_atomic = 4;
        settings.source_gid_index = 3;
        const auto initiator = mlx5_dc::initiator_parameters(port, settings);
        const auto target = mlx5_dc::target_parameters(port, 1024, 9, IBV_ACCESS_REMOTE_WRITE);
        CHECK(initiator.port_num == port);
        CHECK(target.port_num == port);
        CHECK(initiator.path_mtu == 2048);
        CHECK(initiator.send_psn == 0xabcdef);
        CHECK(initiator.timeout == 16);
        CHECK(initiator.retry_count == 3);
        CHECK(initiator.rnr_retry == 5);
        CHECK(initiator.max_read_atomic == 4);
        CHECK(initiator.source_gid_index == 3);
        CHECK(target.path_mtu == 1024);
        CHECK(target.min_rnr_timer == 9);
        CHECK(target.access_flags == IBV_ACCESS_REMOTE_WRITE);
    }
}
