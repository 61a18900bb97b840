// CompletionQueue over CQEs written here by hand: the owner bit across several passes of the
// ring, 128-byte entries, every syndrome, an unknown QP, and the 24-bit consumer index; the arm's
// bytes and sequence number, and the peek at the next entry.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "transport/mlx5/completion_queue.hpp"

namespace mlx5 = rdmachan::mlx5;

namespace {

struct Fixture {
    explicit Fixture(std::uint32_t count = 8, std::uint32_t size = 64, std::uint32_t start = 0)
        : buffer(count * size, 0), wr_ids(16), wqe_ends(16) {
        for (std::uint32_t i = 0; i < count; ++i) buffer[i * size + size - 1] = 0xf0;
        ring = {buffer.data(), count, size, 0x77, doorbell_record, uar};
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
    alignas(64) std::uint8_t uar[64] = {};  // the UAR page up to the CQ doorbell register
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

TEST_CASE(
    "random mixes of send completions over two QPs, polled in random batches, decode as one by "
    "one") {
    // Requester CQEs of every send opcode (and an unknown one), error CQEs and CQEs of an
    // unknown QP, interleaved over two QPs, over many passes of 64- and 128-byte rings: the
    // poller's per-QP and per-opcode shortcuts must give what each CQE says on its own.
    struct Kind {
        std::uint8_t cqe_opcode;
        std::uint8_t wqe_opcode;
        mlx5::CompletionStatus status;
        mlx5::CompletionOpcode opcode;
        std::uint8_t flags;
    };
    const Kind kinds[] = {
        {mlx5::kCqeRequester, mlx5::kOpcodeRdmaWrite, mlx5::CompletionStatus::success,
         mlx5::CompletionOpcode::rdma_write, 0},
        {mlx5::kCqeRequester, mlx5::kOpcodeRdmaWriteImmediate, mlx5::CompletionStatus::success,
         mlx5::CompletionOpcode::rdma_write, mlx5::kCompletionWithImmediate},
        {mlx5::kCqeRequester, mlx5::kOpcodeSend, mlx5::CompletionStatus::success,
         mlx5::CompletionOpcode::send, 0},
        {mlx5::kCqeRequester, mlx5::kOpcodeSendImmediate, mlx5::CompletionStatus::success,
         mlx5::CompletionOpcode::send, mlx5::kCompletionWithImmediate},
        {mlx5::kCqeRequester, mlx5::kOpcodeRdmaRead, mlx5::CompletionStatus::success,
         mlx5::CompletionOpcode::rdma_read, 0},
        {mlx5::kCqeRequester, mlx5::kOpcodeAtomicCompareAndSwap, mlx5::CompletionStatus::success,
         mlx5::CompletionOpcode::atomic_compare_and_swap, 0},
        {mlx5::kCqeRequester, mlx5::kOpcodeAtomicFetchAndAdd, mlx5::CompletionStatus::success,
         mlx5::CompletionOpcode::atomic_fetch_and_add, 0},
        {mlx5::kCqeRequester, 0x33, mlx5::CompletionStatus::general_error,
         mlx5::CompletionOpcode::send, 0},
        {mlx5::kCqeRequesterError, mlx5::kOpcodeRdmaWrite,
         mlx5::CompletionStatus::remote_access_error, mlx5::CompletionOpcode::send, 0},
    };
    for (const std::uint32_t cqe_size : {64u, 128u}) {
        CAPTURE(cqe_size);
        Fixture fixture(32, cqe_size, 0xfffff0);  // the 24-bit consumer index wraps too
        std::vector<std::uint64_t> other_wr_ids(16);
        std::vector<std::uint32_t> other_wqe_ends(16);
        for (std::uint32_t i = 0; i < 16; ++i) {
            other_wr_ids[i] = 5000 + i;
            other_wqe_ends[i] = 100 + i;
        }
        mlx5::SendQueueTracking other_tracking{other_wr_ids.data(), other_wqe_ends.data(), 0, 0};
        mlx5::CompletionTarget other;
        other.send = &other_tracking;
        other.send_wqe_count = 16;
        const auto resolve = [&](std::uint32_t qpn, std::uint32_t) -> mlx5::CompletionTarget* {
            if (qpn == 0x1234) return &fixture.target;
            if (qpn == 0xabcdef) return &other;
            return nullptr;
        };
        struct Written {
            std::uint32_t qpn;
            std::uint16_t counter;
            const Kind* kind;
            std::uint32_t byte_count;
        };
        std::vector<Written> pending;
        std::uint32_t seed = 12345;
        const auto random = [&seed] {
            seed = seed * 1103515245u + 12345u;
            return seed >> 8;
        };
        std::uint32_t checked = 0;
        for (int round = 0; round < 400; ++round) {
            // Up to the free entries: runs of one kind and QP, and single changes.
            const std::uint32_t room = 32 - static_cast<std::uint32_t>(pending.size());
            const std::uint32_t count = room == 0 ? 0 : random() % (room + 1);
            for (std::uint32_t i = 0; i < count; ++i) {
                const std::uint32_t qp_choice = random() % 8;
                const std::uint32_t qpn = qp_choice < 4 ? 0x1234 : qp_choice < 7 ? 0xabcdef : 0x777;
                const Kind* kind =
                    random() % 3 == 0 ? &kinds[random() % std::size(kinds)] : &kinds[0];
                const std::uint16_t counter = static_cast<std::uint16_t>(random());
                std::uint8_t* cqe = fixture.next(kind->cqe_opcode, qpn, counter, kind->wqe_opcode);
                const std::uint32_t byte_count = random();
                mlx5::store_big32(cqe + mlx5::kCqeByteCount, byte_count);
                if (kind->cqe_opcode == mlx5::kCqeRequesterError)
                    cqe[mlx5::kCqeSyndrome] = mlx5::kSyndromeRemoteAccess;
                pending.push_back({qpn, counter, kind, byte_count});
            }
            const std::uint32_t capacity = 1 + random() % 20;
            mlx5::Completion completions[20];
            for (mlx5::Completion& completion : completions)
                std::memset(static_cast<void*>(&completion), 0xa5, sizeof completion);
            const std::uint32_t polled = fixture.queue.poll(completions, capacity, resolve);
            REQUIRE(polled == std::min<std::size_t>(capacity, pending.size()));
            for (std::uint32_t i = 0; i < polled; ++i) {
                CAPTURE(checked);
                const Written& written = pending[i];
                const mlx5::Completion& completion = completions[i];
                CHECK(completion.qp_num == written.qpn);
                CHECK(!completion.is_receive);
                if (written.qpn == 0x777) {
                    CHECK(completion.wr_id == 0);
                    CHECK(completion.status == mlx5::CompletionStatus::general_error);
                    continue;
                }
                const std::uint32_t slot = written.counter & 15;
                const bool first_qp = written.qpn == 0x1234;
                CHECK(completion.wr_id == (first_qp ? 1000u : 5000u) + slot);
                CHECK(completion.status == written.kind->status);
                if (written.kind->status == mlx5::CompletionStatus::success) {
                    CHECK(completion.opcode == written.kind->opcode);
                    CHECK(completion.flags == written.kind->flags);
                    const std::uint32_t byte_len =
                        written.kind->wqe_opcode == mlx5::kOpcodeRdmaRead ? written.byte_count
                        : written.kind->opcode == mlx5::CompletionOpcode::atomic_compare_and_swap ||
                                written.kind->opcode == mlx5::CompletionOpcode::atomic_fetch_and_add
                            ? 8u
                            : 0u;
                    CHECK(completion.byte_len == byte_len);
                    CHECK(completion.vendor_error == 0);
                    CHECK(completion.syndrome == 0);
                }
                ++checked;
            }
            // The tracking of each QP was retired to the last of its CQEs in the batch.
            for (const bool first_qp : {true, false}) {
                for (std::uint32_t i = polled; i-- > 0;) {
                    if (pending[i].qpn != (first_qp ? 0x1234u : 0xabcdefu)) continue;
                    const std::uint32_t slot = pending[i].counter & 15;
                    CHECK((first_qp ? fixture.tracking.consumer_index
                                    : other_tracking.consumer_index) ==
                          (first_qp ? slot + 1 : 100 + slot));
                    break;
                }
            }
            pending.erase(pending.begin(), pending.begin() + polled);
            CHECK(mlx5::big_to_host32(fixture.doorbell_record[0]) ==
                  (fixture.queue.consumer_index() & 0xffffff));
        }
        CHECK(checked > 2000);
    }
}

namespace {

// The arm word as the doorbell record holds it, and the 8 bytes at the CQ doorbell register.
std::vector<std::uint8_t> arm_record(const Fixture& fixture) {
    const auto* bytes =
        reinterpret_cast<const std::uint8_t*>(&fixture.doorbell_record[mlx5::kCqArm]);
    return {bytes, bytes + 4};
}
std::vector<std::uint8_t> arm_register(const Fixture& fixture) {
    return {fixture.uar + 0x20, fixture.uar + 0x28};
}

}  // namespace

// Expected bytes written out by hand from libmlx5's mlx5_arm_cq (cq.c): sn << 28 | command |
// ci, big-endian, in the record; that word then the CQN, big-endian, in the register.
TEST_CASE(
    "arm writes the arm word to the doorbell record and word and CQN to the register, big-endian") {
    Fixture fixture(8, 64, 0xabcdef);
    std::memset(fixture.uar, 0x5a, sizeof fixture.uar);
    fixture.doorbell_record[mlx5::kCqSetConsumerIndex] = 0x12345678;
    fixture.queue.arm(false);
    CHECK(arm_record(fixture) == std::vector<std::uint8_t>{0x00, 0xab, 0xcd, 0xef});
    CHECK(arm_register(fixture) ==
          std::vector<std::uint8_t>{0x00, 0xab, 0xcd, 0xef, 0x00, 0x00, 0x00, 0x77});
    fixture.queue.arm(true);
    CHECK(arm_record(fixture) == std::vector<std::uint8_t>{0x01, 0xab, 0xcd, 0xef});
    CHECK(arm_register(fixture) ==
          std::vector<std::uint8_t>{0x01, 0xab, 0xcd, 0xef, 0x00, 0x00, 0x00, 0x77});
    // Nothing else: the consumer-index word and the rest of the page are as they were.
    CHECK(fixture.doorbell_record[mlx5::kCqSetConsumerIndex] == 0x12345678);
    for (std::size_t i = 0; i < sizeof fixture.uar; ++i)
        if (i < 0x20 || i >= 0x28) CHECK(fixture.uar[i] == 0x5a);
    CHECK(fixture.queue.arm_sequence() == 0);  // arming again is not an event
}

TEST_CASE("the arm's sequence number advances once per event and wraps after four") {
    Fixture fixture(8, 64, 0x000102);
    const std::uint8_t next_byte0[] = {0x00, 0x10, 0x20, 0x30, 0x00, 0x10, 0x20, 0x30, 0x00, 0x10};
    const std::uint8_t solicited_byte0[] = {0x01, 0x11, 0x21, 0x31, 0x01,
                                            0x11, 0x21, 0x31, 0x01, 0x11};
    for (std::uint32_t events = 0; events < 10; ++events) {
        CAPTURE(events);
        CHECK(fixture.queue.arm_sequence() == events % 4);
        fixture.queue.arm(false);
        CHECK(arm_record(fixture) ==
              std::vector<std::uint8_t>{next_byte0[events], 0x00, 0x01, 0x02});
        CHECK(arm_register(fixture)[0] == next_byte0[events]);
        fixture.queue.arm(true);
        CHECK(arm_record(fixture) ==
              std::vector<std::uint8_t>{solicited_byte0[events], 0x00, 0x01, 0x02});
        CHECK(arm_register(fixture) == std::vector<std::uint8_t>{solicited_byte0[events], 0x00,
                                                                 0x01, 0x02, 0x00, 0x00, 0x00,
                                                                 0x77});
        fixture.queue.event_received();
    }
}

TEST_CASE("the arm carries the consumer index the polls reached, in 24 bits") {
    Fixture fixture(8, 64, 0xfffffe);
    mlx5::Completion completion;
    for (int i = 0; i < 3; ++i) {
        fixture.next(mlx5::kCqeRequester, 0x1234, 0);
        REQUIRE(fixture.poll(&completion, 1) == 1);
    }
    REQUIRE(fixture.queue.consumer_index() == 0x1000001);
    fixture.queue.event_received();
    fixture.queue.arm(true);
    CHECK(arm_record(fixture) == std::vector<std::uint8_t>{0x11, 0x00, 0x00, 0x01});
    CHECK(arm_register(fixture) ==
          std::vector<std::uint8_t>{0x11, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x77});
}

TEST_CASE("completion_waiting says whether the next entry is software's, without consuming it") {
    Fixture fixture(8);
    mlx5::Completion completions[8];
    CHECK(!fixture.queue.completion_waiting());  // a fresh CQ: every entry invalid
    fixture.next(mlx5::kCqeRequester, 0x1234, 0);
    CHECK(fixture.queue.completion_waiting());
    CHECK(fixture.queue.completion_waiting());  // asking twice consumes nothing
    CHECK(fixture.queue.consumer_index() == 0);
    REQUIRE(fixture.poll(completions, 8) == 1);
    CHECK(!fixture.queue.completion_waiting());
    // A full ring: all eight entries software's.
    for (std::uint32_t i = 0; i < 8; ++i)
        fixture.next(mlx5::kCqeRequester, 0x1234, static_cast<std::uint16_t>(i));
    CHECK(fixture.queue.completion_waiting());
    REQUIRE(fixture.poll(completions, 7) == 7);
    CHECK(fixture.queue.completion_waiting());  // the last one, across the ring's end
    REQUIRE(fixture.poll(completions, 8) == 1);
    // Wrapped: every entry holds a CQE of the last pass, whose owner bit is now hardware's.
    CHECK(fixture.queue.consumer_index() == 9);
    CHECK(!fixture.queue.completion_waiting());
    fixture.next(mlx5::kCqeRequesterError, 0x1234, 0);  // any CQE software owns, errors too
    CHECK(fixture.queue.completion_waiting());
    REQUIRE(fixture.poll(completions, 8) == 1);
    // The owner bit of this pass, but opcode "invalid": not software's.
    std::uint8_t* cqe = fixture.next(mlx5::kCqeInvalid, 0x1234, 0);
    CHECK(!fixture.queue.completion_waiting());
    cqe[mlx5::kCqeOpOwn] =
        static_cast<std::uint8_t>(mlx5::kCqeResponderSend << 4 | (cqe[mlx5::kCqeOpOwn] & 1));
    CHECK(fixture.queue.completion_waiting());
    // 128-byte entries: the owner byte is the last of the entry.
    Fixture large(4, 128, 6);
    CHECK(!large.queue.completion_waiting());
    large.next(mlx5::kCqeRequester, 0x1234, 0);
    CHECK(large.queue.completion_waiting());
}
