// Dynamically connected transport on the software device, the target's side: how a DCT admits a
// request (in RTR, the DC key, the initiator's PSN sequence) before performing it as an RC
// responder would.
#include "common/logger.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/answers.hpp"
#include "transport/soft/connection.hpp"
#include "transport/soft/flight_events.hpp"
#include "transport/soft/responder.hpp"

namespace rdmachan::soft {

using namespace rdmachan::mlx5;

void Responder::handle_dc_request(Connection& connection, QueuePairContext& target,
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
        answers_.respond(connection, wire::Response{request.source_qpn, request.psn,
                                           wire::ResponseKind::negative, kSyndromeRemoteAccess, 0});
        return;
    }
    const DcInitiatorAddress peer{connection.gid, connection.lid, request.source_qpn};
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
