// Indirect memory keys on the software device: a UMR WQE gives a key a list or an interleaved
// layout; RDMA write, read, send and receive scatter and gather through it, zero-based, on
// either side; LOCAL_INV frees it. Every refusal is checked for its CQE and for memory left
// untouched.
#include <doctest/doctest.h>

#include <cstring>
#include <numeric>
#include <vector>

#include "tests/soft/fill_pattern.hpp"
#include "tests/soft/soft_endpoint.hpp"
#include "transport/soft/device_core.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::fill_pattern;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

struct Pair {
    std::shared_ptr<soft::Device> first_device = soft::Device::open();
    std::shared_ptr<soft::Device> second_device = soft::Device::open();
    std::unique_ptr<SoftEndpoint> a;
    std::unique_ptr<SoftEndpoint> b;

    Pair() {
        a = std::make_unique<SoftEndpoint>(first_device);
        b = std::make_unique<SoftEndpoint>(second_device);
        a->connect(b->address());
        b->connect(a->address());
    }
};

constexpr std::uint8_t kAllAccess = mlx5::kMemoryKeyLocalWrite | mlx5::kMemoryKeyRemoteRead |
                                    mlx5::kMemoryKeyRemoteWrite | mlx5::kMemoryKeyAtomic;

// Posts a key configuration on `endpoint` and waits for its completion.
mlx5::Completion configure(SoftEndpoint& endpoint, const mlx5::MemoryKeyLayout& layout) {
    mlx5::SendWorkRequest request;
    request.wr_id = 0xc0f;
    request.opcode = mlx5::SendOpcode::configure_memory_key;
    request.flags = mlx5::kSendSignaled | mlx5::kSendInline;
    request.layout = &layout;
    REQUIRE(endpoint.post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = endpoint.wait_send();
    REQUIRE(completion.has_value());
    return *completion;
}

mlx5::Completion invalidate(SoftEndpoint& endpoint, std::uint32_t key) {
    mlx5::SendWorkRequest request;
    request.wr_id = 0x1a;
    request.opcode = mlx5::SendOpcode::local_invalidate;
    request.flags = mlx5::kSendSignaled;
    request.immediate = key;
    REQUIRE(endpoint.post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = endpoint.wait_send();
    REQUIRE(completion.has_value());
    return *completion;
}

mlx5::Completion run(SoftEndpoint& endpoint, const mlx5::SendWorkRequest& request) {
    REQUIRE(endpoint.post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = endpoint.wait_send();
    REQUIRE(completion.has_value());
    return *completion;
}

// The key as the device holds it: not configured, so no access translates through it.
void check_key_free(soft::Device& device, std::uint32_t key) {
    soft::DeviceCore& core = device.core();
    std::lock_guard lock(core.mutex);
    const soft::IndirectKeyState* state = core.translation.indirect_key(key);
    REQUIRE(state != nullptr);
    CHECK_FALSE(state->configured);
    CHECK(state->entries.empty());
    CHECK(state->length == 0);
}

// B's buffer as a 16x16 matrix of 8-byte elements (rows of 128 bytes); column `column`
// repeated 16 times is the interleaved layout {addr of (0, column), 8 bytes, skip 120}.
struct Column {
    mlx5::InterleavedEntry entry;
    mlx5::MemoryKeyLayout layout;
    Column(SoftEndpoint& owner, std::uint32_t key, std::uint32_t column, std::uint32_t offset = 0) {
        entry = {reinterpret_cast<std::uint64_t>(owner.buffer()) + offset + column * 8, 8, 120, owner.lkey()};
        layout.mkey = key;
        layout.max_entries = 4;
        layout.access = kAllAccess;
        layout.repeat_count = 16;
        layout.num_entries = 1;
        layout.interleaved = &entry;
    }
};

}  // namespace

TEST_CASE("a remote interleaved key: one RDMA read gathers a matrix column, one write scatters it") {
    Pair pair;
    fill_pattern(pair.b->buffer(), 16 * 128, 1);
    const auto key = pair.second_device->create_indirect_key(pair.b->domain_pointer(), 2);
    CHECK(key->max_entries() == 4);
    Column column(*pair.b, key->lkey(), 3);
    const mlx5::Completion configured = configure(*pair.b, column.layout);
    CHECK(configured.status == mlx5::CompletionStatus::success);
    CHECK(configured.opcode == mlx5::CompletionOpcode::memory_key_configured);

    // Read the whole column (128 bytes, zero-based) into A.
    std::memset(pair.a->buffer(), 0, 256);
    const mlx5::ScatterGatherElement into = pair.a->local(0, 128);
    mlx5::SendWorkRequest read = write_request(1, &into, 0, key->rkey());
    read.opcode = mlx5::SendOpcode::rdma_read;
    const mlx5::Completion read_done = run(*pair.a, read);
    REQUIRE(read_done.status == mlx5::CompletionStatus::success);
    CHECK(read_done.byte_len == 128);
    for (std::uint32_t row = 0; row < 16; ++row)
        CHECK(std::memcmp(pair.a->buffer() + row * 8, pair.b->buffer() + row * 128 + 3 * 8, 8) == 0);

    // A read at an offset inside the key, crossing pieces: rows 2.5 to 5.5.
    const mlx5::ScatterGatherElement part = pair.a->local(512, 24);
    mlx5::SendWorkRequest partial = write_request(2, &part, 20, key->rkey());
    partial.opcode = mlx5::SendOpcode::rdma_read;
    REQUIRE(run(*pair.a, partial).status == mlx5::CompletionStatus::success);
    std::vector<std::uint8_t> expected;
    for (std::uint32_t row = 0; row < 16; ++row)
        expected.insert(expected.end(), pair.b->buffer() + row * 128 + 24, pair.b->buffer() + row * 128 + 32);
    CHECK(std::memcmp(pair.a->buffer() + 512, expected.data() + 20, 24) == 0);

    // Write a new column through the key: every other byte of B stays as it was.
    std::vector<std::uint8_t> before(pair.b->buffer(), pair.b->buffer() + 16 * 128);
    fill_pattern(pair.a->buffer() + 1024, 128, 0x80);
    const mlx5::ScatterGatherElement from = pair.a->local(1024, 128);
    REQUIRE(run(*pair.a, write_request(3, &from, 0, key->rkey())).status == mlx5::CompletionStatus::success);
    for (std::uint32_t row = 0; row < 16; ++row) {
        CHECK(std::memcmp(pair.b->buffer() + row * 128 + 24, pair.a->buffer() + 1024 + row * 8, 8) == 0);
        CHECK(std::memcmp(pair.b->buffer() + row * 128, before.data() + row * 128, 24) == 0);
        CHECK(std::memcmp(pair.b->buffer() + row * 128 + 32, before.data() + row * 128 + 32, 96) == 0);
    }
}

TEST_CASE("a local list key with a zero-length entry: send gathers, receive scatters") {
    Pair pair;
    fill_pattern(pair.a->buffer(), 4096, 9);
    const auto send_key = pair.first_device->create_indirect_key(pair.a->domain_pointer(), 3);
    const mlx5::ScatterGatherElement pieces[3] = {pair.a->local(1000, 10), pair.a->local(0, 0), pair.a->local(200, 30)};
    mlx5::MemoryKeyLayout list;
    list.mkey = send_key->lkey();
    list.max_entries = send_key->max_entries();
    list.access = mlx5::kMemoryKeyLocalWrite;
    list.num_entries = 3;
    list.list = pieces;
    REQUIRE(configure(*pair.a, list).status == mlx5::CompletionStatus::success);

    // B receives into its own interleaved key: 4-byte pieces every 16 bytes from offset 2048.
    const auto receive_key = pair.second_device->create_indirect_key(pair.b->domain_pointer(), 1);
    const mlx5::InterleavedEntry spread{reinterpret_cast<std::uint64_t>(pair.b->buffer()) + 2048, 4, 12, pair.b->lkey()};
    mlx5::MemoryKeyLayout interleaved;
    interleaved.mkey = receive_key->lkey();
    interleaved.max_entries = receive_key->max_entries();
    interleaved.access = mlx5::kMemoryKeyLocalWrite;
    interleaved.repeat_count = 10;
    interleaved.num_entries = 1;
    interleaved.interleaved = &spread;
    REQUIRE(configure(*pair.b, interleaved).status == mlx5::CompletionStatus::success);
    REQUIRE(pair.b->post_receive(77, {0, 40, receive_key->lkey()}) == mlx5::PostResult::ok);

    const mlx5::ScatterGatherElement whole{0, 40, send_key->lkey()};
    mlx5::SendWorkRequest send;
    send.wr_id = 5;
    send.opcode = mlx5::SendOpcode::send;
    send.flags = mlx5::kSendSignaled;
    send.sg_list = &whole;
    send.num_sge = 1;
    REQUIRE(run(*pair.a, send).status == mlx5::CompletionStatus::success);
    const auto received = pair.b->wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->status == mlx5::CompletionStatus::success);
    CHECK(received->byte_len == 40);
    std::vector<std::uint8_t> sent(pair.a->buffer() + 1000, pair.a->buffer() + 1010);
    sent.insert(sent.end(), pair.a->buffer() + 200, pair.a->buffer() + 230);
    for (std::uint32_t i = 0; i < 10; ++i) {
        CHECK(std::memcmp(pair.b->buffer() + 2048 + i * 16, sent.data() + i * 4, 4) == 0);
        CHECK(pair.b->buffer()[2048 + i * 16 + 4] == 0);  // the skipped bytes stay untouched
    }
}

TEST_CASE("LOCAL_INV frees the key: later use is a protection error, memory untouched") {
    Pair pair;
    const auto key = pair.second_device->create_indirect_key(pair.b->domain_pointer(), 1);
    Column column(*pair.b, key->lkey(), 0);
    REQUIRE(configure(*pair.b, column.layout).status == mlx5::CompletionStatus::success);
    const mlx5::Completion freed = invalidate(*pair.b, key->rkey());
    CHECK(freed.status == mlx5::CompletionStatus::success);
    CHECK(freed.opcode == mlx5::CompletionOpcode::local_invalidate);

    std::memset(pair.b->buffer(), 0, 16 * 128);
    fill_pattern(pair.a->buffer(), 128, 3);
    const mlx5::ScatterGatherElement from = pair.a->local(0, 128);
    const mlx5::Completion refused = run(*pair.a, write_request(1, &from, 0, key->rkey()));
    CHECK(refused.status == mlx5::CompletionStatus::remote_access_error);
    for (std::uint32_t i = 0; i < 16 * 128; ++i) REQUIRE(pair.b->buffer()[i] == 0);

    // The owner's own use of the freed key as an lkey: local protection error.
    const mlx5::ScatterGatherElement through_key{0, 8, key->lkey()};
    mlx5::SendWorkRequest local_write = write_request(2, &through_key, pair.a->address().buffer_addr, pair.a->address().rkey);
    CHECK(run(*pair.b, local_write).status == mlx5::CompletionStatus::local_protection_error);
}

TEST_CASE("a key configuration is checked entry by entry; a refused one changes nothing") {
    Pair pair;
    const auto key = pair.second_device->create_indirect_key(pair.b->domain_pointer(), 4);
    Column column(*pair.b, key->lkey(), 0);

    SUBCASE("entry out of its region's bounds") {
        // 16 rows of 128 bytes from 1 MiB - 1024: the pattern runs past the region's end.
        column.entry.addr = reinterpret_cast<std::uint64_t>(pair.b->buffer()) + (1u << 20) - 1024;
    }
    SUBCASE("entry key of another protection domain") {
        const auto other_domain = pair.second_device->allocate_protection_domain();
        std::vector<std::uint8_t> other(4096);
        // Every right the key grants, so that only the protection domain can be what is wrong.
        const auto other_region = pair.second_device->register_memory(
            other_domain, other.data(), other.size(), soft::kLocalWrite | soft::kRemoteWrite | soft::kRemoteRead | soft::kRemoteAtomic);
        column.entry.addr = reinterpret_cast<std::uint64_t>(other.data());
        column.entry.lkey = other_region->lkey();
        const mlx5::Completion completion = configure(*pair.b, column.layout);
        CHECK(completion.status == mlx5::CompletionStatus::local_protection_error);
        check_key_free(*pair.second_device, key->lkey());
        return;
    }
    SUBCASE("the key grants remote write, the entry's region does not have it") {
        std::vector<std::uint8_t> read_only(4096);
        const auto region = pair.second_device->register_memory(pair.b->domain_pointer(), read_only.data(), read_only.size(),
                                                                soft::kRemoteRead);
        column.entry.addr = reinterpret_cast<std::uint64_t>(read_only.data());
        column.entry.lkey = region->lkey();
        column.layout.access = mlx5::kMemoryKeyRemoteWrite;
        const mlx5::Completion completion = configure(*pair.b, column.layout);
        CHECK(completion.status == mlx5::CompletionStatus::local_protection_error);
        check_key_free(*pair.second_device, key->lkey());
        return;
    }
    SUBCASE("a key of another protection domain than the QP's") {
        const auto other_domain = pair.second_device->allocate_protection_domain();
        const auto foreign = pair.second_device->create_indirect_key(other_domain, 1);
        column.layout.mkey = foreign->lkey();
    }
    const mlx5::Completion completion = configure(*pair.b, column.layout);
    CHECK(completion.status == mlx5::CompletionStatus::local_protection_error);
    // As on hardware, the refused UMR takes its QP to ERR; B's QP can no longer answer, so
    // the key's state is read from the device: still free, it translates nothing.
    CHECK(pair.b->queue_pair().state() == soft::QueuePairState::error);
    check_key_free(*pair.second_device, key->lkey());
}

TEST_CASE("an access through a key needs the key's own right, and stays within its length") {
    Pair pair;
    const auto key = pair.second_device->create_indirect_key(pair.b->domain_pointer(), 1);
    Column column(*pair.b, key->lkey(), 5);
    column.layout.access = mlx5::kMemoryKeyRemoteRead;  // no remote write
    REQUIRE(configure(*pair.b, column.layout).status == mlx5::CompletionStatus::success);
    std::memset(pair.b->buffer(), 0, 16 * 128);
    fill_pattern(pair.a->buffer(), 256, 3);

    SUBCASE("write without the key's remote write right") {
        const mlx5::ScatterGatherElement from = pair.a->local(0, 8);
        CHECK(run(*pair.a, write_request(1, &from, 0, key->rkey())).status == mlx5::CompletionStatus::remote_access_error);
    }
    SUBCASE("read past the key's 128 bytes") {
        const mlx5::ScatterGatherElement into = pair.a->local(0, 16);
        mlx5::SendWorkRequest read = write_request(1, &into, 120, key->rkey());
        read.opcode = mlx5::SendOpcode::rdma_read;
        CHECK(run(*pair.a, read).status == mlx5::CompletionStatus::remote_access_error);
    }
    for (std::uint32_t i = 0; i < 16 * 128; ++i) REQUIRE(pair.b->buffer()[i] == 0);
}

TEST_CASE("too many entries for the key is refused before anything is posted") {
    Pair pair;
    const auto key = pair.second_device->create_indirect_key(pair.b->domain_pointer(), 1);
    std::vector<mlx5::ScatterGatherElement> pieces(5, pair.b->local(0, 8));
    mlx5::MemoryKeyLayout list;
    list.mkey = key->lkey();
    list.max_entries = key->max_entries();  // 4
    list.access = kAllAccess;
    list.num_entries = 5;
    list.list = pieces.data();
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::configure_memory_key;
    request.flags = mlx5::kSendInline | mlx5::kSendSignaled;
    request.layout = &list;
    CHECK(pair.b->post(&request, 1) == mlx5::PostResult::too_many_entries);
    CHECK_THROWS_WITH_AS(pair.second_device->create_indirect_key(pair.b->domain_pointer(), 0),
                         doctest::Contains("max_entries = 0"), soft::SoftDeviceError);
}
