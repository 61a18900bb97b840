// How the flight recorder prints each event: its name and its fields' names and formats.
#pragma once

#include <cstdint>

namespace rdmachan::flight {

enum class FieldFormat : std::uint8_t { none, decimal, hex, text, qp_state, status, opcode, answer, work_request };

struct FieldDescription {
    const char* name = "";
    FieldFormat format = FieldFormat::none;
};

struct EventDescription {
    const char* name = "unknown";
    FieldDescription fields[5];
};

// An unknown number (a record from a newer build) is described as "unknown" with hex fields.
const EventDescription& describe(std::uint16_t event) noexcept;

const char* queue_pair_state_name(std::uint64_t state) noexcept;    // the software device's QP states
const char* completion_status_name(std::uint64_t status) noexcept;  // mlx5::CompletionStatus
const char* wqe_opcode_name(std::uint64_t opcode) noexcept;         // the mlx5 WQE opcodes
const char* answer_name(std::uint64_t answer) noexcept;             // the responder's answer kinds
const char* work_request_name(std::uint64_t opcode) noexcept;       // mlx5::SendOpcode

}  // namespace rdmachan::flight
