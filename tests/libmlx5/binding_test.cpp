// The project's ConnectX control path (transport/verbs: mlx5_binding.cpp, mlx5_dc.cpp, and the
// mlx5 providers over them) against the installed libibverbs and libmlx5, on the fake uverbs
// device (fake_uverbs.cpp): a Channel and RC and DC MultiChannels are built and connected, so
// every call the project makes to create and connect its objects — mlx5dv_create_cq,
// mlx5dv_create_qp for RC queue pairs, DC initiators and DC targets, ibv_create_srq, address
// handles, mlx5dv_init_obj, each ibv_modify_qp with the project's attributes and masks, GID and
// port queries — must be accepted by libmlx5 itself, with libmlx5's own checks. The emulated
// ConnectX (tests/emulated_connectx) replaces libibverbs and libmlx5 instead and restates
// their rules. Nothing is posted: no device executes WQEs here.
//
// Completion events on this path: each CQ's completion channel (ibv_create_comp_channel,
// answered by the fake with a pipe), the arm the data path writes (arm word of the CQ's doorbell
// record, CQ doorbell register in libmlx5's UAR page), the fake kernel's events through
// Channel::native_handle, taken by the engine (ibv_get_cq_event), and the CQs' destruction,
// which libibverbs lets return only once every event read was acknowledged.
#include <doctest/doctest.h>
#include <endian.h>
#include <infiniband/mlx5dv.h>
#include <poll.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <optional>
#include <set>
#include <thread>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"
#include "tests/libmlx5/fake_device.hpp"
#include "tests/libmlx5/fake_uverbs.hpp"
#include "tests/watchdog.hpp"

namespace {

using namespace rdmachan;
using rdmachan::libmlx5_instructions::fake_kernel;
using rdmachan::libmlx5_instructions::report_completion_event;

// The GID the fake sysfs gives port 1 (fake_device.cpp).
constexpr std::array<std::uint8_t, 16> kPortGid = {0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0x00, 0x02, 0xc9, 0x03, 0x00, 0xa1, 0xb2, 0xc3};

// The fake sysfs tree, read whenever libibverbs opens the device or queries a GID, so kept for
// the whole run and removed when the program ends.
struct FakeSysfs {
    std::filesystem::path root = rdmachan::libmlx5_instructions::make_fake_sysfs();
    ~FakeSysfs() { std::filesystem::remove_all(root); }
};

ChannelBuilder on_fake_mlx5() {
    static const FakeSysfs sysfs;
    return ChannelBuilder().device("mlx5_0").deadline(std::chrono::seconds(5));
}

std::vector<MultiChannel> connect_world(std::uint32_t world, MultiChannelMode mode) {
    std::vector<PreparedMultiChannel> prepared;
    for (std::uint32_t rank = 0; rank < world; ++rank)
        prepared.push_back(MultiChannelBuilder(on_fake_mlx5()).rank(rank).world_size(world).mode(mode).build());
    std::vector<Endpoint> table;
    for (const PreparedMultiChannel& rank : prepared) table.push_back(rank.endpoint());
    for (const Endpoint& endpoint : table) {
        CHECK(endpoint.device == DeviceKind::mlx5);
        CHECK(endpoint.port.lid == 1);
        CHECK(endpoint.port.gid == kPortGid);
    }
    std::vector<MultiChannel> channels;
    for (PreparedMultiChannel& rank : prepared) channels.push_back(std::move(rank).handshake(table));
    return channels;
}

// The arm word libmlx5's mlx5_arm_cq writes for "the next completion" (rdma-core
// providers/mlx5/cq.c and mlx5.h: sequence number in bits 29:28, command MLX5_CQ_DB_REQ_NOT = 0
// in bits 26:24, the consumer index's low 24 bits), stated here rather than taken from the code
// under test.
std::uint32_t expected_arm_word(std::uint32_t sequence, std::uint32_t consumer_index) {
    return (sequence & 3) << 28 | 0u << 24 | (consumer_index & 0xffffff);
}

// A CQ libmlx5 created for the fake kernel, as mlx5dv_init_obj describes it: its kernel handle
// and libibverbs' ibv_cq are what the fake recorded (the user handle events name).
struct FakeCompletionQueue {
    std::uint32_t handle = 0;
    mlx5dv_cq dv{};

    std::uint32_t arm_word() const { return be32toh(dv.dbrec[1]); }
    // The CQ doorbell register, at 0x20 in the UAR page (mlx5dv_cq.cq_uar), big-endian.
    std::uint64_t doorbell_register() const {
        std::uint64_t value = 0;
        std::memcpy(&value, static_cast<const std::uint8_t*>(dv.cq_uar) + 0x20, sizeof value);
        return be64toh(value);
    }
    void spoil() {
        dv.dbrec[1] = 0xa5a5a5a5;
        std::memset(static_cast<std::uint8_t*>(dv.cq_uar) + 0x20, 0xa5, 8);
    }
};

// The CQs the fake kernel created after it had created `before`.
std::vector<FakeCompletionQueue> completion_queues_since(std::uint32_t before) {
    std::vector<FakeCompletionQueue> queues;
    for (std::uint32_t handle = before + 1; handle <= fake_kernel().completion_queues; ++handle) {
        FakeCompletionQueue queue;
        queue.handle = handle;
        mlx5dv_obj object{};
        object.cq.in = reinterpret_cast<ibv_cq*>(fake_kernel().completion_events.at(handle).user_handle);
        object.cq.out = &queue.dv;
        REQUIRE(mlx5dv_init_obj(&object, MLX5DV_OBJ_CQ) == 0);
        REQUIRE(queue.dv.cq_uar != nullptr);
        queues.push_back(queue);
    }
    return queues;
}

bool readable(int descriptor, int timeout_ms) {
    pollfd entry{descriptor, POLLIN, 0};
    return ::poll(&entry, 1, timeout_ms) == 1 && (entry.revents & POLLIN) != 0;
}

}  // namespace

