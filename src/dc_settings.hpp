// What a MultiChannel in DC mode asks of the engine, and what it knows of a DC peer: the values
// that cross from the multi-channel layer into DC routing (src/dc_routing.hpp).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/multi_channel.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::detail {

// DC mode: W DC initiators shared by every peer, one DC target fed by a shared receive queue of
// engine-owned receive buffers.
struct DcSettings {
    bool enabled = false;
    std::uint32_t initiators = 4;
    std::optional<std::uint64_t> key;              // the access key of this process's DC target
    std::uint32_t receive_buffers = 256;           // in the shared receive queue
    std::uint32_t receive_size = kDcMaxSendBytes;  // bytes each: the largest message a peer may send
};

// A peer's DC target, and the initiators its messages will come from.
struct DcPeerAddress {
    transport::Gid gid{};
    std::uint16_t lid = 0;
    std::uint32_t dctn = 0;
    std::uint64_t key = 0;
    std::vector<std::uint32_t> initiators;
    std::string device;
};

}  // namespace rdmachan::detail
