// The public side of the library's logger (rdmachan/logging.hpp); the logger is common/logger.hpp.
#include <string>

#include "common/logger.hpp"
#include "rdmachan/logging.hpp"

namespace rdmachan {

void set_log_level(std::string_view level) {
    detail::logger().set_level(spdlog::level::from_str(std::string(level)));
}

}  // namespace rdmachan
