// The single operations as work requests, shared by Channel and MultiChannel: argument checks
// (before anything is posted), the request itself, and the engine call.
#pragma once

#include <cstdint>
#include <optional>

#include "rdmachan/channel.hpp"
#include "src/engine.hpp"

namespace rdmachan::detail {

[[noreturn]] void throw_does_not_fit(const char* call, std::uint32_t local_length, std::uint64_t remote_length);
[[noreturn]] void throw_read_too_long(const char* call, std::uint32_t local_length, std::uint64_t remote_length);

inline mlx5::ScatterGatherElement element_of(const LocalSlice& local) { return {local.addr(), local.length(), local.lkey()}; }

// Each returns the engine's ticket; `call` names the API function in error messages. The send,
// write and read are inline, so that the API call is one function down to the queue pair
// (Engine::post_one); the argument check throws from out of line.
inline std::uint64_t post_send_operation(Engine& engine, std::uint32_t peer, const LocalSlice& local,
                                         std::optional<std::uint32_t> immediate) {
    const mlx5::ScatterGatherElement element = element_of(local);
    mlx5::SendWorkRequest request;
    request.opcode = immediate.has_value() ? mlx5::SendOpcode::send_with_immediate : mlx5::SendOpcode::send;
    request.immediate = immediate.value_or(0);
    request.sg_list = &element;
    request.num_sge = 1;
    // A layout's bytes are not contiguous here: the NIC gathers them, they never go inline.
    if (local.length() <= engine.settings().max_inline_data && !local.zero_based()) request.flags |= mlx5::kSendInline;
    return engine.post_one(peer, request, immediate.has_value() ? Operation::send_with_immediate : Operation::send);
}

inline std::uint64_t post_write_operation(Engine& engine, std::uint32_t peer, const char* call, const LocalSlice& local,
                                          const RemoteMemoryRegion& remote, std::optional<std::uint32_t> immediate) {
    if (local.length() > remote.length) [[unlikely]] throw_does_not_fit(call, local.length(), remote.length);
    const mlx5::ScatterGatherElement element = element_of(local);
    mlx5::SendWorkRequest request;
    request.opcode = immediate.has_value() ? mlx5::SendOpcode::rdma_write_with_immediate : mlx5::SendOpcode::rdma_write;
    request.immediate = immediate.value_or(0);
    request.sg_list = &element;
    request.num_sge = 1;
    request.remote_addr = remote.addr;
    request.rkey = remote.rkey;
    // A layout's bytes are not contiguous here: the NIC gathers them, they never go inline.
    if (local.length() <= engine.settings().max_inline_data && !local.zero_based()) request.flags |= mlx5::kSendInline;
    return engine.post_one(peer, request,
                           immediate.has_value() ? Operation::rdma_write_with_immediate : Operation::rdma_write);
}

inline std::uint64_t post_read_operation(Engine& engine, std::uint32_t peer, const char* call, const LocalSlice& local,
                                         const RemoteMemoryRegion& remote) {
    if (local.length() > remote.length) [[unlikely]] throw_read_too_long(call, local.length(), remote.length);
    const mlx5::ScatterGatherElement element = element_of(local);
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::rdma_read;
    request.sg_list = &element;
    request.num_sge = 1;
    request.remote_addr = remote.addr;
    request.rkey = remote.rkey;
    return engine.post_one(peer, request, Operation::rdma_read);
}

std::uint64_t post_fetch_and_add_operation(Engine& engine, std::uint32_t peer, const char* call,
                                           const LocalSlice& result, const RemoteMemoryRegion& remote,
                                           std::uint64_t add);
std::uint64_t post_compare_and_swap_operation(Engine& engine, std::uint32_t peer, const char* call,
                                              const LocalSlice& result, const RemoteMemoryRegion& remote,
                                              std::uint64_t compare, std::uint64_t swap);
std::uint64_t post_batch_operation(Engine& engine, std::uint32_t peer, const char* call, const WorkBatch& batch);

inline Operation send_operation(std::optional<std::uint32_t> immediate) {
    return immediate.has_value() ? Operation::send_with_immediate : Operation::send;
}
inline Operation write_operation(std::optional<std::uint32_t> immediate) {
    return immediate.has_value() ? Operation::rdma_write_with_immediate : Operation::rdma_write;
}

}  // namespace rdmachan::detail
