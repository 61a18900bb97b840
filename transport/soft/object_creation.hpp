// The limits and checks the software device's object creation shares (device.cpp and one file
// per object: memory_region.cpp, completion_queue.cpp, shared_receive_queue.cpp, queue_pair.cpp).
// A ConnectX reports its own limits through ibv_query_device; these are the soft device's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "transport/soft/device.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::soft::creation {

inline constexpr std::uint32_t kMaxQueueEntries = 32768;
inline constexpr std::uint32_t kMaxScatterGatherElements = 30;
inline constexpr std::uint32_t kMaxInlineData = 912;
inline constexpr std::uint32_t kBlueFlameSize = 256;
// The records after a ring (completion_ring.hpp names its words).
inline constexpr std::size_t kDoorbellBlockBytes = 64;

// Peers learn the arena, and its new size, before any region or ring in it is published
// (caller holds the device mutex).
inline void publish_ring_memory(DeviceCore& core) {
    if (core.arena.base() != nullptr) core.published_table.publish_arena(core.arena);
}

inline std::uint32_t round_up_power_of_two(std::uint32_t value) {
    std::uint32_t result = 1;
    while (result < value) result <<= 1;
    return result;
}

[[noreturn]] inline void fail(const std::string& message) {
    throw SoftDeviceError(message);
}

inline void check_range(const char* call, const char* field, std::uint64_t value, std::uint64_t low,
                        std::uint64_t high) {
    if (value < low || value > high) {
        fail(std::string(call) + ": " + field + " = " + std::to_string(value) +
             " is out of range [" + std::to_string(low) + ", " + std::to_string(high) + "]");
    }
}

}  // namespace rdmachan::soft::creation
