// CompletionQueue over CQEs written here by hand: the owner bit across several passes of the
// ring, 128-byte entries, every syndrome, an unknown QP, and the 24-bit consumer index.
#include <doctest/doctest.h>

#include <cstring>
#include <string>
#include <vector>

#include "transport/mlx5/completion_queue.hpp"

namespace mlx5 = rdmachan::mlx5;

namespace {

struct Fixture {
    explicit Fixture(std::uint32_t count = 8, std::uint32_t size = 64, std::uint32_t start = 0)
        : buffer(count * size, 0), wr_ids(16), wqe_ends(16) {
        for (std::uint32_t i = 0; i < count; ++i) buffer[i * size + size - 1] = 0xf0;
        ring = {buffer.data(), count, size, 0x77, doorbell_record};
        queue = mlx5::CompletionQueue(ring, start);
        producer = start;
        for (std::uint32_t i = 0; i < 16; ++i) {
            wr_ids[i] = 1000 + i;
            wqe_ends[i] = i + 1;
        }
        tracking = {wr_ids.data(), wqe_ends.data(), 16, 0};
        target.send = &tracking;
        target.send_wqe_count = 16;
    }

    // Writes the next CQE as hardware would: body, then op_own with this pass's owner bit.
    std::uint8_t* next(std::uint8_t opcode, std::uint32_t qpn, std::uint16_t wqe_counter, std::uint8_t wqe_opcode = 0x08) {
        std::uint8_t* entry = buffer.data() + (producer & (ring.cqe_count - 1)) * ring.cqe_size + ring.cqe_size - 64;
        std::memset(entry, 0, 63);
        mlx5::store_big32(entry + mlx5::kCqeSopDropQpn, static_cast<std::uint32_t>(wqe_opcode) << 24 | qpn);
        mlx5::store_big16(entry + mlx5::kCqeWqeCounter, wqe_counter);
        entry[63] = static_cast<std::uint8_t>(opcode << 4 | ((producer / ring.cqe_count) & 1));
        ++producer;
        return entry;
    }

    std::uint32_t poll(mlx5::Completion* out, std::uint32_t capacity) {
        return queue.poll(out, capacity, [this](std::uint32_t qpn, std::uint32_t) {
            return qpn == 0x1234 ? &target : static_cast<mlx5::CompletionTarget*>(nullptr);
        });
    }

    std::vector<std::uint8_t> buffer;
    std::uint32_t doorbell_record[2] = {0, 0};
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    mlx5::SendQueueTracking tracking;
    mlx5::CompletionTarget target;
    mlx5::CompletionQueueRing ring;
    mlx5::CompletionQueue queue;
    std::uint32_t producer = 0;
};

}  // namespace

TEST_CASE("the owner bit is honoured over many passes of the ring") {
    Fixture fixture(8);
    mlx5::Completion completions[8];
    CHECK(fixture.poll(completions, 8) == 0);  // a fresh CQ is empty
    for (std::uint32_t pass = 0; pass < 10; ++pass) {
        for (std::uint32_t i = 0; i < 5; ++i) fixture.next(mlx5::kCqeRequester, 0x1234, static_cast<std::uint16_t>(i));
        CHECK(fixture.poll(completions, 8) == 5);
        CHECK(completions[4].wr_id == 1004);
        CHECK(fixture.poll(completions, 8) == 0);  // stale entries of the last pass are not taken again
        CHECK(mlx5::big_to_host32(fixture.doorbell_record[0]) == fixture.queue.consumer_index());
    }
    CHECK(fixture.queue.consumer_index() == 50);
}

TEST_CASE("128-byte CQEs: the mlx5_cqe64 is the second half") {
    Fixture fixture(4, 128);
    std::uint8_t* cqe = fixture.next(mlx5::kCqeRequester, 0x1234, 3, mlx5::kOpcodeRdmaRead);
    mlx5::store_big32(cqe + mlx5::kCqeByteCount, 4096);
    mlx5::Completion completion;
    REQUIRE(fixture.poll(&completion, 1) == 1);
    CHECK(completion.wr_id == 1003);
    CHECK(completion.opcode == mlx5::CompletionOpcode::rdma_read);
    CHECK(completion.byte_len == 4096);
    CHECK(fixture.tracking.consumer_index == 4);  // retired up to and including WQE 3
}

