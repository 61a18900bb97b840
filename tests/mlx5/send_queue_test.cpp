// SendQueue behaviour the golden vectors do not cover: guard bytes around the ring, refusals
// that write nothing, batches under one doorbell, BlueFlame offset toggling, 16-bit counter
// wrap, and retirement of unsignaled predecessors — checked by a decoder written here.
#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <vector>

#include "transport/mlx5/send_queue.hpp"

namespace mlx5 = rdmachan::mlx5;

namespace {

constexpr std::uint8_t kGuard = 0xee;
constexpr std::size_t kGuardBytes = 256;

struct Fixture {
    explicit Fixture(std::uint32_t wqe_count = 64, std::uint32_t blueflame_size = 256, std::uint32_t start = 0)
        : memory(kGuardBytes * 2 + wqe_count * 64, kGuard), registers(1024, 0), wr_ids(wqe_count), wqe_ends(wqe_count) {
        ring.buffer = memory.data() + kGuardBytes;
        std::memset(ring.buffer, 0, wqe_count * 64);
        ring.wqe_count = wqe_count;
        ring.qpn = 0x4321;
        ring.doorbell_record = doorbell_record;
        ring.blueflame_register = registers.data();
        ring.blueflame_size = blueflame_size;
        config.max_sge = 4;
        config.max_inline_data = 512;
        queue = mlx5::SendQueue(ring, {wr_ids.data(), wqe_ends.data(), start, start}, config);
    }
    bool guards_intact() const {
        for (std::size_t i = 0; i < kGuardBytes; ++i) {
            if (memory[i] != kGuard || memory[memory.size() - 1 - i] != kGuard) return false;
        }
        return true;
    }
    std::uint8_t* wqe(std::uint32_t index) { return ring.buffer + (index & (ring.wqe_count - 1)) * 64; }

    std::vector<std::uint8_t> memory;
    std::vector<std::uint8_t> registers;
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    std::uint32_t doorbell_record[2] = {0, 0};
    mlx5::SendQueueRing ring;
    mlx5::SendQueueConfig config;
    mlx5::SendQueue queue;
};

mlx5::SendWorkRequest write_request(std::uint64_t wr_id, const mlx5::ScatterGatherElement* elements, std::uint32_t count,
                            std::uint32_t flags = mlx5::kSendSignaled) {
    mlx5::SendWorkRequest request;
    request.wr_id = wr_id;
    request.opcode = mlx5::SendOpcode::rdma_write;
    request.flags = flags;
    request.sg_list = elements;
    request.num_sge = count;
    request.remote_addr = 0x1122334455667788ull;
    request.rkey = 0xabcdef;
    return request;
}

// An independent reading of one WQE: the ring bytes from its first WQEBB, wrapping.
std::vector<std::uint8_t> read_wqe(Fixture& fixture, std::uint32_t index, std::uint32_t bytes) {
    std::vector<std::uint8_t> out(bytes);
    const std::size_t ring_bytes = fixture.ring.wqe_count * 64;
    for (std::uint32_t i = 0; i < bytes; ++i) out[i] = fixture.ring.buffer[((index & (fixture.ring.wqe_count - 1)) * 64 + i) % ring_bytes];
    return out;
}

}  // namespace

TEST_CASE("a refused request writes nothing and rings nothing") {
    Fixture fixture(8);
    std::vector<std::uint8_t> payload(600, 1);
    const mlx5::ScatterGatherElement too_big{reinterpret_cast<std::uint64_t>(payload.data()), 600, 0};
    const mlx5::SendWorkRequest inline_request = write_request(1, &too_big, 1, mlx5::kSendSignaled | mlx5::kSendInline);
    const std::vector<std::uint8_t> before = fixture.memory;
    CHECK(fixture.queue.post(&inline_request, 1, nullptr) == mlx5::PostResult::inline_too_large);
    mlx5::ScatterGatherElement elements[5] = {};
    for (auto& element : elements) element = {0x1000, 8, 1};
    const mlx5::SendWorkRequest too_many = write_request(2, elements, 5);
    CHECK(fixture.queue.post(&too_many, 1, nullptr) == mlx5::PostResult::too_many_sge);
    mlx5::SendWorkRequest inline_read = write_request(3, elements, 1, mlx5::kSendInline);
    inline_read.opcode = mlx5::SendOpcode::rdma_read;
    CHECK(fixture.queue.post(&inline_read, 1, nullptr) == mlx5::PostResult::invalid_request);
    CHECK(fixture.memory == before);
    CHECK(fixture.doorbell_record[1] == 0);
    CHECK(fixture.queue.tracking().producer_index == 0);
}

TEST_CASE("a full ring refuses the WQE that does not fit, and accepts again after retirement") {
    Fixture fixture(8);
    const mlx5::ScatterGatherElement element{0x1000, 64, 7};
    std::vector<mlx5::SendWorkRequest> requests;
    for (std::uint64_t i = 0; i < 9; ++i) requests.push_back(write_request(100 + i, &element, 1, i == 7 ? mlx5::kSendSignaled : 0));
    std::uint32_t posted = 0;
    CHECK(fixture.queue.post(requests.data(), 9, &posted) == mlx5::PostResult::queue_full);
    CHECK(posted == 8);
    CHECK(fixture.queue.free_wqebbs() == 0);
    // One doorbell for the batch: the record holds the index after the last WQE, and the 8-byte
    // doorbell carries the last WQE's first 8 bytes.
    CHECK(mlx5::big_to_host32(fixture.doorbell_record[1]) == 8);
    CHECK(std::memcmp(fixture.registers.data(), fixture.wqe(7), 8) == 0);
    for (std::size_t i = 8; i < 64; ++i) CHECK(fixture.registers[i] == 0);
    // The signaled 8th WQE retires all eight.
    CHECK(mlx5::retire_send(fixture.queue.tracking(), 8, 7) == 107);
    CHECK(fixture.queue.free_wqebbs() == 8);
    CHECK(fixture.queue.post(&requests[8], 1, &posted) == mlx5::PostResult::ok);
    CHECK(fixture.guards_intact());
}

