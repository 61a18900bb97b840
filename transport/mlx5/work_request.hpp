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
    // UMR WQEs (mlx5 opcode 0x25), written by the general path only (umr_segments.hpp).
    // `immediate` is the key to invalidate; the next request gets the initiator small fence.
    local_invalidate,
    // Sets an indirect memory key's layout and access (mlx5dv_wr_mr_list or
    // mlx5dv_wr_mr_interleaved): `layout` says how. Needs kSendInline, as libmlx5 does.
    configure_memory_key,
};

// Bit flags for SendWorkRequest::flags; values are our own, not IBV_SEND_*. The first three
// are their mlx5 ctrl fm_ce_se bits (CQ update 0x08, solicited 0x02, fence 0x80) in the top
// byte, where fm_ce_se sits in ctrl bytes 8-11 read as a little-endian word, so the encoder
// stores them as they are (send_queue.hpp asserts it).
inline constexpr std::uint32_t kSendSignaled = 0x08u << 24;
inline constexpr std::uint32_t kSendSolicited = 0x02u << 24;
inline constexpr std::uint32_t kSendFence = 0x80u << 24;
inline constexpr std::uint32_t kSendInline = 1u << 8;

// One entry of an interleaved layout, as struct mlx5dv_mr_interleaved: `bytes_count` bytes
// from `addr`, then `bytes_skip` bytes skipped, per repetition.
struct InterleavedEntry {
    std::uint64_t addr = 0;
    std::uint32_t bytes_count = 0;
    std::uint32_t bytes_skip = 0;
    std::uint32_t lkey = 0;
};

// Access bits of an indirect key, as the UMR mkey context stores them (rdma-core mlx5dv.h
// MLX5_WQE_MKEY_CONTEXT_ACCESS_FLAGS_*). Local read is always granted.
inline constexpr std::uint8_t kMemoryKeyLocalWrite = 0x08;
inline constexpr std::uint8_t kMemoryKeyRemoteRead = 0x10;
inline constexpr std::uint8_t kMemoryKeyRemoteWrite = 0x20;
inline constexpr std::uint8_t kMemoryKeyAtomic = 0x40;

// What a configure_memory_key request gives the key: either a list of SGEs seen as one
// zero-based region (`list`), or `interleaved` entries repeated `repeat_count` times.
struct MemoryKeyLayout {
    std::uint32_t mkey = 0;         // the indirect key (mlx5dv_mkey.lkey == rkey)
    std::uint32_t max_entries = 0;  // what the key was created for (mlx5dv_create_mkey)
    std::uint8_t access = 0;        // kMemoryKey* bits
    std::uint32_t repeat_count = 0;  // interleaved only
    std::uint32_t num_entries = 0;
    const ScatterGatherElement* list = nullptr;
    const InterleavedEntry* interleaved = nullptr;  // used when not nullptr
};

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
    // The opcode says which: a key configuration is RC only, so it never has an address
    // vector. Sharing the place keeps the request at 80 bytes: a larger one cost the public
    // API 11 to 14 instructions per post (channel_instruction_benchmark).
    union {
        // DC initiator only: the 48-byte extended address vector, dc_key and dqp_dct already
        // filled in (see make_dc_address_vector). nullptr on RC.
        const std::uint8_t* dc_address_vector = nullptr;
        // configure_memory_key only: the layout to give the key.
        const MemoryKeyLayout* layout;
    };
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
    too_many_entries,    // a memory key layout with more entries than the key or the WQE holds
};

}  // namespace rdmachan::mlx5
