// The single operations as work requests, shared by Channel and MultiChannel: argument checks
// (before anything is posted), the request itself, and the engine call.
#pragma once

#include <cstdint>
#include <optional>

#include "rdmachan/channel.hpp"
#include "src/engine.hpp"

namespace rdmachan::detail {

// Each returns the engine's ticket; `call` names the API function in error messages.
std::uint64_t post_send_operation(Engine& engine, std::uint32_t peer, const LocalSlice& local,
                                  std::optional<std::uint32_t> immediate);
std::uint64_t post_write_operation(Engine& engine, std::uint32_t peer, const char* call, const LocalSlice& local,
                                   const RemoteMemoryRegion& remote, std::optional<std::uint32_t> immediate);
std::uint64_t post_read_operation(Engine& engine, std::uint32_t peer, const char* call, const LocalSlice& local,
                                  const RemoteMemoryRegion& remote);
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
