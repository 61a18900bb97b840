// A randomized run against a model: random WQE shapes in random batches, completions that
// retire a random prefix of the WQEs in flight, and refusals when the ring is full, over
// thousands of wraps of a 16-WQEBB ring. Each step checks every posted WQE against the mlx5dv.h
// reference, that nothing else in the ring changed, the doorbell record, the register write
// (BlueFlame copy or 8-byte doorbell) and its offset, the tracking arrays and the guard bytes.
#include <doctest/doctest.h>

#include <algorithm>
#include <deque>
#include <random>
#include <vector>

#include "tests/mlx5/send_reference.hpp"

namespace mlx5 = rdmachan::mlx5;
using namespace send_test;

namespace {

struct InFlight {
    std::uint32_t start;
    std::uint32_t wqebbs;
    std::uint64_t wr_id;
};

// One run of the model: a ring of `wqe_count` WQEBBs, batches of 1 to `max_batch` requests,
// each repeating the previous request's shape with probability `repeat_percent` (runs of one
// opcode take the encoder's per-opcode loop); `dc` makes it a DC initiator, every request with
// an address vector.
void run_model(std::uint32_t wqe_count, std::uint32_t max_batch, std::uint32_t repeat_percent,
               int steps, bool dc = false) {
    std::vector<std::uint8_t> payload(256);
    for (std::size_t i = 0; i < payload.size(); ++i)
        payload[i] = static_cast<std::uint8_t>(i * 7 + 3);
    const auto address = [&](std::size_t offset) {
        return reinterpret_cast<std::uint64_t>(payload.data() + offset);
    };
    const mlx5::ScatterGatherElement elements[7] = {
        {0x10000, 100, 0x11}, {0x20000, 200, 0x22}, {0x30000, 300, 0x33}, {0x40000, 400, 0x44},
        {0x50000, 8, 0x55},   {0x60000, 0, 0x66},   {0x70000, 16, 0x77}};
    const mlx5::ScatterGatherElement inline_elements[5] = {{address(0), 0, 0},
                                                           {address(3), 5, 0},
                                                           {address(40), 1, 0},
                                                           {address(90), 50, 0},
                                                           {address(0), 0, 0}};
    std::vector<mlx5::ScatterGatherElement> inline_singles;
    const std::vector<Shape> all_shapes =
        shapes(elements, inline_elements, inline_singles, payload.data());

    std::uint8_t address_vector[48];
    for (std::size_t i = 0; i < sizeof address_vector; ++i)
        address_vector[i] = static_cast<std::uint8_t>(0xc0 + i);
    const std::uint8_t* const expected_address_vector = dc ? address_vector : nullptr;

    mlx5::SendQueueConfig config;
    config.max_sge = 4;
    config.max_inline_data = 256;
    config.dc_initiator = dc;
    const std::uint32_t kWqeCount = wqe_count;
    const std::uint32_t first = 65536 - 100;  // the 16-bit index wraps early in the run
    Ring ring(kWqeCount, first, config);
    std::uint32_t producer = first;
    std::uint32_t consumer = first;
    std::uint32_t blueflame_offset = 0;
    std::uint32_t doorbell_record = ring.doorbell_record[1];
    std::deque<InFlight> in_flight;
    std::uint64_t next_wr_id = 1;
    std::mt19937 random(20261122);
    std::uint32_t refusals = 0;
    std::uint32_t retirements = 0;

    std::size_t shape = 0;
    for (int step = 0; step < steps; ++step) {
        CAPTURE(step);
        if (!in_flight.empty() && random() % 3 == 0) {
            // A completion for a random WQE in flight retires it and everything before it.
            const std::size_t index = random() % in_flight.size();
            const InFlight completed = in_flight[index];
            CHECK(mlx5::retire_send(ring.queue.tracking(), kWqeCount,
                                    static_cast<std::uint16_t>(completed.start)) ==
                  completed.wr_id);
            consumer = completed.start + completed.wqebbs;
            REQUIRE(ring.queue.tracking().consumer_index == consumer);
            in_flight.erase(in_flight.begin(), in_flight.begin() + static_cast<long>(index) + 1);
            ++retirements;
            continue;
        }
        const std::uint32_t count = 1 + random() % max_batch;
        std::vector<mlx5::SendWorkRequest> batch;
        for (std::uint32_t i = 0; i < count; ++i) {
            if (random() % 100 >= repeat_percent) shape = random() % all_shapes.size();
            batch.push_back(all_shapes[shape].request);
            batch.back().wr_id = next_wr_id++;
            batch.back().dc_address_vector = expected_address_vector;
        }
        // The model: WQEs are accepted in order while they fit in the free WQEBBs.
        std::vector<Expected> expected;
        std::vector<std::uint32_t> starts;
        std::uint32_t model_producer = producer;
        for (const mlx5::SendWorkRequest& request : batch) {
            Expected wqe = reference(request, model_producer, false, expected_address_vector);
            const std::uint32_t wqebbs = (wqe.ds + 3) / 4;
            if (wqebbs > kWqeCount - (model_producer - consumer)) break;
            starts.push_back(model_producer);
            model_producer += wqebbs;
            expected.push_back(std::move(wqe));
        }
        const std::vector<std::uint8_t> before = ring.linear(0, kWqeCount * 64);
        std::fill(ring.registers.begin(), ring.registers.end(), kRegisterPoison);
        std::uint32_t posted = 99;
        const mlx5::PostResult result = ring.queue.post(batch.data(), count, &posted);
        REQUIRE(posted == expected.size());
        REQUIRE(result ==
                (expected.size() == count ? mlx5::PostResult::ok : mlx5::PostResult::queue_full));
        refusals += result != mlx5::PostResult::ok;

        // Ring bytes: the new WQEs where defined, the previous contents everywhere else.
        std::vector<std::uint8_t> model = before;
        for (std::size_t w = 0; w < expected.size(); ++w) {
            for (std::size_t i = 0; i < expected[w].bytes.size(); ++i) {
                if (expected[w].mask[i])
                    model[((starts[w] % kWqeCount) * 64 + i) % model.size()] = expected[w].bytes[i];
            }
            in_flight.push_back({starts[w], (expected[w].ds + 3) / 4, batch[w].wr_id});
            REQUIRE(ring.wr_ids[starts[w] % kWqeCount] == batch[w].wr_id);
            REQUIRE(ring.wqe_ends[starts[w] % kWqeCount] == starts[w] + (expected[w].ds + 3) / 4);
        }
        REQUIRE(ring.linear(0, kWqeCount * 64) == model);
        REQUIRE(ring.guards_intact());
        producer = model_producer;
        REQUIRE(ring.queue.tracking().producer_index == producer);

        // Doorbell: record and register only when something was posted.
        std::vector<std::uint8_t> registers(ring.registers.size(), kRegisterPoison);
        if (!expected.empty()) {
            doorbell_record = mlx5::host_to_big32(producer & 0xffff);
            const std::uint32_t last_ds = expected.back().ds;
            const bool blueflame = expected.size() == 1 && last_ds > 1 && last_ds <= 16;
            const std::size_t written = blueflame ? (last_ds + 3) / 4 * 64 : 8;
            const std::vector<std::uint8_t> last = ring.linear(starts.back(), written);
            std::copy(last.begin(), last.end(), registers.begin() + blueflame_offset);
            blueflame_offset ^= 256;
        }
        REQUIRE(ring.registers == registers);
        REQUIRE(ring.doorbell_record[1] == doorbell_record);
        REQUIRE(ring.queue.blueflame_offset() == blueflame_offset);
    }
    // The run must have exercised both refusals and completions, and wrapped many times.
    CHECK(refusals > 100);
    CHECK(retirements > 1000);
    CHECK(producer - first > 100 * kWqeCount);
}

}  // namespace

TEST_CASE("random batches, partial retirement and full-ring refusals follow the model") {
    run_model(16, 4, 0, 20000);
}

TEST_CASE("long batches with runs of one shape on a larger ring follow the model") {
    run_model(256, 24, 80, 6000);
}

// The out-of-line DCI post, including its refresh of the fast room at the ring end.
TEST_CASE("DC initiator: long batches with runs of one shape follow the model") {
    run_model(256, 24, 80, 6000, true);
}
