// The transport interface's DC entry points for devices that have no DC: each says so.
#include "rdmachan/error.hpp"
#include "transport/device_interface.hpp"

namespace rdmachan::transport {
namespace {

[[noreturn]] void no_dc(const char* call) {
    throw Error(std::string(call) +
                ": DC (dynamically connected) mode needs an mlx5 device (ConnectX) or the software device; this "
                "device has no DC");
}

}  // namespace

std::shared_ptr<QueuePair> ProtectionDomain::create_dc_initiator(const QueuePairSettings&,
                                                                 std::shared_ptr<CompletionQueue>) {
    no_dc("create_dc_initiator");
}

void ProtectionDomain::recover_dc_initiator(QueuePair&) { no_dc("recover_dc_initiator"); }

std::shared_ptr<SharedReceiveQueue> ProtectionDomain::create_shared_receive_queue(std::uint32_t,
                                                                                  std::shared_ptr<CompletionQueue>) {
    no_dc("create_shared_receive_queue");
}

std::shared_ptr<DcTarget> ProtectionDomain::create_dc_target(std::shared_ptr<SharedReceiveQueue>,
                                                             std::shared_ptr<CompletionQueue>, std::uint64_t,
                                                             std::uint32_t) {
    no_dc("create_dc_target");
}

std::array<std::uint8_t, 48> ProtectionDomain::dc_address_vector(const PortIdentity&, const Gid&, std::uint16_t, std::uint32_t,
                                                                 std::uint64_t) {
    no_dc("dc_address_vector");
}

}  // namespace rdmachan::transport
