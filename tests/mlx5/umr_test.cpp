// UMR WQEs from the encoder: key configurations with list and interleaved layouts, LOCAL_INV,
// the fence the next WQE owes, refusals that write nothing, and the completion opcode. The
// expected bytes are derived by hand from rdma-core 44 providers/mlx5/qp.c (the functions are
// named at each derivation); no rdma-core code or output is used.
#include <doctest/doctest.h>

#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <string>
#include <string_view>
#include <vector>

#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/send_queue.hpp"

namespace mlx5 = rdmachan::mlx5;

namespace {

struct Fixture {
    explicit Fixture(std::uint32_t start = 0, std::uint32_t max_inline_data = 256)
        : memory(kWqeCount * 64, 0xcc), registers(1024, 0), wr_ids(kWqeCount), wqe_ends(kWqeCount),
          umr_opcodes(kWqeCount, 0xff) {
        ring.buffer = memory.data();
        ring.wqe_count = kWqeCount;
        ring.qpn = 0x4321;
        ring.doorbell_record = doorbell_record;
        ring.blueflame_register = registers.data();
        ring.blueflame_size = 256;
        config.max_sge = 4;
        config.max_inline_data = max_inline_data;
        queue = mlx5::SendQueue(
            ring, {wr_ids.data(), wqe_ends.data(), start, start, umr_opcodes.data()}, config);
    }
    // The ds*16 bytes of the WQE at `index`, read in ring order (across the ring end).
    std::string wqe_hex(std::uint32_t index, std::uint32_t bytes) const {
        static const char* const kDigits = "0123456789abcdef";
        std::string text;
        for (std::uint32_t i = 0; i < bytes; ++i) {
            const std::uint8_t byte = memory[(index * 64 + i) % memory.size()];
            text += kDigits[byte >> 4];
            text += kDigits[byte & 15];
        }
        return text;
    }
    mlx5::PostResult post(const mlx5::SendWorkRequest& request) {
        return queue.post(&request, 1, nullptr);
    }

    static constexpr std::uint32_t kWqeCount = 8;
    std::vector<std::uint8_t> memory;
    std::vector<std::uint8_t> registers;
    std::vector<std::uint64_t> wr_ids;
    std::vector<std::uint32_t> wqe_ends;
    std::vector<std::uint8_t> umr_opcodes;
    std::uint32_t doorbell_record[2] = {0, 0};
    mlx5::SendQueueRing ring;
    mlx5::SendQueueConfig config;
    mlx5::SendQueue queue;
};

std::string zeros(std::uint32_t bytes) { return std::string(bytes * 2, '0'); }

// The pieces of a hex string in order (appended, not added with operator+, whose inlined
// copies GCC 12 reports as out of bounds: see the root CMakeLists.txt).
std::string join(std::initializer_list<std::string_view> pieces) {
    std::string text;
    for (std::string_view piece : pieces) text.append(piece);
    return text;
}

const mlx5::ScatterGatherElement kList[2] = {{0x00007f0000001000ull, 0x100, 0x00000a01},
                                             {0x00007f0000005000ull, 0x40, 0x00000a02}};

mlx5::MemoryKeyLayout list_layout() {
    mlx5::MemoryKeyLayout layout;
    layout.mkey = 0x00123405;  // index 0x1234, tag 0x05
    layout.max_entries = 4;
    layout.access = mlx5::kMemoryKeyLocalWrite | mlx5::kMemoryKeyRemoteRead |
                    mlx5::kMemoryKeyRemoteWrite;
    layout.num_entries = 2;
    layout.list = kList;
    return layout;
}

mlx5::SendWorkRequest configure(const mlx5::MemoryKeyLayout& layout) {
    mlx5::SendWorkRequest request;
    request.wr_id = 0x77;
    request.opcode = mlx5::SendOpcode::configure_memory_key;
    request.flags = mlx5::kSendSignaled | mlx5::kSendInline;
    request.layout = &layout;
    return request;
}

// mlx5dv_wr_mr_list = mlx5_send_wr_mkey_configure + set_mkey_access_flags + set_mkey_layout:
//  ctrl: opcode 0x25 (MLX5_OPCODE_UMR), index, qpn 0x4321, ds = 1 (ctrl) + 3 (umr ctrl) +
//        4 (mkey context) + align(2 * 16, 64) / 16 = 12; fm_ce_se 0x08 (signaled);
//        imm = the mkey 0x00123405.
//  UMR ctrl: flags 0x80 (INLINE); klm_octowords = align(xlat 32, 64) / 16 = 4; mkey_mask =
//        FREE (1<<29) | MKEY (1<<13) | the four access bits (1<<18..21) | LEN (1<<0)
//        = 0x203c2001; 32 reserved bytes zero.
//  mkey context (memset to zero first): access_flags (byte 2) = LOCAL_WRITE 0x08 |
//        REMOTE_READ 0x10 | REMOTE_WRITE 0x20 = 0x38; qpn_mkey = 0xffffff00 | tag 0x05;
//        len (bytes 24-31) = 0x100 + 0x40 = 0x140.
//  translation (umr_sg_list_create): per SGE byte_count, lkey, addr; padded with zero entries
//        to align(2, 4) = 4 entries.
std::string expected_list_wqe(std::uint16_t index) {
    char ctrl[33];
    std::snprintf(ctrl, sizeof ctrl, "00%04x25", index);
    return join({ctrl, "0043210c" "00000008" "00123405",
                 "80000000" "00040000" "00000000203c2001", zeros(32), "00003800" "ffffff05",
                 zeros(16), "0000000000000140", zeros(32),
                 "00000100" "00000a01" "00007f0000001000", "00000040" "00000a02" "00007f0000005000",
                 zeros(32)});
}

}  // namespace

