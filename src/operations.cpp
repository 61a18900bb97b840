#include "src/operations.hpp"

#include <string>

namespace rdmachan::detail {
namespace {

mlx5::ScatterGatherElement element_of(const LocalSlice& local) { return {local.addr(), local.length(), local.lkey()}; }

void check_fits(const char* call, const LocalSlice& local, const RemoteMemoryRegion& remote) {
    if (local.length() > remote.length) {
        throw Error(std::string(call) + ": " + std::to_string(local.length()) + " bytes do not fit the remote region of " +
                    std::to_string(remote.length) + " bytes");
    }
}

void check_atomic(const char* call, const LocalSlice& result, const RemoteMemoryRegion& remote) {
    if (result.length() != 8) throw Error(std::string(call) + ": the result slice is " + std::to_string(result.length()) + " bytes, not 8");
    if (remote.length < 8) throw Error(std::string(call) + ": the remote region is shorter than 8 bytes");
    if (remote.addr % 8 != 0) throw Error(std::string(call) + ": remote address " + std::to_string(remote.addr) + " is not 8-byte aligned");
}

}  // namespace

std::uint64_t post_send_operation(Engine& engine, std::uint32_t peer, const LocalSlice& local,
                                  std::optional<std::uint32_t> immediate) {
    const mlx5::ScatterGatherElement element = element_of(local);
    mlx5::SendWorkRequest request;
    request.opcode = immediate.has_value() ? mlx5::SendOpcode::send_with_immediate : mlx5::SendOpcode::send;
    request.immediate = immediate.value_or(0);
    request.sg_list = &element;
    request.num_sge = 1;
    // A layout's bytes are not contiguous here: the NIC gathers them, they never go inline.
    if (local.length() <= engine.settings().max_inline_data && !local.zero_based()) request.flags |= mlx5::kSendInline;
    return engine.post_send(peer, &request, 1, send_operation(immediate));
}

std::uint64_t post_write_operation(Engine& engine, std::uint32_t peer, const char* call, const LocalSlice& local,
                                   const RemoteMemoryRegion& remote, std::optional<std::uint32_t> immediate) {
    check_fits(call, local, remote);
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
    return engine.post_send(peer, &request, 1, write_operation(immediate));
}

std::uint64_t post_read_operation(Engine& engine, std::uint32_t peer, const char* call, const LocalSlice& local,
                                  const RemoteMemoryRegion& remote) {
    if (local.length() > remote.length) {
        throw Error(std::string(call) + ": " + std::to_string(local.length()) + " bytes are more than the remote region's " +
                    std::to_string(remote.length));
    }
    const mlx5::ScatterGatherElement element = element_of(local);
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::rdma_read;
    request.sg_list = &element;
    request.num_sge = 1;
    request.remote_addr = remote.addr;
    request.rkey = remote.rkey;
    return engine.post_send(peer, &request, 1, Operation::rdma_read);
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
    return engine.post_send(peer, &request, 1, Operation::atomic_fetch_and_add);
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
    return engine.post_send(peer, &request, 1, Operation::atomic_compare_and_swap);
}

std::uint64_t post_batch_operation(Engine& engine, std::uint32_t peer, const char* call, const WorkBatch& batch) {
    if (batch.empty()) throw Error(std::string(call) + ": the batch is empty");
    if (batch.size() > engine.settings().max_send_wr) {
        throw Error(std::string(call) + ": " + std::to_string(batch.size()) + " operations are more than max_send_wr (" +
                    std::to_string(engine.settings().max_send_wr) + ")");
    }
    return engine.post_batch(peer, batch.entries().data(), static_cast<std::uint32_t>(batch.size()), Operation::batch);
}

}  // namespace rdmachan::detail
