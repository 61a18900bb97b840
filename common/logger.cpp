#include "common/logger.hpp"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <memory>

namespace rdmachan::detail {

spdlog::logger& logger() {
    static const std::shared_ptr<spdlog::logger> instance = [] {
        auto created = spdlog::stderr_color_mt("rdmachan");
        created->set_pattern("[%H:%M:%S.%e] [%n] [%l] [pid %P] %v");
        const char* level = std::getenv("RDMACHAN_LOG_LEVEL");
        created->set_level(level != nullptr ? spdlog::level::from_str(level) : spdlog::level::warn);
        return created;
    }();
    return *instance;
}

}  // namespace rdmachan::detail
