// The project's ConnectX control path (transport/verbs: mlx5_binding.cpp, mlx5_dc.cpp, and the
// mlx5 providers over them) against the installed libibverbs and libmlx5, on the fake uverbs
// device (fake_uverbs.cpp): a Channel and RC and DC MultiChannels are built and connected, so
// every call the project makes to create and connect its objects — mlx5dv_create_cq,
// mlx5dv_create_qp for RC queue pairs, DC initiators and DC targets, ibv_create_srq, address
// handles, mlx5dv_init_obj, each ibv_modify_qp with the project's attributes and masks, GID and
// port queries — must be accepted by libmlx5 itself, with libmlx5's own checks. The emulated
// ConnectX (tests/emulated_connectx) replaces libibverbs and libmlx5 instead and restates
// their rules. Nothing is posted: no device executes WQEs here.
#include <doctest/doctest.h>

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <set>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"
#include "tests/libmlx5/fake_device.hpp"
#include "tests/libmlx5/fake_uverbs.hpp"

namespace {

using namespace rdmachan;
using rdmachan::libmlx5_instructions::fake_kernel;

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

}  // namespace

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
    const std::vector<MultiChannel> channels = connect_world(3, MultiChannelMode::reliable_connected);
    CHECK(channels.size() == 3);
    CHECK(fake_kernel().queue_pairs >= queue_pairs + 3 * 2);  // a queue pair per peer
}

TEST_CASE("a DC MultiChannel of three ranks is built and connected through the installed libmlx5") {
    const std::uint32_t targets = fake_kernel().dc_targets;
    const std::vector<MultiChannel> channels = connect_world(3, MultiChannelMode::dynamically_connected);
    CHECK(channels.size() == 3);
    // Each rank's DC target got its number from the kernel when libmlx5 moved it to RTR.
    CHECK(fake_kernel().dc_targets == targets + 3);
}
