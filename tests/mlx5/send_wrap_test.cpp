// Every WQE shape the SendQueue encodes, started at every WQEBB of a small ring, compared with a
// reference WQE built from rdma-core's own mlx5dv.h helpers (send_reference.hpp), an encoder
// that shares no code with ours.
// Also: DC address vectors, BlueFlame copies of WQEs that wrap, doorbells for batches written
// with write(), refusals that write nothing, and retirement of unsignaled predecessors.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "tests/mlx5/send_reference.hpp"

namespace mlx5 = rdmachan::mlx5;
using namespace send_test;

TEST_CASE(
    "every RC WQE shape at every ring offset matches the mlx5dv.h reference, wrapping included") {
    std::vector<std::uint8_t> payload(256);
    for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i + 1);
    const auto address = [&](std::size_t offset) {
        return reinterpret_cast<std::uint64_t>(payload.data() + offset);
    };
    const mlx5::ScatterGatherElement elements[7] = {
        {0x10000, 100, 0x11}, {0x20000, 200, 0x22}, {0x30000, 300, 0x33}, {0x40000, 400, 0x44},
        {0x50000, 8, 0x55},   {0x60000, 0, 0x66},   {0x70000, 16, 0x77}};
    mlx5::ScatterGatherElement inline_elements[5] = {{address(0), 0, 0},
                                                     {address(3), 5, 0},
                                                     {address(40), 1, 0},
                                                     {address(90), 50, 0},
                                                     {address(0), 0, 0}};
    std::vector<mlx5::ScatterGatherElement> inline_singles;

    mlx5::SendQueueConfig config;
    config.max_sge = 4;
    config.max_inline_data = 256;
    constexpr std::uint32_t kWqeCount = 8;
    for (const Shape& shape : shapes(elements, inline_elements, inline_singles, payload.data())) {
        for (bool signal_all : {false, true}) {
            config.signal_all = signal_all;
            // Start indices near 65536 so the 16-bit index field wraps along the way.
            for (std::uint32_t start = 65536 - 3; start < 65536 - 3 + kWqeCount; ++start) {
                CAPTURE(shape.name);
                CAPTURE(start);
                CAPTURE(signal_all);
                Ring ring(kWqeCount, start, config);
                REQUIRE(ring.queue.post(&shape.request, 1, nullptr) == mlx5::PostResult::ok);
                const Expected expected = reference(shape.request, start, signal_all, nullptr);
                const std::uint32_t wqebbs = (expected.ds + 3) / 4;
                CHECK(ring.queue.tracking().producer_index == start + wqebbs);
                CHECK(ring.wr_ids[start % kWqeCount] == shape.request.wr_id);
                CHECK(ring.wqe_ends[start % kWqeCount] == start + wqebbs);
                CHECK(mlx5::big_to_host32(ring.doorbell_record[1]) == ((start + wqebbs) & 0xffff));
                CHECK(ring.doorbell_record[0] == 0x11111111);
                const std::vector<std::uint8_t> written = ring.linear(start, kWqeCount * 64);
                for (std::size_t i = 0; i < written.size(); ++i) {
                    CAPTURE(i);
                    if (i < expected.bytes.size() && expected.mask[i]) {
                        REQUIRE(written[i] == expected.bytes[i]);
                    } else if (i >= expected.bytes.size()) {
                        // Nothing after ds*16: not the rest of the last WQEBB, not the ring.
                        REQUIRE(written[i] == kRingPoison);
                    }
                }
                REQUIRE(ring.guards_intact());
            }
        }
    }
}

