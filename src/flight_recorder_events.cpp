// The flight recorder's event table: the names the dump prints. Kept beside the Event enum's
// comments (flight_recorder.hpp); a field left out is not printed.
#include "src/flight_recorder_events.hpp"

#include "src/flight_recorder.hpp"

namespace rdmachan::flight {
namespace {

using F = FieldFormat;

constexpr EventDescription kEvents[] = {
    {"none", {}},
    {"soft.doorbell", {{"qpn", F::hex}}},
    {"soft.wqe_executed", {{"qpn", F::hex}, {"wqe", F::decimal}, {"opcode", F::opcode}, {"psn", F::hex}, {"length", F::decimal}}},
    {"soft.request_dropped",
     {{"qpn", F::hex}, {"psn", F::hex}, {"expected_psn", F::hex}, {"state", F::qp_state}, {"why", F::text}}},
    {"soft.request_performed",
     {{"qpn", F::hex}, {"psn", F::hex}, {"opcode", F::opcode}, {"rkey", F::hex}, {"nak_syndrome", F::hex}}},
    {"soft.rnr_nak_sent", {{"qpn", F::hex}, {"psn", F::hex}, {"from_qpn", F::hex}, {"rnr_timer", F::decimal}}},
    {"soft.response", {{"qpn", F::hex}, {"psn", F::hex}, {"kind", F::answer}, {"syndrome", F::hex}, {"in_flight", F::decimal}}},
    {"soft.response_ignored",
     {{"qpn", F::hex}, {"psn", F::hex}, {"state", F::qp_state}, {"in_flight", F::decimal}, {"oldest_psn", F::hex}}},
    {"soft.retransmit",
     {{"qpn", F::hex}, {"from_psn", F::hex}, {"requests", F::decimal}, {"why", F::text}, {"retries_left", F::decimal}}},
    {"soft.completion",
     {{"qpn", F::hex}, {"wqe", F::decimal}, {"opcode", F::hex}, {"syndrome", F::hex}, {"receive", F::decimal}}},
    {"soft.qp_state", {{"qpn", F::hex}, {"from", F::qp_state}, {"to", F::qp_state}}},
    {"soft.qp_error", {{"qpn", F::hex}, {"why", F::text}}},
    {"soft.connection_closed", {{"lid", F::decimal}, {"outgoing", F::decimal}, {"why", F::text}}},
    {"soft.connections_holder", {{"attached", F::decimal}, {"why", F::text}}},
    {"channel.post_send",
     {{"peer", F::decimal}, {"qpn", F::hex}, {"ticket", F::hex}, {"requests", F::decimal}, {"first", F::work_request}}},
    {"channel.post_receive", {{"peer", F::decimal}, {"qpn", F::hex}, {"ticket", F::hex}, {"length", F::decimal}}},
    {"channel.post_refused", {{"peer", F::decimal}, {"ticket", F::hex}, {"status", F::status}, {"why", F::text}}},
    {"channel.completion",
     {{"qpn", F::hex}, {"ticket", F::hex}, {"status", F::status}, {"syndrome", F::hex}, {"bytes", F::decimal}}},
    {"channel.deadline", {{"peer", F::decimal}, {"ticket", F::hex}, {"operation", F::decimal}, {"deadline_ms", F::decimal}}},
    {"channel.qp_error", {{"peer", F::decimal}, {"qpn", F::hex}, {"why", F::text}}},
    {"handshake.frame_sent", {{"bytes", F::decimal}}},
    {"handshake.frame_received", {{"bytes", F::decimal}}},
    {"handshake.state", {{"what", F::text}, {"rank", F::decimal}, {"port", F::decimal}}},
    {"test.marker", {{"a", F::decimal}, {"b", F::decimal}, {"what", F::text}}},
};
static_assert(sizeof kEvents / sizeof kEvents[0] == static_cast<std::size_t>(Event::count),
              "every flight-recorder event has a description");

constexpr EventDescription kUnknown = {
    "unknown", {{"a", F::hex}, {"b", F::hex}, {"c", F::hex}, {"d", F::hex}, {"e", F::hex}}};

}  // namespace

const EventDescription& describe(std::uint16_t event) noexcept {
    return event < static_cast<std::uint16_t>(Event::count) ? kEvents[event] : kUnknown;
}

const char* queue_pair_state_name(std::uint64_t state) noexcept {
    constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "ERR"};
    return state < 5 ? kNames[state] : "?";
}

const char* completion_status_name(std::uint64_t status) noexcept {
    constexpr const char* kNames[] = {"success",
                                      "local_length_error",
                                      "local_qp_operation_error",
                                      "local_eec_operation_error",
                                      "local_protection_error",
                                      "work_request_flushed",
                                      "memory_window_bind_error",
                                      "bad_response",
                                      "local_access_error",
                                      "remote_invalid_request",
                                      "remote_access_error",
                                      "remote_operation_error",
                                      "transport_retry_exceeded",
                                      "rnr_retry_exceeded",
                                      "local_rdd_violation",
                                      "remote_invalid_rd_request",
                                      "remote_aborted",
                                      "invalid_eecn",
                                      "invalid_eec_state",
                                      "fatal",
                                      "response_timeout",
                                      "general_error"};
    return status < sizeof kNames / sizeof kNames[0] ? kNames[status] : "?";
}

const char* wqe_opcode_name(std::uint64_t opcode) noexcept {
    switch (opcode) {
        case 0x00: return "nop";
        case 0x01: return "send_invalidate";
        case 0x08: return "rdma_write";
        case 0x09: return "rdma_write_imm";
        case 0x0a: return "send";
        case 0x0b: return "send_imm";
        case 0x10: return "rdma_read";
        case 0x11: return "atomic_cas";
        case 0x12: return "atomic_fetch_add";
        default: return "?";
    }
}

const char* answer_name(std::uint64_t answer) noexcept {
    constexpr const char* kNames[] = {"ack", "rnr_nak", "nak"};
    return answer < 3 ? kNames[answer] : "?";
}

const char* work_request_name(std::uint64_t opcode) noexcept {
    constexpr const char* kNames[] = {"rdma_write", "rdma_write_imm", "send",      "send_imm",
                                      "send_inv",   "rdma_read",      "atomic_cas", "atomic_fetch_add"};
    return opcode < 8 ? kNames[opcode] : "?";
}

}  // namespace rdmachan::flight
