// The library's one logger. Internal: users set the level through rdmachan/logging.hpp or
// RDMACHAN_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

namespace rdmachan::detail {

spdlog::logger& logger();

}  // namespace rdmachan::detail
