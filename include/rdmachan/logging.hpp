#pragma once

#include <string_view>

namespace rdmachan {

// The library logs through spdlog under the logger name "rdmachan". The level comes from the
// environment variable RDMACHAN_LOG_LEVEL (trace, debug, info, warn, error, critical, off;
// default warn) the first time the logger is used, or from set_log_level.
void set_log_level(std::string_view level);

}  // namespace rdmachan
