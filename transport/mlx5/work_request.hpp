// Work requests as the mlx5 data path takes them: plain values, no verbs structures, so the
// same types serve the hardware binding, the software device and device (GPU) code.
#pragma once

#include <cstdint>

namespace rdmachan::mlx5 {

struct ScatterGatherElement {
    std::uint64_t addr = 0;
    std::uint32_t length = 0;
    std::uint32_t lkey = 0;
};

enum class SendOpcode : std::uint8_t {
    rdma_write,
    rdma_write_with_immediate,
    send,
    send_with_immediate,
    send_with_invalidate,
    rdma_read,
    atomic_compare_and_swap,
    atomic_fetch_and_add,
};

// Bit flags for SendWorkRequest::flags; values are our own, not IBV_SEND_*. The first three
// are their mlx5 ctrl fm_ce_se bits (CQ update 0x08, solicited 0x02, fence 0x80) in the top
// byte, where fm_ce_se sits in ctrl bytes 8-11 read as a little-endian word, so the encoder
// stores them as they are (send_queue.hpp asserts it).
inline constexpr std::uint32_t kSendSignaled = 0x08u << 24;
inline constexpr std::uint32_t kSendSolicited = 0x02u << 24;
inline constexpr std::uint32_t kSendFence = 0x80u << 24;
inline constexpr std::uint32_t kSendInline = 1u << 8;

struct SendWorkRequest {
    std::uint64_t wr_id = 0;
    SendOpcode opcode = SendOpcode::send;
    std::uint32_t flags = 0;
    const ScatterGatherElement* sg_list = nullptr;
    std::uint32_t num_sge = 0;
    std::uint64_t remote_addr = 0;  // write, read, atomics
    std::uint32_t rkey = 0;         // write, read, atomics
    // Host byte order; the encoder stores it big-endian. For send_with_invalidate it is the
    // rkey to invalidate.
    std::uint32_t immediate = 0;
    std::uint64_t compare_add = 0;  // compare (CAS) or add (FAA)
    std::uint64_t swap = 0;         // CAS only
    // DC initiator only: the 48-byte extended address vector, dc_key and dqp_dct already
    // filled in (see make_dc_address_vector). nullptr on RC.
    const std::uint8_t* dc_address_vector = nullptr;
    // DC initiator only: the DCI stream channel (ctrl bytes 9-10) when the DCI has streams.
    std::uint16_t dci_stream_id = 0;
};

struct ReceiveWorkRequest {
    std::uint64_t wr_id = 0;
    const ScatterGatherElement* sg_list = nullptr;
    std::uint32_t num_sge = 0;
};

// Why a post was refused. Data-path errors are values, never exceptions.
enum class PostResult : std::uint8_t {
    ok,
    queue_full,          // no room for the WQE(s): the caller must poll completions first
    too_many_sge,        // num_sge above the queue's max
    inline_too_large,    // inline payload above max_inline_data
    invalid_request,     // e.g. an opcode this queue cannot carry
};

}  // namespace rdmachan::mlx5
