#include "src/settings_environment.hpp"

#include <cstdlib>
#include <string>

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

ChannelSettings settings_from_environment() {
    ChannelSettings settings;
    const char* value = std::getenv("RDMACHAN_CQE_COMPRESSION");
    if (value == nullptr || *value == '\0') return settings;
    for (CqeCompression compression : {CqeCompression::off, CqeCompression::hash, CqeCompression::checksum,
                                       CqeCompression::checksum_stride_index}) {
        if (std::string(value) == to_string(compression)) {
            settings.cqe_compression = compression;
            return settings;
        }
    }
    throw Error(std::string("RDMACHAN_CQE_COMPRESSION = '") + value +
                "' is not off, hash, checksum or checksum_stride_index");
}

}  // namespace rdmachan::detail
