// Shared set-up for the tests that run inside the soft-RoCE VM: one side = an open device,
// a protection domain, a CQ, an RC QP and a registered buffer; two sides connect with the
// real GIDs of their ports. Every wait has a deadline.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>

#include "transport/mlx5/completion.hpp"
#include "transport/verbs/completion_channel.hpp"
#include "transport/verbs/connection.hpp"
#include "transport/verbs/context.hpp"
#include "transport/verbs/gid_selection.hpp"
#include "transport/verbs/protection_domain.hpp"
#include "transport/verbs/queue_pair.hpp"

namespace rxe_test {

using namespace rdmachan::verbs;
namespace mlx5 = rdmachan::mlx5;

constexpr std::uint8_t kPort = 1;
constexpr std::size_t kBufferSize = 4096;
constexpr std::chrono::seconds kCompletionDeadline{10};

// The VM harness exports the device names; outside it the tests fail with this message.
inline std::string device_from_environment(const char* variable) {
    const char* value = std::getenv(variable);
    if (value == nullptr || *value == '\0') {
        FAIL("environment variable " << variable
                                     << " is not set: run this test through tests/vm/rxe-vm.sh");
    }
    return value;
}
inline std::string first_device() {
    return device_from_environment("RDMACHAN_RXE_DEVICE");
}
inline std::string second_device() {
    return device_from_environment("RDMACHAN_RXE_PEER_DEVICE");
}

struct FreeDeleter {
    void operator()(void* memory) const noexcept { std::free(memory); }
};

struct Side {
    std::shared_ptr<Context> context;
    PortAttributes port;
    GidChoice gid;
    std::shared_ptr<ProtectionDomain> protection_domain;
    std::shared_ptr<CompletionQueue> completion_queue;
    std::shared_ptr<SharedReceiveQueue> shared_receive_queue;
    std::shared_ptr<QueuePair> queue_pair;
    std::unique_ptr<std::uint8_t[], FreeDeleter> buffer;
    std::shared_ptr<MemoryRegion> memory_region;
    std::uint32_t psn = 0;

    std::uint8_t* data() const { return buffer.get(); }
    std::uint64_t address(std::size_t offset = 0) const {
        return reinterpret_cast<std::uintptr_t>(data() + offset);
    }

    RcEndpoint endpoint() const {
        RcEndpoint endpoint;
        endpoint.qpn = queue_pair->qpn();
        endpoint.psn = psn;
        endpoint.lid = port.lid;
        endpoint.gid = gid.entry.gid;
        endpoint.mtu = port.active_mtu;
        return endpoint;
    }
};

struct SideOptions {
    QueuePairCapabilities capabilities{16, 16, 2, 2, 64};
    bool with_shared_receive_queue = false;
    bool with_completion_channel = false;  // the CQ raises completion events on a channel
    std::uint32_t psn = 0x10;
    std::optional<std::uint32_t> gid_index;
};

inline Side make_side(const std::string& device, const SideOptions& options = {}) {
    Side side;
    side.context = Context::open(device);
    side.port = side.context->query_port(kPort);
    side.gid = select_gid(side.port.gid_table, side.port.link_layer, options.gid_index);
    side.protection_domain = ProtectionDomain::allocate(side.context);
    side.completion_queue = CompletionQueue::create(
        side.context, 64,
        options.with_completion_channel ? CompletionChannel::try_create(side.context) : nullptr);
    if (options.with_shared_receive_queue) {
        side.shared_receive_queue = SharedReceiveQueue::create(side.protection_domain, 16, 2);
    }
    side.queue_pair = QueuePair::create_reliable_connected(
        {side.protection_domain, side.completion_queue, side.completion_queue,
         side.shared_receive_queue, nullptr},
        options.capabilities);
    side.buffer.reset(static_cast<std::uint8_t*>(std::aligned_alloc(4096, kBufferSize)));
    std::fill_n(side.buffer.get(), kBufferSize, std::uint8_t{0});
    side.memory_region =
        MemoryRegion::register_memory(side.protection_domain, side.buffer.get(), kBufferSize,
                                      IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
                                          IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
    side.psn = options.psn;
    return side;
}

inline ConnectionParameters parameters_for(const Side& local, const RcEndpoint& remote) {
    ConnectionParameters parameters;
    parameters.port_num = local.port.port_num;
    parameters.path_mtu = std::min(local.port.active_mtu, remote.mtu);
    parameters.send_psn = local.psn;
    parameters.use_global_routing = local.port.link_layer == LinkLayer::ethernet;
    parameters.source_gid_index = static_cast<std::uint8_t>(local.gid.entry.index);
    // Short retries: an error test should fail within the deadline, not after minutes.
    parameters.timeout = 12;
    parameters.retry_count = 3;
    parameters.rnr_retry = 3;
    parameters.max_read_atomic = 4;
    parameters.max_dest_read_atomic = 4;
    return parameters;
}

inline void connect(Side& a, Side& b) {
    const RcEndpoint a_endpoint = a.endpoint();
    const RcEndpoint b_endpoint = b.endpoint();
    a.queue_pair->connect(parameters_for(a, b_endpoint), b_endpoint);
    b.queue_pair->connect(parameters_for(b, a_endpoint), a_endpoint);
}

// a on the first device; b on the second (cross = true, over the veth pair) or also on the
// first (rxe loopback). Connected with distinct PSNs so a PSN mix-up cannot go unnoticed. a's CQ
// has a completion channel when b's has.
inline void make_pair(bool cross, Side& a, Side& b, const SideOptions& b_options = {}) {
    SideOptions a_options;
    a_options.psn = 0x1234;
    a_options.with_completion_channel = b_options.with_completion_channel;
    a = make_side(first_device(), a_options);
    SideOptions options_for_b = b_options;
    options_for_b.psn = 0xabcde;
    b = make_side(cross ? second_device() : first_device(), options_for_b);
    connect(a, b);
}

// Polls until one completion arrives or the deadline passes (then the test fails).
inline mlx5::Completion wait_for_completion(
    CompletionQueue& queue, std::chrono::steady_clock::duration deadline = kCompletionDeadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    mlx5::Completion completion;
    while (std::chrono::steady_clock::now() < until) {
        if (queue.poll({&completion, 1}) == 1) return completion;
    }
    FAIL("no completion within the deadline");
    return completion;
}

inline void post_one_receive(Side& side, std::size_t offset, std::uint32_t length,
                             std::uint64_t wr_id) {
    const mlx5::ScatterGatherElement element{side.address(offset), length,
                                             side.memory_region->lkey()};
    const mlx5::ReceiveWorkRequest request{wr_id, &element, 1};
    std::uint32_t posted = 0;
    const mlx5::PostResult result =
        side.shared_receive_queue ? side.shared_receive_queue->post_receive({&request, 1}, &posted)
                                  : side.queue_pair->post_receive({&request, 1}, &posted);
    REQUIRE(result == mlx5::PostResult::ok);
    REQUIRE(posted == 1);
}

inline void post_one_send(Side& side, const mlx5::SendWorkRequest& request) {
    std::uint32_t posted = 0;
    REQUIRE(side.queue_pair->post_send({&request, 1}, &posted) == mlx5::PostResult::ok);
    REQUIRE(posted == 1);
}

}  // namespace rxe_test