TEST_CASE("a list layout is written as mlx5dv_wr_mr_list writes it") {
    Fixture fixture;
    const mlx5::MemoryKeyLayout layout = list_layout();
    REQUIRE(fixture.post(configure(layout)) == mlx5::PostResult::ok);
    CHECK(fixture.queue.tracking().producer_index == 3);  // 12 units: 3 WQEBBs
    CHECK(fixture.wqe_hex(0, 192) == expected_list_wqe(0));
    CHECK(fixture.umr_opcodes[0] ==
          static_cast<std::uint8_t>(mlx5::CompletionOpcode::memory_key_configured));
    // 12 units fit the 256-byte BlueFlame buffer, and a configuration is an inline WQE.
    CHECK(std::memcmp(fixture.registers.data(), fixture.memory.data(), 192) == 0);
}

TEST_CASE("a UMR WQE that reaches the ring end continues at its start") {
    // Starting at WQEBB 6 of 8: ctrl and UMR ctrl at 6, the mkey context at 7, the translation
    // entries at 0 (set_mkey_layout takes them from cur_data, wrapped at qend).
    Fixture fixture(6);
    const mlx5::MemoryKeyLayout layout = list_layout();
    REQUIRE(fixture.post(configure(layout)) == mlx5::PostResult::ok);
    CHECK(fixture.queue.tracking().producer_index == 9);
    CHECK(fixture.wqe_hex(6, 192) == expected_list_wqe(6));
    CHECK(fixture.wqe_ends[6] == 9);
}

TEST_CASE("an interleaved layout is written as mlx5dv_wr_mr_interleaved writes it") {
    Fixture fixture;
    const mlx5::InterleavedEntry entries[2] = {{0x00007f0000002000ull, 8, 24, 0x00000b01},
                                               {0x00007f0000009000ull, 4, 0, 0x00000b02}};
    mlx5::MemoryKeyLayout layout;
    layout.mkey = 0x00abcd00;
    layout.max_entries = 4;
    layout.access = mlx5::kMemoryKeyRemoteRead;
    layout.repeat_count = 3;
    layout.num_entries = 2;
    layout.interleaved = entries;
    mlx5::SendWorkRequest request = configure(layout);
    request.flags = mlx5::kSendInline;  // unsignaled
    REQUIRE(fixture.post(request) == mlx5::PostResult::ok);
    // umr_strided_seg_create: repeat block (byte_count 8 + 4 = 12, op 0x400, repeat_count 3,
    // num_ent 2), then per entry stride = bytes_count + bytes_skip, byte_count, memkey, va;
    // padded to align(2 + 1, 4) = 4 entries. xlat = 3 * 16 = 48 -> klm_octowords 4, ds 12.
    // The length is 12 * 3 = 36 = 0x24; access REMOTE_READ 0x10; fm_ce_se 0.
    const std::string expected =
        join({"00000025" "0043210c" "00000000" "00abcd00", "80000000" "00040000" "00000000203c2001",
              zeros(32), "00001000" "ffffff00", zeros(16), "0000000000000024", zeros(32),
              "0000000c" "00000400" "00000003" "00000002", "00200008" "00000b01" "00007f0000002000",
              "00040004" "00000b02" "00007f0000009000", zeros(16)});
    CHECK(fixture.wqe_hex(0, 192) == expected);
}

