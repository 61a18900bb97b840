#include "src/operations.hpp"

#include <string>

namespace rdmachan::detail {
namespace {

void check_atomic(const char* call, const LocalSlice& result, const RemoteMemoryRegion& remote) {
    if (result.length() != 8) throw Error(std::string(call) + ": the result slice is " + std::to_string(result.length()) + " bytes, not 8");
    if (remote.length < 8) throw Error(std::string(call) + ": the remote region is shorter than 8 bytes");
    if (remote.addr % 8 != 0) throw Error(std::string(call) + ": remote address " + std::to_string(remote.addr) + " is not 8-byte aligned");
}

}  // namespace

void throw_does_not_fit(const char* call, std::uint32_t local_length, std::uint64_t remote_length) {
    throw Error(std::string(call) + ": " + std::to_string(local_length) + " bytes do not fit the remote region of " +
                std::to_string(remote_length) + " bytes");
}

void throw_read_too_long(const char* call, std::uint32_t local_length, std::uint64_t remote_length) {
    throw Error(std::string(call) + ": " + std::to_string(local_length) + " bytes are more than the remote region's " +
                std::to_string(remote_length));
}

std::uint64_t post_fetch_and_add_operation(Engine& engine, std::uint32_t peer, const char* call,
                                           const LocalSlice& result, const RemoteMemoryRegion& remote,
                                           std::uint64_t add) {
    check_atomic(call, result, remote);
    const mlx5::ScatterGatherElement element = element_of(result);
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
    request.sg_list = &element;
    request.num_sge = 1;
    request.remote_addr = remote.addr;
    request.rkey = remote.rkey;
    request.compare_add = add;
    return engine.post_one(peer, request, Operation::atomic_fetch_and_add);
}

std::uint64_t post_compare_and_swap_operation(Engine& engine, std::uint32_t peer, const char* call,
                                              const LocalSlice& result, const RemoteMemoryRegion& remote,
                                              std::uint64_t compare, std::uint64_t swap) {
    check_atomic(call, result, remote);
    const mlx5::ScatterGatherElement element = element_of(result);
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::atomic_compare_and_swap;
    request.sg_list = &element;
    request.num_sge = 1;
    request.remote_addr = remote.addr;
    request.rkey = remote.rkey;
    request.compare_add = compare;
    request.swap = swap;
    return engine.post_one(peer, request, Operation::atomic_compare_and_swap);
}

std::uint64_t post_batch_operation(Engine& engine, std::uint32_t peer, const char* call, const WorkBatch& batch) {
    if (batch.empty()) throw Error(std::string(call) + ": the batch is empty");
    if (batch.size() > engine.settings().max_send_wr) {
        throw Error(std::string(call) + ": " + std::to_string(batch.size()) + " operations are more than max_send_wr (" +
                    std::to_string(engine.settings().max_send_wr) + ")");
    }
    return engine.post_batch(peer, batch.entries().data(), static_cast<std::uint32_t>(batch.size()), Operation::batch,
                             batch.version());
}

}  // namespace rdmachan::detail