TEST_CASE("a Channel's completion events on the installed libmlx5: arm, the kernel's event, the engine's take, destruction") {
    // More rounds than the events acknowledged in one batch, so that a batch is acknowledged and
    // some events are left for the destruction to acknowledge.
    constexpr std::uint32_t kRounds = 37;
    const rdmachan::test::Watchdog watchdog(std::chrono::seconds(30), "the completion-event case (arm, take or destruction)");
    const std::uint32_t before = fake_kernel().completion_queues;
    PreparedChannel first = on_fake_mlx5().wait_mode(WaitMode::event).build();
    std::vector<FakeCompletionQueue> queues = completion_queues_since(before);
    PreparedChannel second = on_fake_mlx5().wait_mode(WaitMode::event).build();
    REQUIRE_FALSE(queues.empty());
    const ChannelEndpoint first_endpoint = first.endpoint();
    std::optional<Channel> a(std::move(first).handshake(second.endpoint()));
    Channel b = std::move(second).handshake(first_endpoint);
    std::set<std::uint32_t> numbers;
    for (const FakeCompletionQueue& queue : queues) {
        CAPTURE(queue.handle);
        CHECK(fake_kernel().completion_events.at(queue.handle).channel >= 0);  // created with a channel
        numbers.insert(queue.dv.cqn);
    }

    const int descriptor = a->native_handle();
    REQUIRE(descriptor >= 0);
    CHECK_FALSE(readable(descriptor, 0));
    for (std::uint32_t round = 0; round < kRounds; ++round) {
        CAPTURE(round);
        for (FakeCompletionQueue& queue : queues) queue.spoil();
        // Takes the events raised since the last arm (none in round 0), then arms every CQ.
        REQUIRE(a->arm());
        // Each CQ's sequence number counts the events the engine took from its channel.
        for (const FakeCompletionQueue& queue : queues) {
            CAPTURE(queue.handle);
            CHECK(queue.arm_word() == expected_arm_word(round, 0));
        }
        // The CQs share libmlx5's UAR page: the register holds the last arm's doorbell, for one
        // of this channel's CQs: the arm word above the CQ number.
        const std::uint64_t doorbell = queues.front().doorbell_register();
        CHECK(numbers.count(static_cast<std::uint32_t>(doorbell & 0xffffff)) == 1);
        CHECK(static_cast<std::uint32_t>(doorbell >> 32) == expected_arm_word(round, 0));
        CHECK_FALSE(readable(descriptor, 0));
        // The kernel's event for every CQ armed: the descriptor wakes.
        for (const FakeCompletionQueue& queue : queues) REQUIRE(report_completion_event(queue.handle));
        CHECK(readable(descriptor, 1000));
    }
    // The last round's events are still queued, unread; kRounds - 1 were read per CQ, and all
    // but the last batch's acknowledged. The destruction acknowledges the rest and returns.
    a.reset();
    CHECK(b.healthy());
}

TEST_CASE("a Channel is built and connected through the installed libmlx5") {
    const std::uint32_t queue_pairs = fake_kernel().queue_pairs;
    PreparedChannel first = on_fake_mlx5().build();
    PreparedChannel second = on_fake_mlx5().build();
    const ChannelEndpoint first_endpoint = first.endpoint();
    const ChannelEndpoint second_endpoint = second.endpoint();
    CHECK(fake_kernel().queue_pairs == queue_pairs + 2);  // libmlx5 asked the kernel for both
    CHECK(first_endpoint.qpn != second_endpoint.qpn);
    CHECK(first_endpoint.lid == 1);
    CHECK(first_endpoint.gid == kPortGid);
    CHECK(first_endpoint.mtu == 4096);
    Channel a = std::move(first).handshake(second_endpoint);
    Channel b = std::move(second).handshake(first_endpoint);
    CHECK(a.healthy());
    CHECK(b.healthy());
    // Memory registered through libmlx5 carries the keys the kernel gave.
    std::vector<std::uint8_t> memory(4096);
    const MemoryRegion region = a.register_memory(memory.data(), memory.size());
    CHECK(region.lkey() >= 0x1000);
}

TEST_CASE("an RC MultiChannel of three ranks is built and connected through the installed libmlx5") {
    const std::uint32_t queue_pairs = fake_kernel().queue_pairs;
    std::vector<MultiChannel> channels = connect_world(3, MultiChannelMode::reliable_connected);
    CHECK(channels.size() == 3);
    for (MultiChannel& channel : channels) {
        CHECK(channel.native_handle() >= 0);  // every CQ has a completion channel
        CHECK(channel.arm());
    }
    CHECK(fake_kernel().queue_pairs >= queue_pairs + 3 * 2);  // a queue pair per peer
}

TEST_CASE("a DC MultiChannel of three ranks is built and connected through the installed libmlx5") {
    const std::uint32_t targets = fake_kernel().dc_targets;
    std::vector<MultiChannel> channels = connect_world(3, MultiChannelMode::dynamically_connected);
    CHECK(channels.size() == 3);
    for (MultiChannel& channel : channels) {
        CHECK(channel.native_handle() >= 0);
        CHECK(channel.arm());
    }
    // Each rank's DC target got its number from the kernel when libmlx5 moved it to RTR.
    CHECK(fake_kernel().dc_targets == targets + 3);
}
