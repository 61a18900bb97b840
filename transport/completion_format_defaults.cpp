// Completion formats for devices that have none but the plain one: CQE compression refused by
// name, so that a channel asking for it fails when it is built rather than running without it.
#include <string>

#include "rdmachan/error.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::transport {

const char* to_string(CqeCompression compression) noexcept {
    switch (compression) {
        case CqeCompression::off:
            return "off";
        case CqeCompression::hash:
            return "hash";
        case CqeCompression::checksum:
            return "checksum";
        case CqeCompression::checksum_stride_index:
            return "checksum_stride_index";
    }
    return "unknown";
}

std::shared_ptr<CompletionQueue> ProtectionDomain::create_completion_queue(
    std::uint32_t depth, CqeCompression compression) {
    if (compression == CqeCompression::off) return create_completion_queue(depth);
    throw Error(std::string("cqe_compression = ") + to_string(compression) +
                ": this device does not compress CQEs (only a ConnectX does)");
}

}  // namespace rdmachan::transport