TEST_CASE("LOCAL_INV owes the next request the initiator small fence, on the fast path too") {
    Fixture fixture;
    mlx5::SendWorkRequest invalidate;
    invalidate.wr_id = 1;
    invalidate.opcode = mlx5::SendOpcode::local_invalidate;
    invalidate.flags = mlx5::kSendSignaled;
    invalidate.immediate = 0x00abcd01;
    REQUIRE(fixture.post(invalidate) == mlx5::PostResult::ok);
    // set_bind_wr for an empty type-2 bind: UMR ctrl flags TRNSLATION_OFFSET 0x10 | INLINE
    // 0x80 | CHECK_QPN 0x08 = 0x98, klm_octowords get_klm_octo(0) = 0, mask FREE | MKEY | QPN
    // = 0x20006000; mkey context free 0x40, qpn_mkey 0xffffff00; ds 8; imm the rkey.
    CHECK(fixture.wqe_hex(0, 128) ==
          join({"00000025" "00432108" "00000008" "00abcd01" "98000000" "00000000" "0000000020006000",
                zeros(32), "40000000" "ffffff00", zeros(56)}));
    CHECK(fixture.umr_opcodes[0] ==
          static_cast<std::uint8_t>(mlx5::CompletionOpcode::local_invalidate));

    // A plain write in the next post: the fast path would take it, but the fence is owed
    // (mlx5_post_send: fence = next_fence from qp->fm_cache).
    const mlx5::ScatterGatherElement element{0x1000, 64, 0x55};
    mlx5::SendWorkRequest write;
    write.opcode = mlx5::SendOpcode::rdma_write;
    write.flags = mlx5::kSendSignaled;
    write.sg_list = &element;
    write.num_sge = 1;
    REQUIRE(fixture.post(write) == mlx5::PostResult::ok);
    CHECK(fixture.memory[2 * 64 + mlx5::kCtrlFmCeSe] == 0x28);
    // Paid once: the next write has no fence.
    REQUIRE(fixture.post(write) == mlx5::PostResult::ok);
    CHECK(fixture.memory[3 * 64 + mlx5::kCtrlFmCeSe] == 0x08);

    // IBV_SEND_FENCE replaces the small fence rather than adding to it.
    REQUIRE(fixture.post(invalidate) == mlx5::PostResult::ok);
    write.flags = mlx5::kSendSignaled | mlx5::kSendFence;
    REQUIRE(fixture.post(write) == mlx5::PostResult::ok);
    CHECK(fixture.memory[6 * 64 + mlx5::kCtrlFmCeSe] == 0x88);
}

TEST_CASE("a key configuration also owes the fence, within one batch") {
    Fixture fixture;
    const mlx5::MemoryKeyLayout layout = list_layout();
    const mlx5::ScatterGatherElement element{0x1000, 64, 0x55};
    mlx5::SendWorkRequest batch[2] = {configure(layout), {}};
    batch[1].opcode = mlx5::SendOpcode::send;
    batch[1].sg_list = &element;
    batch[1].num_sge = 1;
    std::uint32_t posted = 0;
    REQUIRE(fixture.queue.post(batch, 2, &posted) == mlx5::PostResult::ok);
    CHECK(posted == 2);
    CHECK(fixture.memory[3 * 64 + mlx5::kCtrlFmCeSe] == 0x20);
}

TEST_CASE("refused UMR requests write nothing and say why") {
    Fixture fixture;
    const std::vector<std::uint8_t> before = fixture.memory;
    mlx5::MemoryKeyLayout layout = list_layout();

    SUBCASE("without IBV_SEND_INLINE, as libmlx5 refuses it") {
        mlx5::SendWorkRequest request = configure(layout);
        request.flags = mlx5::kSendSignaled;
        CHECK(fixture.post(request) == mlx5::PostResult::invalid_request);
    }
    SUBCASE("more entries than the key was created for") {
        layout.max_entries = 1;
        CHECK(fixture.post(configure(layout)) == mlx5::PostResult::too_many_entries);
    }
    SUBCASE("more entries than max_inline_data carries") {
        // (256 + 4) / 16 = 16 list entries; 17 is one too many even for a larger key.
        std::vector<mlx5::ScatterGatherElement> many(17, kList[0]);
        layout.list = many.data();
        layout.num_entries = 17;
        layout.max_entries = 64;
        CHECK(fixture.post(configure(layout)) == mlx5::PostResult::too_many_entries);
        layout.num_entries = 16;
        CHECK(fixture.post(configure(layout)) == mlx5::PostResult::ok);
        return;
    }
    SUBCASE("an interleaved entry whose stride does not fit 16 bits") {
        const mlx5::InterleavedEntry entry{0x1000, 0x8000, 0x8000, 0x1};
        layout.list = nullptr;
        layout.interleaved = &entry;
        layout.num_entries = 1;
        CHECK(fixture.post(configure(layout)) == mlx5::PostResult::invalid_request);
    }
    SUBCASE("an interleaved layout has one entry fewer than a list (the repeat block)") {
        std::vector<mlx5::InterleavedEntry> entries(16, {0x1000, 8, 8, 0x1});
        layout.list = nullptr;
        layout.interleaved = entries.data();
        layout.num_entries = 16;
        layout.max_entries = 64;
        CHECK(fixture.post(configure(layout)) == mlx5::PostResult::too_many_entries);
    }
    SUBCASE("no layout") {
        mlx5::SendWorkRequest request = configure(layout);
        request.layout = nullptr;
        CHECK(fixture.post(request) == mlx5::PostResult::invalid_request);
    }
    CHECK(fixture.memory == before);
    CHECK(fixture.queue.tracking().producer_index == 0);
}