TEST_CASE(
    "DCI WQEs: the address vector follows ctrl at every offset, and make_dc_address_vector fills "
    "it") {
    std::uint8_t base[48];
    for (std::size_t i = 0; i < sizeof base; ++i) base[i] = static_cast<std::uint8_t>(0x30 + i);
    base[8] = 0;  // dqp_dct starts empty in an address handle
    base[9] = base[10] = base[11] = 0;
    std::uint8_t address_vector[48];
    mlx5::make_dc_address_vector(address_vector, base, 0x00abcdef, 0x0102030405060708ull);
    const auto* av = reinterpret_cast<const mlx5_wqe_av*>(address_vector);
    CHECK(be64toh(av->key.dc_key) == 0x0102030405060708ull);
    CHECK(be32toh(av->dqp_dct) == (MLX5_EXTENDED_UD_AV | 0x00abcdef));
    CHECK(std::memcmp(address_vector + 12, base + 12, 36) == 0);

    const std::uint8_t payload[60] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    const mlx5::ScatterGatherElement element{0x8000, 64, 0x99};
    const mlx5::ScatterGatherElement inline_element{reinterpret_cast<std::uint64_t>(payload), 60,
                                                    0};
    mlx5::SendQueueConfig config;
    config.max_sge = 2;
    config.max_inline_data = 128;
    config.dc_initiator = true;
    constexpr std::uint32_t kWqeCount = 4;
    for (int kind = 0; kind < 4; ++kind) {
        mlx5::SendWorkRequest request;
        request.wr_id = 77;
        request.flags = mlx5::kSendSignaled;
        request.dc_address_vector = address_vector;
        request.dci_stream_id = static_cast<std::uint16_t>(kind == 1 ? 0x0203 : 0);
        request.remote_addr = 0xfeedf00d;
        request.rkey = 0x1234;
        request.compare_add = 5;
        request.sg_list = kind == 2 ? &inline_element : &element;
        request.num_sge = 1;
        request.opcode = kind == 3   ? mlx5::SendOpcode::atomic_fetch_and_add
                         : kind == 2 ? mlx5::SendOpcode::send
                                     : mlx5::SendOpcode::rdma_write;
        if (kind == 2) request.flags |= mlx5::kSendInline;
        for (std::uint32_t start = 0; start < kWqeCount; ++start) {
            CAPTURE(kind);
            CAPTURE(start);
            Ring ring(kWqeCount, start, config);
            REQUIRE(ring.queue.post(&request, 1, nullptr) == mlx5::PostResult::ok);
            const Expected expected = reference(request, start, false, address_vector);
            const std::vector<std::uint8_t> written = ring.linear(start, kWqeCount * 64);
            for (std::size_t i = 0; i < expected.bytes.size(); ++i) {
                CAPTURE(i);
                if (expected.mask[i]) REQUIRE(written[i] == expected.bytes[i]);
            }
            CHECK(ring.queue.tracking().producer_index == start + (expected.ds + 3) / 4);
            CHECK(ring.guards_intact());
        }
    }
}

