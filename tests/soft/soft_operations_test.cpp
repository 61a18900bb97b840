// Every operation through the real mlx5 data path on the software device, between two QPs of
// one device (the loopback path) and between two devices in one process (the TCP path).
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>

#include "tests/soft/soft_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::EndpointOptions;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

struct Pair {
    std::shared_ptr<soft::Device> first_device;
    std::shared_ptr<soft::Device> second_device;
    std::unique_ptr<SoftEndpoint> a;
    std::unique_ptr<SoftEndpoint> b;

    explicit Pair(bool two_devices, const EndpointOptions& options = {}) {
        first_device = soft::Device::open();
        second_device = two_devices ? soft::Device::open() : first_device;
        a = std::make_unique<SoftEndpoint>(first_device, options);
        b = std::make_unique<SoftEndpoint>(second_device, options);
        a->connect(b->address());
        b->connect(a->address());
    }
};

void fill(std::uint8_t* bytes, std::size_t length, std::uint8_t seed) {
    for (std::size_t i = 0; i < length; ++i) bytes[i] = static_cast<std::uint8_t>(seed + i * 7);
}

void check_every_operation(Pair& pair) {
    SoftEndpoint& a = *pair.a;
    SoftEndpoint& b = *pair.b;
    const rdmachan::test::Address remote = b.address();

    SUBCASE("RDMA write lands in the target without the target calling in") {
        fill(a.buffer(), 4096, 1);
        const mlx5::ScatterGatherElement element = a.local(0, 4096);
        const mlx5::SendWorkRequest request = write_request(7, &element, remote.buffer_addr + 8192, remote.rkey);
        REQUIRE(a.post(&request, 1) == mlx5::PostResult::ok);
        const auto completion = a.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->wr_id == 7);
        CHECK(completion->opcode == mlx5::CompletionOpcode::rdma_write);
        CHECK(std::memcmp(b.buffer() + 8192, a.buffer(), 4096) == 0);
    }
    SUBCASE("RDMA write with immediate consumes a receive and delivers the immediate") {
        REQUIRE(b.post_receive(55, 0, 64) == mlx5::PostResult::ok);
        fill(a.buffer(), 100, 9);
        const mlx5::ScatterGatherElement element = a.local(0, 100);
        mlx5::SendWorkRequest request = write_request(8, &element, remote.buffer_addr + 1000, remote.rkey);
        request.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
        request.immediate = 0xfeedbeef;
        REQUIRE(a.post(&request, 1) == mlx5::PostResult::ok);
        const auto sent = a.wait_send();
        REQUIRE(sent.has_value());
        CHECK(sent->status == mlx5::CompletionStatus::success);
        const auto received = b.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->status == mlx5::CompletionStatus::success);
        CHECK(received->wr_id == 55);
        CHECK(received->opcode == mlx5::CompletionOpcode::receive_rdma_with_immediate);
        CHECK(received->immediate == 0xfeedbeef);
        CHECK(received->byte_len == 100);
        CHECK(received->src_qp == a.queue_pair().qpn());
        CHECK(std::memcmp(b.buffer() + 1000, a.buffer(), 100) == 0);
    }
    SUBCASE("send and send with immediate scatter into the posted receive") {
        REQUIRE(b.post_receive(1, 65536, 2000) == mlx5::PostResult::ok);
        REQUIRE(b.post_receive(2, 70000, 2000) == mlx5::PostResult::ok);
        fill(a.buffer(), 3000, 3);
        const mlx5::ScatterGatherElement first = a.local(0, 1500);
        const mlx5::ScatterGatherElement second = a.local(1500, 1500);
        mlx5::SendWorkRequest requests[2];
        requests[0].wr_id = 21;
        requests[0].opcode = mlx5::SendOpcode::send;
        requests[0].sg_list = &first;
        requests[0].num_sge = 1;
        requests[1] = requests[0];
        requests[1].wr_id = 22;
        requests[1].opcode = mlx5::SendOpcode::send_with_immediate;
        requests[1].immediate = 42;
        requests[1].sg_list = &second;
        requests[1].flags = mlx5::kSendSignaled;
        std::uint32_t posted = 0;
        REQUIRE(a.post(requests, 2, &posted) == mlx5::PostResult::ok);
        CHECK(posted == 2);
        // Only the second was signaled: its completion retires the first.
        const auto sent = a.wait_send();
        REQUIRE(sent.has_value());
        CHECK(sent->wr_id == 22);
        CHECK(a.send_queue().free_wqebbs() == a.queue_pair().send_ring().wqe_count);
        const auto one = b.wait_receive();
        const auto two = b.wait_receive();
        REQUIRE(one.has_value());
        REQUIRE(two.has_value());
        CHECK(one->wr_id == 1);
        CHECK(one->opcode == mlx5::CompletionOpcode::receive);
        CHECK(one->byte_len == 1500);
        CHECK((one->flags & mlx5::kCompletionWithImmediate) == 0);
        CHECK(two->wr_id == 2);
        CHECK(two->immediate == 42);
        CHECK((two->flags & mlx5::kCompletionWithImmediate) != 0);
        CHECK(std::memcmp(b.buffer() + 65536, a.buffer(), 1500) == 0);
        CHECK(std::memcmp(b.buffer() + 70000, a.buffer() + 1500, 1500) == 0);
    }
    SUBCASE("inline send carries the bytes in the WQE") {
        REQUIRE(b.post_receive(3, 0, 256) == mlx5::PostResult::ok);
        fill(a.buffer(), 60, 77);
        const mlx5::ScatterGatherElement element = a.local(0, 60);
        mlx5::SendWorkRequest request;
        request.wr_id = 31;
        request.opcode = mlx5::SendOpcode::send;
        request.flags = mlx5::kSendSignaled | mlx5::kSendInline;
        request.sg_list = &element;
        request.num_sge = 1;
        REQUIRE(a.post(&request, 1) == mlx5::PostResult::ok);
        fill(a.buffer(), 60, 0);  // the source may change once posted: the bytes are in the WQE
        REQUIRE(a.wait_send().has_value());
        const auto received = b.wait_receive();
        REQUIRE(received.has_value());
        std::vector<std::uint8_t> expected(60);
        fill(expected.data(), 60, 77);
        CHECK(std::memcmp(b.buffer(), expected.data(), 60) == 0);
    }
    SUBCASE("RDMA read brings remote bytes back") {
        fill(b.buffer() + 4096, 5000, 11);
        const mlx5::ScatterGatherElement element = a.local(100000, 5000);
        mlx5::SendWorkRequest request = write_request(41, &element, remote.buffer_addr + 4096, remote.rkey);
        request.opcode = mlx5::SendOpcode::rdma_read;
        REQUIRE(a.post(&request, 1) == mlx5::PostResult::ok);
        const auto completion = a.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->opcode == mlx5::CompletionOpcode::rdma_read);
        CHECK(completion->byte_len == 5000);
        CHECK(std::memcmp(a.buffer() + 100000, b.buffer() + 4096, 5000) == 0);
    }
    SUBCASE("atomics: fetch-and-add and compare-and-swap return the old value") {
        std::uint64_t initial = 1000;
        std::memcpy(b.buffer() + 512, &initial, 8);
        const mlx5::ScatterGatherElement result = a.local(0, 8);
        mlx5::SendWorkRequest add = write_request(51, &result, remote.buffer_addr + 512, remote.rkey);
        add.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
        add.compare_add = 5;
        REQUIRE(a.post(&add, 1) == mlx5::PostResult::ok);
        auto completion = a.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->opcode == mlx5::CompletionOpcode::atomic_fetch_and_add);
        std::uint64_t value = 0;
        std::memcpy(&value, a.buffer(), 8);
        CHECK(value == 1000);

        mlx5::SendWorkRequest swap = add;
        swap.wr_id = 52;
        swap.opcode = mlx5::SendOpcode::atomic_compare_and_swap;
        swap.compare_add = 1005;
        swap.swap = 77;
        REQUIRE(a.post(&swap, 1) == mlx5::PostResult::ok);
        completion = a.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        std::memcpy(&value, a.buffer(), 8);
        CHECK(value == 1005);
        std::memcpy(&value, b.buffer() + 512, 8);
        CHECK(value == 77);

        // A compare that does not match leaves the word alone.
        swap.compare_add = 1;
        swap.swap = 99;
        REQUIRE(a.post(&swap, 1) == mlx5::PostResult::ok);
        REQUIRE(a.wait_send().has_value());
        std::memcpy(&value, b.buffer() + 512, 8);
        CHECK(value == 77);
    }
}

}  // namespace

TEST_CASE("software device, two QPs of one device: every operation") {
    Pair pair(false);
    check_every_operation(pair);
}

TEST_CASE("software device, two devices over TCP: every operation") {
    Pair pair(true);
    check_every_operation(pair);
}

TEST_CASE("memory keys never take the reserved invalid lkey 0x100 (it ends a receive scatter list)") {
    // Key = index << 8 | random tag; index 1 with tag 0 would be MLX5_INVALID_LKEY, which the
    // receive path reads as "no more segments" — a receive of capacity 0. Index 1 is never used.
    std::shared_ptr<soft::Device> device = soft::Device::open();
    std::shared_ptr<soft::ProtectionDomain> domain = device->allocate_protection_domain();
    std::vector<std::uint8_t> memory(64);
    for (int i = 0; i < 300; ++i) {
        std::shared_ptr<soft::MemoryRegion> region = device->register_memory(domain, memory.data(), memory.size(), soft::kLocalWrite);
        CHECK((region->lkey() >> 8) != 1u);
        CHECK(region->lkey() != 0x100u);
    }
}