TEST_CASE("every error syndrome maps to its verbs status; unknown ones to general error") {
    const std::pair<std::uint8_t, mlx5::CompletionStatus> table[] = {
        {0x01, mlx5::CompletionStatus::local_length_error},       {0x02, mlx5::CompletionStatus::local_qp_operation_error},
        {0x04, mlx5::CompletionStatus::local_protection_error},   {0x05, mlx5::CompletionStatus::work_request_flushed},
        {0x06, mlx5::CompletionStatus::memory_window_bind_error}, {0x10, mlx5::CompletionStatus::bad_response},
        {0x11, mlx5::CompletionStatus::local_access_error},       {0x12, mlx5::CompletionStatus::remote_invalid_request},
        {0x13, mlx5::CompletionStatus::remote_access_error},      {0x14, mlx5::CompletionStatus::remote_operation_error},
        {0x15, mlx5::CompletionStatus::transport_retry_exceeded}, {0x16, mlx5::CompletionStatus::rnr_retry_exceeded},
        {0x22, mlx5::CompletionStatus::remote_aborted},           {0x07, mlx5::CompletionStatus::general_error},
        {0xff, mlx5::CompletionStatus::general_error}};
    Fixture fixture(32);
    for (auto [syndrome, status] : table) {
        std::uint8_t* cqe = fixture.next(mlx5::kCqeRequesterError, 0x1234, 2);
        cqe[mlx5::kCqeSyndrome] = syndrome;
        cqe[mlx5::kCqeVendorSyndrome] = 0x42;
        mlx5::Completion completion;
        REQUIRE(fixture.poll(&completion, 1) == 1);
        CHECK(completion.status == status);
        CHECK(completion.syndrome == syndrome);
        CHECK(completion.vendor_error == 0x42);
        CHECK(completion.wr_id == 1002);
        CHECK(std::string(mlx5::to_string(completion.status)) != "unknown status");
    }
}

TEST_CASE("a CQE for an unknown QP is consumed and reported, not fatal") {
    Fixture fixture(8);
    fixture.next(mlx5::kCqeRequester, 0x999, 0);
    fixture.next(mlx5::kCqeRequester, 0x1234, 1);
    mlx5::Completion completions[2];
    REQUIRE(fixture.poll(completions, 2) == 2);
    CHECK(completions[0].status == mlx5::CompletionStatus::general_error);
    CHECK(completions[0].qp_num == 0x999);
    CHECK(completions[1].status == mlx5::CompletionStatus::success);
}

TEST_CASE("the consumer index in the doorbell record is 24 bits") {
    Fixture fixture(8, 64, 0xfffffe);
    mlx5::Completion completion;
    for (int i = 0; i < 3; ++i) {
        fixture.next(mlx5::kCqeRequester, 0x1234, 0);
        REQUIRE(fixture.poll(&completion, 1) == 1);
    }
    CHECK(fixture.queue.consumer_index() == 0x1000001);
    CHECK(mlx5::big_to_host32(fixture.doorbell_record[0]) == 1);
}

TEST_CASE("a CQE with inline-scattered data is refused: scatter-to-CQE is disabled at creation") {
    Fixture fixture(8);
    std::uint8_t* cqe = fixture.next(mlx5::kCqeRequester, 0x1234, 0, mlx5::kOpcodeRdmaRead);
    cqe[63] |= mlx5::kCqeFormatInlineScatter32 << 2;
    mlx5::Completion completion;
    REQUIRE(fixture.poll(&completion, 1) == 1);
    CHECK(completion.status == mlx5::CompletionStatus::local_qp_operation_error);
}
