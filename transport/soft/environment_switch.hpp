// A 0/1 switch of the software device read from the environment (RDMACHAN_SOFT_ZERO_HOP,
// RDMACHAN_SOFT_DOORBELL_REQUESTS, RDMACHAN_SOFT_CALLER_PROGRESS): unset or empty leaves the
// device's default; anything but 0 or 1 is refused naming the variable, never guessed at.
#pragma once

#include <cstdlib>
#include <optional>
#include <string>

#include "transport/soft/device.hpp"

namespace rdmachan::soft {

inline std::optional<bool> environment_switch(const char* name) {
    const char* setting = std::getenv(name);
    if (setting == nullptr || *setting == '\0') return std::nullopt;
    const std::string value(setting);
    if (value != "0" && value != "1") throw SoftDeviceError(std::string(name) + " = '" + value + "' is not 0 or 1");
    return value == "1";
}

}  // namespace rdmachan::soft