TEST_CASE("BlueFlame copies a WQE that wraps with its source wrapping too, in 64-byte blocks") {
    mlx5::SendQueueConfig config;
    config.max_sge = 4;
    const mlx5::ScatterGatherElement elements[4] = {{1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {4, 4, 4}};
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::rdma_write;
    request.sg_list = elements;
    request.num_sge = 4;  // ds 6: two WQEBBs, the second one at ring index 0
    Ring ring(4, 3, config);
    REQUIRE(ring.queue.post(&request, 1, nullptr) == mlx5::PostResult::ok);
    const std::vector<std::uint8_t> wqe = ring.linear(3, 128);
    CHECK(std::memcmp(ring.registers.data(), wqe.data(), 96) == 0);
    // The copy is whole blocks: bytes 96-127 are the ring's stale padding, nothing beyond.
    CHECK(std::memcmp(ring.registers.data() + 96, wqe.data() + 96, 32) == 0);
    for (std::size_t i = 128; i < ring.registers.size(); ++i)
        REQUIRE(ring.registers[i] == kRegisterPoison);
    CHECK(ring.queue.blueflame_offset() == 256);
}

TEST_CASE(
    "BlueFlame eligibility: ds 1, too large, batches and prefer_blueflame off use the 8-byte "
    "doorbell") {
    std::uint8_t payload[256] = {};
    const mlx5::ScatterGatherElement empty{0x1000, 0, 1};
    const mlx5::ScatterGatherElement one{0x1000, 8, 1};
    const mlx5::ScatterGatherElement inline_small{reinterpret_cast<std::uint64_t>(payload), 20, 0};
    const mlx5::ScatterGatherElement inline_large{reinterpret_cast<std::uint64_t>(payload), 250, 0};
    struct Case {
        const char* name;
        bool prefer;
        mlx5::SendOpcode opcode;
        const mlx5::ScatterGatherElement* element;
        bool is_inline;
        std::uint32_t count;  // requests in the batch
        bool blueflame;
    };
    const Case cases[] = {
        {"send without data (ds 1)", true, mlx5::SendOpcode::send, &empty, false, 1, false},
        {"write, preferred", true, mlx5::SendOpcode::rdma_write, &one, false, 1, true},
        {"write, not preferred", false, mlx5::SendOpcode::rdma_write, &one, false, 1, false},
        {"inline, not preferred", false, mlx5::SendOpcode::send, &inline_small, true, 1, true},
        {"inline larger than the BlueFlame buffer", true, mlx5::SendOpcode::send, &inline_large,
         true, 1, false},
        {"batch of two", true, mlx5::SendOpcode::rdma_write, &one, false, 2, false},
    };
    for (const Case& one_case : cases) {
        CAPTURE(one_case.name);
        mlx5::SendQueueConfig config;
        config.max_sge = 1;
        config.max_inline_data = 256;
        config.prefer_blueflame = one_case.prefer;
        Ring ring(16, 0, config);
        mlx5::SendWorkRequest requests[2];
        for (auto& request : requests) {
            request.opcode = one_case.opcode;
            request.sg_list = one_case.element;
            request.num_sge = 1;
            request.flags = one_case.is_inline ? mlx5::kSendInline : 0;
        }
        std::uint32_t posted = 0;
        REQUIRE(ring.queue.post(requests, one_case.count, &posted) == mlx5::PostResult::ok);
        CHECK(posted == one_case.count);
        const std::uint32_t last =
            ring.queue.tracking().producer_index - (one_case.element == &inline_large ? 5 : 1);
        const std::vector<std::uint8_t> wqe = ring.linear(last, 64);
        const std::size_t written = one_case.blueflame ? 64 : 8;
        CHECK(std::memcmp(ring.registers.data(), wqe.data(), written) == 0);
        for (std::size_t i = written; i < ring.registers.size(); ++i)
            REQUIRE(ring.registers[i] == kRegisterPoison);
    }
}

TEST_CASE(
    "write() batches across calls under one doorbell; ringing with nothing pending does nothing") {
    mlx5::SendQueueConfig config;
    Ring ring(16, 10, config);
    ring.queue.ring_doorbell();
    CHECK(ring.doorbell_record[1] == 0x22222222);
    CHECK(ring.registers[0] == kRegisterPoison);
    CHECK(ring.queue.blueflame_offset() == 0);

    const mlx5::ScatterGatherElement element{0x4000, 32, 4};
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::send;
    request.sg_list = &element;
    request.num_sge = 1;
    for (std::uint64_t i = 0; i < 5; ++i) {
        request.wr_id = i;
        REQUIRE(ring.queue.write(request) == mlx5::PostResult::ok);
        CHECK(ring.queue.doorbell_pending());
    }
    CHECK(ring.doorbell_record[1] == 0x22222222);  // nothing rung yet
    // A post of zero requests still rings for what write() left pending.
    std::uint32_t posted = 99;
    CHECK(ring.queue.post(nullptr, 0, &posted) == mlx5::PostResult::ok);
    CHECK(posted == 0);
    CHECK(!ring.queue.doorbell_pending());
    CHECK(mlx5::big_to_host32(ring.doorbell_record[1]) == 15);
    // The 8-byte doorbell carries the last WQE's ctrl bytes 0-7: index 14, ds 2.
    CHECK(mlx5::load_big32(ring.registers.data()) == ((14u << 8) | MLX5_OPCODE_SEND));
    CHECK(mlx5::load_big32(ring.registers.data() + 4) == ((kQpn << 8) | 2));
    CHECK(ring.registers[8] == kRegisterPoison);
    CHECK(ring.queue.blueflame_offset() == 256);
    ring.queue.ring_doorbell();  // nothing new: the offset stays
    CHECK(ring.queue.blueflame_offset() == 256);
}

TEST_CASE(
    "refusals write nothing: null DC address vector, ds above 63, unknown opcode, inline read") {
    const mlx5::ScatterGatherElement elements[61] = {};
    std::vector<mlx5::ScatterGatherElement> nonzero(60, {0x1000, 4, 1});
    struct Case {
        const char* name;
        bool dc;
        mlx5::SendWorkRequest request;
        mlx5::PostResult expected;
    };
    mlx5::SendWorkRequest base;
    base.opcode = mlx5::SendOpcode::rdma_write;
    base.sg_list = nonzero.data();
    base.num_sge = 1;
    mlx5::SendWorkRequest null_av = base;
    mlx5::SendWorkRequest too_many_segments = base;
    too_many_segments.num_sge = 60;  // ctrl + raddr + 60 data segments = 62 fits, DC makes it 65
    mlx5::SendWorkRequest unknown = base;
    unknown.opcode = static_cast<mlx5::SendOpcode>(42);
    mlx5::SendWorkRequest inline_atomic = base;
    inline_atomic.opcode = mlx5::SendOpcode::atomic_compare_and_swap;
    inline_atomic.flags = mlx5::kSendInline;
    mlx5::SendWorkRequest too_many_sge = base;
    too_many_sge.sg_list = elements;
    too_many_sge.num_sge = 61;
    std::uint8_t address_vector[48] = {};
    mlx5::SendWorkRequest dc_too_large = too_many_segments;
    dc_too_large.dc_address_vector = address_vector;
    const Case cases[] = {
        {"null address vector on a DCI", true, null_av, mlx5::PostResult::invalid_request},
        {"ds 65 on a DCI", true, dc_too_large, mlx5::PostResult::invalid_request},
        {"unknown opcode", false, unknown, mlx5::PostResult::invalid_request},
        {"inline atomic", false, inline_atomic, mlx5::PostResult::invalid_request},
        {"61 SGEs", false, too_many_sge, mlx5::PostResult::too_many_sge},
    };
    for (const Case& one_case : cases) {
        CAPTURE(one_case.name);
        mlx5::SendQueueConfig config;
        config.max_sge = 60;
        config.dc_initiator = one_case.dc;
        Ring ring(32, 7, config);
        const std::vector<std::uint8_t> before = ring.memory;
        std::uint32_t posted = 99;
        CHECK(ring.queue.post(&one_case.request, 1, &posted) == one_case.expected);
        CHECK(posted == 0);
        CHECK(ring.memory == before);
        CHECK(ring.doorbell_record[1] == 0x22222222);
        CHECK(ring.registers[0] == kRegisterPoison);
        CHECK(ring.queue.tracking().producer_index == 7);
    }
    // The same 60 SGEs fit on an RC queue: ds 62, 16 WQEBBs.
    mlx5::SendQueueConfig config;
    config.max_sge = 60;
    Ring ring(32, 7, config);
    CHECK(ring.queue.post(&too_many_segments, 1, nullptr) == mlx5::PostResult::ok);
    CHECK(ring.queue.tracking().producer_index == 7 + 16);
    CHECK(ring.guards_intact());
}

TEST_CASE("a batch stops at the first refused request and rings once for those before it") {
    mlx5::SendQueueConfig config;
    config.max_sge = 2;
    config.max_inline_data = 16;
    Ring ring(16, 0, config);
    std::uint8_t payload[32] = {};
    const mlx5::ScatterGatherElement element{0x1000, 8, 1};
    const mlx5::ScatterGatherElement big{reinterpret_cast<std::uint64_t>(payload), 32, 0};
    mlx5::SendWorkRequest requests[3];
    for (auto& request : requests) {
        request.opcode = mlx5::SendOpcode::rdma_write;
        request.sg_list = &element;
        request.num_sge = 1;
    }
    requests[1].sg_list = &big;
    requests[1].flags = mlx5::kSendInline;
    std::uint32_t posted = 0;
    CHECK(ring.queue.post(requests, 3, &posted) == mlx5::PostResult::inline_too_large);
    CHECK(posted == 1);
    CHECK(mlx5::big_to_host32(ring.doorbell_record[1]) == 1);
    // The doorbell names the WQE that was posted (index 0), not the refused one.
    CHECK(mlx5::load_big32(ring.registers.data()) == MLX5_OPCODE_RDMA_WRITE);
    const std::vector<std::uint8_t> rest = ring.linear(1, 15 * 64);
    for (std::uint8_t byte : rest) REQUIRE(byte == kRingPoison);
}

TEST_CASE("a signaled completion retires its unsignaled predecessors of every size") {
    mlx5::SendQueueConfig config;
    config.max_sge = 4;
    config.max_inline_data = 256;
    Ring ring(16, 65530, config);
    const mlx5::ScatterGatherElement elements[4] = {{1, 1, 1}, {2, 2, 2}, {3, 3, 3}, {4, 4, 4}};
    std::uint8_t payload[200] = {};
    const mlx5::ScatterGatherElement inline_element{reinterpret_cast<std::uint64_t>(payload), 200,
                                                    0};
    mlx5::SendWorkRequest requests[3];
    requests[0].wr_id = 1;
    requests[0].opcode = mlx5::SendOpcode::send;
    requests[0].sg_list = &inline_element;
    requests[0].num_sge = 1;
    requests[0].flags = mlx5::kSendInline;  // ds 14: 4 WQEBBs
    requests[1].wr_id = 2;
    requests[1].opcode = mlx5::SendOpcode::rdma_write;
    requests[1].sg_list = elements;
    requests[1].num_sge = 4;  // ds 6: 2 WQEBBs
    requests[2].wr_id = 3;
    requests[2].opcode = mlx5::SendOpcode::atomic_fetch_and_add;
    requests[2].sg_list = elements;
    requests[2].num_sge = 1;
    requests[2].flags = mlx5::kSendSignaled;  // ds 4: 1 WQEBB
    REQUIRE(ring.queue.post(requests, 3, nullptr) == mlx5::PostResult::ok);
    CHECK(ring.queue.free_wqebbs() == 16 - 7);
    const std::uint32_t signaled = 65530 + 4 + 2;
    CHECK(mlx5::retire_send(ring.queue.tracking(), 16, static_cast<std::uint16_t>(signaled)) == 3);
    CHECK(ring.queue.tracking().consumer_index == 65530 + 7);
    CHECK(ring.queue.free_wqebbs() == 16);
    // The signaled WQE is the one the completion names, and it asked for a CQE.
    CHECK((ring.linear(signaled, 16)[11] & MLX5_WQE_CTRL_CQ_UPDATE) != 0);
    CHECK((ring.linear(65530, 16)[11] & MLX5_WQE_CTRL_CQ_UPDATE) == 0);
}

TEST_CASE("WQ signature: the complement of the XOR over the WQE's ds*16 bytes, wrapping") {
    mlx5::SendQueueConfig config;
    config.max_sge = 4;
    config.wqe_signature = true;
    const mlx5::ScatterGatherElement elements[4] = {
        {0x1234, 9, 1}, {0x5678, 10, 2}, {0x9abc, 11, 3}, {0xdef0, 12, 4}};
    mlx5::SendWorkRequest request;
    request.opcode = mlx5::SendOpcode::rdma_write;
    request.flags = mlx5::kSendSignaled;
    request.sg_list = elements;
    request.num_sge = 4;
    for (std::uint32_t start = 0; start < 4; ++start) {
        CAPTURE(start);
        Ring ring(4, start, config);
        REQUIRE(ring.queue.post(&request, 1, nullptr) == mlx5::PostResult::ok);
        const std::vector<std::uint8_t> wqe = ring.linear(start, 6 * 16);
        std::uint8_t xor_all = 0;
        for (std::uint8_t byte : wqe) xor_all ^= byte;
        CHECK(xor_all == 0xff);  // the signature byte makes the whole WQE XOR to all ones
    }
}

TEST_CASE("WQ signature also on WQEs without data segments (no SGE: ctrl and remote address only)") {
    mlx5::SendQueueConfig config;
    config.max_sge = 4;
    config.wqe_signature = true;
    for (const mlx5::SendOpcode opcode : {mlx5::SendOpcode::send, mlx5::SendOpcode::rdma_write}) {
        mlx5::SendWorkRequest request;
        request.opcode = opcode;
        request.flags = mlx5::kSendSignaled;
        request.num_sge = 0;
        const std::size_t bytes = opcode == mlx5::SendOpcode::send ? 16 : 32;
        for (std::uint32_t start = 0; start < 4; ++start) {
            CAPTURE(start);
            CAPTURE(static_cast<int>(opcode));
            Ring ring(4, start, config);
            REQUIRE(ring.queue.post(&request, 1, nullptr) == mlx5::PostResult::ok);
            const std::vector<std::uint8_t> wqe = ring.linear(start, bytes);
            std::uint8_t xor_all = 0;
            for (std::uint8_t byte : wqe) xor_all ^= byte;
            CHECK(xor_all == 0xff);
        }
    }
}
