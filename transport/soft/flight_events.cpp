// The software device's flight-recorder events as the dump prints them, in SoftEvent's order; a
// field left out is not printed.
#include "transport/soft/flight_events.hpp"

#include <iterator>

#include "common/flight_events.hpp"

namespace rdmachan::flight {
namespace {

using F = FieldFormat;

// QueuePairState (device.hpp), in its order.
const char* queue_pair_state_name(std::uint64_t state) noexcept {
    constexpr const char* kNames[] = {"RESET", "INIT", "RTR", "RTS", "ERR"};
    return state < 5 ? kNames[state] : "?";
}

// The mlx5 WQE opcodes the device executes.
const char* wqe_opcode_name(std::uint64_t opcode) noexcept {
    switch (opcode) {
        case 0x00:
            return "nop";
        case 0x01:
            return "send_invalidate";
        case 0x08:
            return "rdma_write";
        case 0x09:
            return "rdma_write_imm";
        case 0x0a:
            return "send";
        case 0x0b:
            return "send_imm";
        case 0x10:
            return "rdma_read";
        case 0x11:
            return "atomic_cas";
        case 0x12:
            return "atomic_fetch_add";
        default:
            return "?";
    }
}

// The responder's answer kinds.
const char* answer_name(std::uint64_t answer) noexcept {
    constexpr const char* kNames[] = {"ack", "rnr_nak", "nak"};
    return answer < 3 ? kNames[answer] : "?";
}

constexpr FieldDescription qp_state_field(const char* name) {
    return {name, F::named, queue_pair_state_name};
}

constexpr EventDescription kSoftEvents[] = {
    {"doorbell", {{"qpn", F::hex}}},
    {"wqe_executed",
     {{"qpn", F::hex},
      {"wqe", F::decimal},
      {"opcode", F::named, wqe_opcode_name},
      {"psn", F::hex},
      {"length", F::decimal}}},
    {"request_dropped",
     {{"qpn", F::hex},
      {"psn", F::hex},
      {"expected_psn", F::hex},
      qp_state_field("state"),
      {"why", F::text}}},
    {"request_performed",
     {{"qpn", F::hex},
      {"psn", F::hex},
      {"opcode", F::named, wqe_opcode_name},
      {"rkey", F::hex},
      {"nak_syndrome", F::hex}}},
    {"rnr_nak_sent",
     {{"qpn", F::hex}, {"psn", F::hex}, {"from_qpn", F::hex}, {"rnr_timer", F::decimal}}},
    {"response",
     {{"qpn", F::hex},
      {"psn", F::hex},
      {"kind", F::named, answer_name},
      {"syndrome", F::hex},
      {"in_flight", F::decimal}}},
    {"response_ignored",
     {{"qpn", F::hex},
      {"psn", F::hex},
      qp_state_field("state"),
      {"in_flight", F::decimal},
      {"oldest_psn", F::hex}}},
    {"retransmit",
     {{"qpn", F::hex},
      {"from_psn", F::hex},
      {"requests", F::decimal},
      {"why", F::text},
      {"retries_left", F::decimal}}},
    {"completion",
     {{"qpn", F::hex},
      {"wqe", F::decimal},
      {"opcode", F::hex},
      {"syndrome", F::hex},
      {"receive", F::decimal}}},
    {"qp_state", {{"qpn", F::hex}, qp_state_field("from"), qp_state_field("to")}},
    {"qp_error", {{"qpn", F::hex}, {"why", F::text}}},
    {"connection_closed", {{"lid", F::decimal}, {"outgoing", F::decimal}, {"why", F::text}}},
    {"connections_holder", {{"attached", F::decimal}, {"why", F::text}}},
};
static_assert(std::size(kSoftEvents) == static_cast<std::size_t>(SoftEvent::end) -
                                            static_cast<std::size_t>(SoftEvent::doorbell),
              "every software-device event has a description");

const EventRegistration soft_events_registration{
    make_event_table("soft", SoftEvent::doorbell, kSoftEvents)};

}  // namespace
}  // namespace rdmachan::flight
