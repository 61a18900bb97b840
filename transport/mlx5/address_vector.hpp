// The 48-byte mlx5 address vector of a destination (struct mlx5_wqe_av; fields in
// mlx5-facts.md §1), built from its LID, SL, static rate and GRH the way libmlx5's
// mlx5_create_ah builds an address handle's (rdma-core 44 providers/mlx5/verbs.c), so that a DC
// initiator needs no ibv_ah to address a peer. make_dc_address_vector (wqe_segments.hpp) then
// adds the DCT number and key. Checked byte for byte against libmlx5's mlx5_create_ah, on
// InfiniBand and RoCE ports, with and without a GRH: tests/libmlx5/dc_differential_test.cpp.
// Header-only, usable as CUDA device code.
#pragma once

#include <cstdint>
#include <cstring>

#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/host_device.hpp"
#include "transport/mlx5/wqe_layout.hpp"

namespace rdmachan::mlx5 {

// grh_gid_fl bit 30: a GRH is present (InfiniBand; reserved on RoCE).
inline constexpr std::uint32_t kAvGlobalRoutePresent = 1u << 30;

struct GlobalRoute {
    std::uint8_t destination_gid[16] = {};
    std::uint32_t flow_label = 0;  // 20 bits
    std::uint8_t source_gid_index = 0;
    std::uint8_t hop_limit = 0;
    std::uint8_t traffic_class = 0;
};

struct Destination {
    std::uint16_t lid = 0;  // InfiniBand: the destination LID
    std::uint8_t service_level = 0;
    std::uint8_t static_rate = 0;       // an enum ibv_rate value (IBV_RATE_MAX: 0)
    std::uint8_t source_path_bits = 0;  // InfiniBand only
    bool global = false;                // a GRH, from `route`
    GlobalRoute route;
    // A RoCE port (Ethernet link layer): the GRH is required, the LID and path bits unused.
    bool ethernet = false;
    // RoCE v2 (the source GID's type): the UDP source port goes where the LID would.
    bool roce_v2 = false;
    // RoCE: the next hop's MAC, which the kernel resolves (ibv_create_ah asks it).
    std::uint8_t mac[6] = {};
    // RoCE v2 with flow label 0: the UDP source port (libmlx5 draws one at random from
    // 0xc000-0xffff). With a flow label the port is derived from it.
    std::uint16_t udp_source_port = 0xc000;
};

namespace address_vector_parts {

// enum ibv_rate (verbs.h) to the mlx5 static rate code, as libmlx5's ib_to_mlx5_rate_table maps
// it: 0 is unlimited, also for rates the device has no code for.
RDMACHAN_HOST_DEVICE constexpr std::uint8_t mlx5_static_rate(std::uint8_t rate) {
    switch (rate) {
        case 2:
            return 7;  // 2.5 Gb/s
        case 3:
            return 8;  // 10
        case 4:
            return 9;  // 30
        case 5:
            return 10;  // 5
        case 6:
            return 11;  // 20
        case 7:
            return 12;  // 40
        case 8:
            return 13;  // 60
        case 9:
            return 14;  // 80
        case 10:
            return 15;  // 120
        case 11:
            return 11;  // 14, as 20
        case 12:
            return 13;  // 56, as 60
        case 13:
            return 15;  // 112, as 120
        case 15:
            return 9;  // 25, as 30
        case 16:
            return 15;  // 100, as 120
        case 19:
            return 9;  // 28, as 30
        case 20:
            return 13;  // 50, as 60
        default:
            return 0;  // unlimited: IBV_RATE_MAX, 168, 200, 300, 400, 600 and unknown
    }
}

// The RoCE v2 UDP source port a flow label maps to (verbs.h ibv_flow_label_to_udp_sport): its
// low 14 bits folded with its top 6, in the range 0xc000-0xffff.
RDMACHAN_HOST_DEVICE constexpr std::uint16_t udp_source_port_of(std::uint32_t flow_label) {
    const std::uint32_t low = (flow_label & 0x3fff) ^ ((flow_label & 0xfc000) >> 14);
    return static_cast<std::uint16_t>(low | 0xc000);
}

}  // namespace address_vector_parts

// Writes the address vector; false (nothing written) for a RoCE destination without a GRH,
// which libmlx5 refuses (EINVAL). The DC key and DCT number stay zero.
RDMACHAN_HOST_DEVICE inline bool make_address_vector(
    std::uint8_t (&address_vector)[kAddressVectorSize], const Destination& destination) {
    if (destination.ethernet && !destination.global) return false;
    std::memset(address_vector, 0, kAddressVectorSize);
    const std::uint8_t rate = address_vector_parts::mlx5_static_rate(destination.static_rate);
    if (destination.ethernet) {
        // RoCE: a 3-bit SL above bit 0; no LID but, on v2, the UDP source port.
        address_vector[kAvStatRateSl] =
            static_cast<std::uint8_t>(rate << 4 | (destination.service_level & 7) << 1);
        if (destination.roce_v2) {
            const std::uint32_t flow_label = destination.route.flow_label & 0xfffff;
            store_big16(address_vector + kAvRlid, flow_label != 0
                                                      ? address_vector_parts::udp_source_port_of(flow_label)
                                                      : destination.udp_source_port);
        }
        std::memcpy(address_vector + kAvRmac, destination.mac, sizeof destination.mac);
    } else {
        address_vector[kAvStatRateSl] =
            static_cast<std::uint8_t>(rate << 4 | (destination.service_level & 0xf));
        address_vector[kAvFlMlid] = destination.source_path_bits & 0x7f;
        store_big16(address_vector + kAvRlid, destination.lid);
    }
    if (destination.global) {
        const GlobalRoute& route = destination.route;
        address_vector[kAvTclass] = route.traffic_class;
        address_vector[kAvHopLimit] = route.hop_limit;
        // The GRH-present bit is InfiniBand's; RoCE packets always carry a GRH and keep it 0.
        const std::uint32_t present = destination.ethernet ? 0 : kAvGlobalRoutePresent;
        store_big32(address_vector + kAvGrhGidFl,
                    present | static_cast<std::uint32_t>(route.source_gid_index) << 20 |
                        (route.flow_label & 0xfffff));
        std::memcpy(address_vector + kAvRgid, route.destination_gid, sizeof route.destination_gid);
    }
    return true;
}

}  // namespace rdmachan::mlx5