TEST_CASE("the largest layouts: entry bounds against max_inline_data and the 6-bit ds") {
    CHECK(mlx5::umr_max_entries(false, 256) == 16);
    CHECK(mlx5::umr_max_entries(true, 256) == 15);
    CHECK(mlx5::umr_max_entries(true, 8) == 0);
    // 1 + 3 + 4 units of headers, then 16 list entries = 16 units: ds 24, 6 WQEBBs.
    Fixture fixture(0, 256);
    std::vector<mlx5::ScatterGatherElement> many(16, kList[1]);
    mlx5::MemoryKeyLayout layout = list_layout();
    layout.list = many.data();
    layout.num_entries = 16;
    layout.max_entries = 16;
    REQUIRE(fixture.post(configure(layout)) == mlx5::PostResult::ok);
    CHECK(fixture.memory[7] == 24);
    CHECK(fixture.queue.tracking().producer_index == 6);
}

TEST_CASE("a UMR CQE reports LOCAL_INV or the key configuration, as recorded at post time") {
    Fixture send;
    const mlx5::MemoryKeyLayout layout = list_layout();
    mlx5::SendWorkRequest invalidate;
    invalidate.opcode = mlx5::SendOpcode::local_invalidate;
    invalidate.wr_id = 5;
    REQUIRE(send.post(configure(layout)) == mlx5::PostResult::ok);  // WQEBBs 0-2
    REQUIRE(send.post(invalidate) == mlx5::PostResult::ok);         // WQEBBs 3-4

    std::vector<std::uint8_t> cq_buffer(8 * 64, 0);
    for (std::uint32_t i = 0; i < 8; ++i) cq_buffer[i * 64 + 63] = 0xf0;
    std::uint32_t cq_doorbell[2] = {0, 0};
    mlx5::CompletionQueue cq({cq_buffer.data(), 8, 64, 0x9, cq_doorbell}, 0);
    auto write_cqe = [&](std::uint32_t slot, std::uint16_t wqe_counter) {
        std::uint8_t* entry = cq_buffer.data() + slot * 64;
        std::memset(entry, 0, 63);
        mlx5::store_big32(entry + mlx5::kCqeSopDropQpn, std::uint32_t{mlx5::kOpcodeUmr} << 24 | 0x4321);
        mlx5::store_big16(entry + mlx5::kCqeWqeCounter, wqe_counter);
        entry[63] = 0;  // requester, owner bit of the first pass
    };
    write_cqe(0, 0);
    write_cqe(1, 3);
    mlx5::CompletionTarget target;
    target.send = &send.queue.tracking();
    target.send_wqe_count = Fixture::kWqeCount;
    mlx5::Completion completions[4];
    const std::uint32_t polled = cq.poll(completions, 4, [&](std::uint32_t qpn, std::uint32_t) {
        return qpn == 0x4321 ? &target : static_cast<mlx5::CompletionTarget*>(nullptr);
    });
    REQUIRE(polled == 2);
    CHECK(completions[0].status == mlx5::CompletionStatus::success);
    CHECK(completions[0].wr_id == 0x77);
    CHECK(completions[0].opcode == mlx5::CompletionOpcode::memory_key_configured);
    CHECK(static_cast<int>(completions[0].opcode) == 135);  // MLX5DV_WC_UMR = IBV_WC_DRIVER1
    CHECK(completions[1].wr_id == 5);
    CHECK(completions[1].opcode == mlx5::CompletionOpcode::local_invalidate);
    CHECK(send.queue.tracking().consumer_index == 5);
}
