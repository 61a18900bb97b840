// The channel core's flight-recorder events as the dump prints them, in ChannelEvent's order; a
// field left out is not printed.
#include "src/flight_events.hpp"

#include <iterator>

#include "common/flight_events.hpp"

namespace rdmachan::flight {
namespace {

using F = FieldFormat;

// mlx5::CompletionStatus, in its order (ibv_wc_status's numbers).
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
    return status < std::size(kNames) ? kNames[status] : "?";
}

// mlx5::SendOpcode, in its order.
const char* work_request_name(std::uint64_t opcode) noexcept {
    constexpr const char* kNames[] = {"rdma_write", "rdma_write_imm",  "send",
                                      "send_imm",   "send_inv",        "rdma_read",
                                      "atomic_cas", "atomic_fetch_add"};
    return opcode < std::size(kNames) ? kNames[opcode] : "?";
}

constexpr FieldDescription kStatus{"status", F::named, completion_status_name};

constexpr EventDescription kChannelEvents[] = {
    {"post_send",
     {{"peer", F::decimal},
      {"qpn", F::hex},
      {"ticket", F::hex},
      {"requests", F::decimal},
      {"first", F::named, work_request_name}}},
    {"post_receive",
     {{"peer", F::decimal}, {"qpn", F::hex}, {"ticket", F::hex}, {"length", F::decimal}}},
    {"post_refused", {{"peer", F::decimal}, {"ticket", F::hex}, kStatus, {"why", F::text}}},
    {"completion",
     {{"qpn", F::hex}, {"ticket", F::hex}, kStatus, {"syndrome", F::hex}, {"bytes", F::decimal}}},
    {"deadline",
     {{"peer", F::decimal},
      {"ticket", F::hex},
      {"operation", F::decimal},
      {"deadline_ms", F::decimal}}},
    {"qp_error", {{"peer", F::decimal}, {"qpn", F::hex}, {"why", F::text}}},
};
static_assert(std::size(kChannelEvents) == static_cast<std::size_t>(ChannelEvent::end) -
                                               static_cast<std::size_t>(ChannelEvent::post_send),
              "every channel-core event has a description");

const EventRegistration channel_events_registration{
    make_event_table("channel", ChannelEvent::post_send, kChannelEvents)};

}  // namespace
}  // namespace rdmachan::flight