TEST_CASE("BlueFlame: single WQEs are copied whole and the offset alternates") {
    Fixture fixture(64, 256);
    const mlx5::ScatterGatherElement element{0x2000, 32, 9};
    for (std::uint32_t post = 0; post < 4; ++post) {
        std::fill(fixture.registers.begin(), fixture.registers.end(), 0);
        const mlx5::SendWorkRequest request = write_request(post, &element, 1);
        REQUIRE(fixture.queue.post(&request, 1, nullptr) == mlx5::PostResult::ok);
        const std::uint32_t offset = (post % 2) * 256;
        CHECK(std::memcmp(fixture.registers.data() + offset, fixture.wqe(post), 48) == 0);
        CHECK(fixture.queue.blueflame_offset() == ((post + 1) % 2) * 256);
    }
}

TEST_CASE("the 16-bit WQE index and doorbell record wrap at 65536") {
    Fixture fixture(64, 0, 65534);
    const mlx5::ScatterGatherElement element{0x3000, 16, 3};
    for (std::uint32_t i = 0; i < 4; ++i) {
        const mlx5::SendWorkRequest request = write_request(i, &element, 1);
        REQUIRE(fixture.queue.post(&request, 1, nullptr) == mlx5::PostResult::ok);
        const std::uint32_t producer = 65534 + i;
        const std::uint32_t opmod_index_opcode = mlx5::load_big32(fixture.wqe(producer));
        CHECK(((opmod_index_opcode >> 8) & 0xffff) == (producer & 0xffff));
        CHECK(mlx5::big_to_host32(fixture.doorbell_record[1]) == ((producer + 1) & 0xffff));
        mlx5::retire_send(fixture.queue.tracking(), 64, static_cast<std::uint16_t>(producer));
    }
}

TEST_CASE("random WQE sizes over many wraps: every WQE decodes back, nothing outside the ring is touched") {
    Fixture fixture(32, 256);
    std::mt19937 random(12345);
    std::vector<std::uint8_t> payload(512);
    for (std::size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<std::uint8_t>(i * 13 + 1);
    std::uint32_t in_flight_start = 0;
    for (std::uint32_t round = 0; round < 20000; ++round) {
        mlx5::ScatterGatherElement elements[4];
        const bool use_inline = random() % 3 == 0;
        const std::uint32_t sges = 1 + random() % 4;
        std::uint32_t total = 0;
        for (std::uint32_t i = 0; i < sges; ++i) {
            const std::uint32_t length = use_inline ? random() % 100 : 1 + random() % 5000;
            elements[i] = {reinterpret_cast<std::uint64_t>(payload.data()) + (use_inline ? i * 100 : 0x1000 * i),
                           length, 0x100 + i};
            total += length;
        }
        mlx5::SendWorkRequest request = write_request(round, elements, sges, mlx5::kSendSignaled | (use_inline ? mlx5::kSendInline : 0u));
        if (random() % 2 == 0) request.opcode = mlx5::SendOpcode::send;
        const std::uint32_t start = fixture.queue.tracking().producer_index;
        mlx5::PostResult result = fixture.queue.post(&request, 1, nullptr);
        if (result == mlx5::PostResult::queue_full) {
            // Retire everything and try again.
            mlx5::retire_send(fixture.queue.tracking(), 32, static_cast<std::uint16_t>(in_flight_start));
            fixture.queue.tracking().consumer_index = fixture.queue.tracking().producer_index;
            result = fixture.queue.post(&request, 1, nullptr);
        }
        REQUIRE(result == mlx5::PostResult::ok);
        in_flight_start = start;
        const std::uint32_t wqebbs = fixture.queue.tracking().producer_index - start;
        const std::vector<std::uint8_t> bytes = read_wqe(fixture, start, wqebbs * 64);
        const std::uint32_t ds = mlx5::load_big32(bytes.data() + 4) & 0x3f;
        CHECK(((mlx5::load_big32(bytes.data()) >> 8) & 0xffff) == (start & 0xffff));
        CHECK((mlx5::load_big32(bytes.data() + 4) >> 8) == 0x4321);
        CHECK((ds * 16 + 63) / 64 == wqebbs);
        std::size_t offset = 16;
        if (request.opcode == mlx5::SendOpcode::rdma_write) {
            CHECK(mlx5::load_big64(bytes.data() + offset) == 0x1122334455667788ull);
            CHECK(mlx5::load_big32(bytes.data() + offset + 8) == 0xabcdef);
            offset += 16;
        }
        if (use_inline) {
            if (total != 0) {
                CHECK(mlx5::load_big32(bytes.data() + offset) == (total | 0x80000000u));
                std::size_t position = offset + 4;
                for (std::uint32_t i = 0; i < sges; ++i) {
                    CHECK(std::memcmp(bytes.data() + position, reinterpret_cast<const void*>(elements[i].addr), elements[i].length) == 0);
                    position += elements[i].length;
                }
            }
        } else {
            for (std::uint32_t i = 0; i < sges; ++i) {
                CHECK(mlx5::load_big32(bytes.data() + offset) == elements[i].length);
                CHECK(mlx5::load_big32(bytes.data() + offset + 4) == elements[i].lkey);
                CHECK(mlx5::load_big64(bytes.data() + offset + 8) == elements[i].addr);
                offset += 16;
            }
        }
        CHECK(fixture.queue.tracking().wr_id[start & 31] == round);
        REQUIRE(fixture.guards_intact());
    }
}
