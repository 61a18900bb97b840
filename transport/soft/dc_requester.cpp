// Dynamically connected transport on the software device, the initiator's side: how a DCI's WQE
// reaches the DCT its address vector names (dc_responder.cpp has the target's side).
#include <cstring>

#include "transport/soft/flight_events.hpp"
#include "common/logger.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {

using namespace rdmachan::mlx5;

namespace {

// grh_gid_fl bit 30: the address vector carries a GRH, and rgid names the destination.
constexpr std::uint32_t kAddressVectorGlobalRoute = 1u << 30;

bool same_target(const RemoteQueuePair& left, const RemoteQueuePair& right) {
    return same_gid(left.gid, right.gid) && left.lid == right.lid && left.qpn == right.qpn;
}

}  // namespace

Requester::AddressOutcome Requester::take_dc_address(QueuePairContext& queue_pair,
                                                       const std::uint8_t* address_vector,
                                                       wire::Request& request) {
    const std::uint32_t dqp_dct = load_big32(address_vector + kAvDqpDct);
    // The device reads only the 48-byte extended form, the one the project's encoder writes; a
    // compact (16-byte) vector would change where the next segment starts.
    if ((dqp_dct & kExtendedAddressVector) == 0) return AddressOutcome::malformed;
    const bool global_route =
        (load_big32(address_vector + kAvGrhGidFl) & kAddressVectorGlobalRoute) != 0;
    RemoteQueuePair target;
    target.qpn = dqp_dct & 0xffffff;
    target.lid = load_big16(address_vector + kAvRlid);
    // Without a GRH a packet stays in the local subnet: here, the host this device listens on.
    if (global_route)
        std::memcpy(target.gid.data(), address_vector + kAvRgid, 16);
    else
        target.gid = gid;
    if (target.qpn == 0) return AddressOutcome::malformed;

    if (!same_target(queue_pair.receive_attributes.remote, target)) {
        // A DCI is connected to one DCT at a time; it moves on only once the previous one has
        // answered everything, which keeps the DCI's completions in posting order.
        if (!queue_pair.in_flight.empty()) return AddressOutcome::wait;
        queue_pair.receive_attributes.remote = target;
        queue_pair.dc_connected = false;
    }
    request.destination_qpn = target.qpn;
    request.dc_key = load_big64(address_vector + kAvDcKey);
    request.dc_flags = wire::kDcRequest;
    if (global_route) request.dc_flags |= wire::kDcGlobalRoute;
    if (!queue_pair.dc_connected) request.dc_flags |= wire::kDcConnect;
    queue_pair.dc_connected = true;
    return AddressOutcome::ready;
}

}  // namespace rdmachan::soft
