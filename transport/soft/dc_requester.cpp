// Dynamically connected transport on the software device: how a DCI's WQE reaches the DCT its
// address vector names, and how a DCT admits a request (DC key, per-initiator PSN) before
// performing it as an RC responder would.
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

DeviceCore::AddressOutcome DeviceCore::take_dc_address(QueuePairContext& queue_pair,
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

void DeviceCore::handle_dc_request(Connection& connection, QueuePairContext& target,
                                   const wire::Request& request, const std::uint8_t* payload,
                                   std::uint32_t payload_length) {
    // A DCT serves from RTR on (it has no RTS); before that it does not exist on the wire.
    if (target.state != QueuePairState::ready_to_receive) {
        flight::record(flight::SoftEvent::request_dropped, target.qpn, request.psn, 0, static_cast<std::uint64_t>(target.state),
                       flight::text("DCT not in RTR"));
        return;
    }
    if (request.dc_key != target.dc_access_key) {
        // The key is checked before anything else: the DCT's memory, SRQ and CQ stay untouched.
        // The NIC counts the violation (dctc.dc_access_key_violation_count, read by the kernel's
        // mlx5_ib query of a DCT) and raises MLX5_EVENT_TYPE_DCT_KEY_VIOLATION (0x1d) on the
        // target; the initiator is answered with a NAK and completes with a remote access error
        // (syndrome 0x13), the IB NAK for a request the responder may not serve (see README).
        ++target.dc_key_violations;
        flight::record(flight::SoftEvent::request_dropped, target.qpn, request.psn, 0, static_cast<std::uint64_t>(target.state),
                       flight::text("DC key violation (NAK sent)"));
        detail::logger().info("software device {}: DCT {}: DC key violation from QP {} (lid {})",
                              owner_.name(), target.qpn, request.source_qpn, connection.lid);
        respond(connection, wire::Response{request.source_qpn, request.psn,
                                           wire::ResponseKind::negative, kSyndromeRemoteAccess, 0});
        return;
    }
    const DcPeer peer{connection.gid, connection.lid, request.source_qpn};
    auto found = target.dc_expected_psn.find(peer);
    const bool retransmitted = (request.dc_flags & wire::kDcRetransmission) != 0;
    if ((request.dc_flags & wire::kDcConnect) != 0 && (!retransmitted || found == target.dc_expected_psn.end())) {
        // A (re)connecting DCI starts a new PSN sequence, as a DC connect does on the wire. A
        // retransmitted connect from a DCI this DCT knows may repeat one it executed: the PSN
        // check below decides, as for any other request.
        found = target.dc_expected_psn.insert_or_assign(peer, request.psn).first;
    }
    // Unknown initiators and out-of-sequence requests (after an RNR NAK) are dropped; the
    // initiator resends from the refused request.
    if (found == target.dc_expected_psn.end() || found->second != request.psn) {
        flight::record(flight::SoftEvent::request_dropped, target.qpn, request.psn,
                       found == target.dc_expected_psn.end() ? 0 : found->second, static_cast<std::uint64_t>(target.state),
                       flight::text(found == target.dc_expected_psn.end() ? "unknown DC initiator" : "PSN out of sequence"));
        return;
    }
    perform_request(connection, target, request, payload, payload_length, found->second);
}

}  // namespace rdmachan::soft
