// The transport interface's memory-layout entry point for devices without UMR: it says so.
#include "rdmachan/error.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::transport {

IndirectKeyRegistration ProtectionDomain::create_indirect_key(std::uint32_t) {
    throw Error("create_indirect_key: memory layouts need mlx5 UMR (a ConnectX or the software device); this device "
                "has none");
}

}  // namespace rdmachan::transport
