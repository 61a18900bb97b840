#include "src/settings_environment.hpp"

#include <cstdlib>
#include <string>

#include "rdmachan/error.hpp"

namespace rdmachan::detail {

namespace {

CqeCompression compression_from_environment() {
    const char* value = std::getenv("RDMACHAN_CQE_COMPRESSION");
    if (value == nullptr || *value == '\0') return CqeCompression::off;
    for (CqeCompression compression : {CqeCompression::off, CqeCompression::hash, CqeCompression::checksum,
                                       CqeCompression::checksum_stride_index}) {
        if (std::string(value) == to_string(compression)) return compression;
    }
    throw Error(std::string("RDMACHAN_CQE_COMPRESSION = '") + value +
                "' is not off, hash, checksum or checksum_stride_index");
}

bool scatter_to_cqe_from_environment() {
    const char* value = std::getenv("RDMACHAN_SCATTER_TO_CQE");
    if (value == nullptr || *value == '\0') return false;
    if (std::string(value) == "0" || std::string(value) == "1") return value[0] == '1';
    throw Error(std::string("RDMACHAN_SCATTER_TO_CQE = '") + value + "' is not 0 or 1");
}

}  // namespace

ChannelSettings settings_from_environment() {
    ChannelSettings settings;
    settings.cqe_compression = compression_from_environment();
    settings.scatter_to_cqe = scatter_to_cqe_from_environment();
    return settings;
}

}  // namespace rdmachan::detail
