#include "transport/verbs/port.hpp"

#include <fmt/format.h>
#include <infiniband/verbs.h>

namespace rdmachan::verbs {

bool is_ipv4_mapped(const Gid& gid) noexcept {
    for (int i = 0; i < 10; ++i) {
        if (gid[i] != 0) return false;
    }
    return gid[10] == 0xff && gid[11] == 0xff;
}

bool is_ipv6_link_local(const Gid& gid) noexcept {
    return gid[0] == 0xfe && (gid[1] & 0xc0) == 0x80;
}

bool is_zero(const Gid& gid) noexcept {
    for (std::uint8_t byte : gid) {
        if (byte != 0) return false;
    }
    return true;
}

std::string to_string(const Gid& gid) {
    std::string text;
    for (int i = 0; i < 16; i += 2) {
        if (i != 0) text += ':';
        text += fmt::format("{:02x}{:02x}", gid[i], gid[i + 1]);
    }
    return text;
}

const char* to_string(GidType type) noexcept {
    switch (type) {
        case GidType::infiniband:
            return "IB";
        case GidType::roce_v1:
            return "RoCE v1";
        case GidType::roce_v2:
            return "RoCE v2";
    }
    return "unknown";
}

const char* to_string(LinkLayer layer) noexcept {
    switch (layer) {
        case LinkLayer::unspecified:
            return "unspecified";
        case LinkLayer::infiniband:
            return "InfiniBand";
        case LinkLayer::ethernet:
            return "Ethernet";
    }
    return "unknown";
}

std::uint32_t mtu_to_bytes(int ibv_mtu_value) noexcept {
    switch (ibv_mtu_value) {
        case IBV_MTU_256:
            return 256;
        case IBV_MTU_512:
            return 512;
        case IBV_MTU_1024:
            return 1024;
        case IBV_MTU_2048:
            return 2048;
        case IBV_MTU_4096:
            return 4096;
        default:
            return 0;
    }
}

int mtu_from_bytes(std::uint32_t bytes) noexcept {
    switch (bytes) {
        case 256:
            return IBV_MTU_256;
        case 512:
            return IBV_MTU_512;
        case 1024:
            return IBV_MTU_1024;
        case 2048:
            return IBV_MTU_2048;
        case 4096:
            return IBV_MTU_4096;
        default:
            return 0;
    }
}

}  // namespace rdmachan::verbs
