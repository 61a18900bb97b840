// The library's one logger. Internal: users set the level through rdmachan/logging.hpp or
// RDMACHAN_LOG_LEVEL.
#pragma once

#include <spdlog/spdlog.h>

#include "common/fmt_extern.hpp"  // after spdlog: its formatting loop is libfmt's, not compiled here

namespace rdmachan::detail {

spdlog::logger& logger();

}  // namespace rdmachan::detail
