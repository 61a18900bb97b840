// libmlx5's own post and poll, counted the way scripts/instruction_counts.sh counts rdmachan's:
// callgrind counts only the measured_* functions, each one call on the calling thread.
//
//   libmlx5_instruction_benchmark [--operations N]   run the measurements (under callgrind, or
//                                                    natively as a functional check)
//   libmlx5_instruction_benchmark --table OUT-FILE   print the table from the dumps of such a run
//   libmlx5_instruction_benchmark --totals OUT-FILE  print only each row's post + completion per
//                                                    write, on one line (for the API table)
//
// What runs is Debian's libibverbs and libmlx5 as installed (ibverbs-providers), not a build of
// ours: fake_uverbs.cpp stands in for the kernel, so they open "mlx5_0", create an RC queue pair
// and post into its ring as on a ConnectX. Nothing executes the WQEs: after each post this
// program writes the CQE a ConnectX writes for it (a requester CQE, format of CQE version 1,
// naming the QP by the user index libmlx5 gave it), then the counted ibv_poll_cq reads it.
// Checked on every operation: the post returned 0, advanced the send doorbell record by the
// WQEs it wrote and wrote its last WQE's control segment to a doorbell register; the poll
// returned one successful RDMA-write completion with the right wr_id.
//
// Rows, as in channel_instruction_benchmark: one signaled 4 KiB RDMA write (BlueFlame), and 16
// chained 4 KiB RDMA writes in one ibv_post_send, only the last signaled (one doorbell), whose
// one completion is polled; per write. libmlx5 runs with its defaults (its queue-pair and CQ
// spinlocks on; MLX5_SINGLE_THREADED unset), as users run it.
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <valgrind/callgrind.h>

#include <atomic>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "tests/mlx5/measured_function.hpp"
#include "tests/libmlx5/fake_device.hpp"
#include "tests/libmlx5/fake_uverbs.hpp"
#include "transport/mlx5/wqe_layout.hpp"

// verbs.h's macro form mixes two enumerations in one expression, which Clang refuses here; the
// function it wraps does the same.
#undef ibv_reg_mr

namespace {

using rdmachan::libmlx5_instructions::create_rts_queue_pair;
using rdmachan::libmlx5_instructions::fake_kernel;
using rdmachan::libmlx5_instructions::FakeMlx5;
using rdmachan::libmlx5_instructions::open_fake_mlx5;
using rdmachan::libmlx5_instructions::write_requester_cqe;
using rdmachan::libmlx5_instructions::FakeKernelState;

constexpr std::uint32_t kBatch = 16;
constexpr std::uint32_t kSlice = 4096;  // above max_inline_data, as in channel_instruction_benchmark
constexpr std::uint32_t kOpcodeRdmaWrite = 0x08;  // the WQE opcode a requester CQE repeats

MEASURED_FUNCTION int measured_post_send(ibv_qp* qp, ibv_send_wr* requests, ibv_send_wr** bad) {
    return ibv_post_send(qp, requests, bad);
}

MEASURED_FUNCTION int measured_poll_cq(ibv_cq* cq, ibv_wc* completion) { return ibv_poll_cq(cq, 1, completion); }

bool fail(const char* what, std::uint64_t at) {
    std::fprintf(stderr, "libmlx5_instruction_benchmark: %s (operation %llu)\n", what, static_cast<unsigned long long>(at));
    return false;
}

struct Device {
    ibv_context* context = nullptr;
    ibv_pd* pd = nullptr;
    ibv_mr* mr = nullptr;
    ibv_cq* cq = nullptr;
    ibv_qp* qp = nullptr;
    std::vector<std::uint8_t> memory = std::vector<std::uint8_t>(kBatch * kSlice);
    std::uint32_t posted = 0;     // WQEs posted: the send counter libmlx5 keeps
    std::uint32_t cqes = 0;       // CQEs written
};

bool open_device(Device& device) {
    std::string error;
    const FakeMlx5 mlx5 = open_fake_mlx5(256, error);
    if (!error.empty()) return fail(error.c_str(), 0);
    device.context = mlx5.context;
    device.pd = mlx5.pd;
    device.cq = mlx5.cq;
    device.mr = ibv_reg_mr(device.pd, device.memory.data(), device.memory.size(), IBV_ACCESS_LOCAL_WRITE);
    if (device.mr == nullptr) return fail("ibv_reg_mr failed", 0);
    ibv_qp_cap caps{};
    caps.max_send_wr = 128;
    caps.max_recv_wr = 1;
    caps.max_send_sge = 1;
    caps.max_recv_sge = 1;
    device.qp = create_rts_queue_pair(mlx5, caps, error);
    if (device.qp == nullptr) return fail(error.c_str(), 0);
    if (fake_kernel().qp_doorbell_record == 0) return fail("the fake kernel did not see the QP's doorbell record", 0);
    return true;
}

// The send counter libmlx5 wrote to the QP's doorbell record (big-endian, its second word).
std::uint32_t send_doorbell_record() {
    const auto* record = reinterpret_cast<const volatile std::uint32_t*>(fake_kernel().qp_doorbell_record);
    return ntohl(record[1]);
}

// How the doorbell for the WQE at `wqe_index` reached a register: libmlx5 writes the WQE's first
// 8 bytes (BlueFlame: the whole WQE) to a register of a UAR page it mapped, so some 8-byte word
// there is the control segment's first two words: the WQE index and opcode, the QPN and the
// WQE's size in 16-byte units (ctrl + remote address + one data segment: 3). BlueFlame when the
// remote address segment (`remote_addr`) follows it.
enum class Doorbell { none, doorbell, blueflame };
Doorbell doorbell_of(std::uint32_t wqe_index, std::uint64_t remote_addr) {
    const FakeKernelState& kernel = fake_kernel();
    const std::uint32_t words[2] = {htonl((wqe_index & 0xffff) << 8 | kOpcodeRdmaWrite), htonl(kernel.qpn << 8 | 3)};
    const std::uint32_t address[2] = {htonl(static_cast<std::uint32_t>(remote_addr >> 32)),
                                      htonl(static_cast<std::uint32_t>(remote_addr))};
    for (int page = 0; page < kernel.page_count; ++page) {
        const auto* bytes = static_cast<const std::uint8_t*>(kernel.pages[page]);
        for (std::uint64_t offset = 0; offset + 64 <= kernel.page_lengths[page]; offset += 8) {
            if (std::memcmp(bytes + offset, words, sizeof words) != 0) continue;
            return std::memcmp(bytes + offset + 16, address, sizeof address) == 0 ? Doorbell::blueflame : Doorbell::doorbell;
        }
    }
    return Doorbell::none;
}

// Posts whose WQE went by BlueFlame, by the number of writes they carried (1 or kBatch).
std::uint64_t blueflame_posts[kBatch + 1] = {};
std::uint64_t posts[kBatch + 1] = {};

void dump(const char* row, std::uint64_t writes) {
    char name[64];
    std::snprintf(name, sizeof name, "%s %llu", row, static_cast<unsigned long long>(writes));
    CALLGRIND_DUMP_STATS_AT(name);
}

// One operation of `writes` RDMA writes: posted (counted when `count_post`), its CQE written,
// polled (counted when `count_poll`), everything checked.
bool operation(Device& device, std::uint32_t writes, std::uint64_t at, bool count_post, bool count_poll) {
    ibv_sge elements[kBatch];
    ibv_send_wr requests[kBatch];
    for (std::uint32_t i = 0; i < writes; ++i) {
        elements[i] = {reinterpret_cast<std::uintptr_t>(device.memory.data()) + i * kSlice, kSlice, device.mr->lkey};
        requests[i] = {};
        requests[i].wr_id = at * kBatch + i;
        requests[i].next = i + 1 < writes ? &requests[i + 1] : nullptr;
        requests[i].sg_list = &elements[i];
        requests[i].num_sge = 1;
        requests[i].opcode = IBV_WR_RDMA_WRITE;
        requests[i].send_flags = i + 1 == writes ? IBV_SEND_SIGNALED : 0;
        requests[i].wr.rdma.remote_addr = 0x10000 + i * kSlice;
        requests[i].wr.rdma.rkey = 0x2000;
    }
    ibv_send_wr* bad = nullptr;
    const int posted = count_post ? measured_post_send(device.qp, requests, &bad) : ibv_post_send(device.qp, requests, &bad);
    if (posted != 0) return fail("ibv_post_send failed", at);
    device.posted += writes;
    if (send_doorbell_record() != (device.posted & 0xffff)) return fail("the send doorbell record is not the WQEs posted", at);
    const Doorbell doorbell = doorbell_of(device.posted - 1, requests[writes - 1].wr.rdma.remote_addr);
    if (doorbell == Doorbell::none) return fail("no register holds the last WQE's control segment", at);
    blueflame_posts[writes] += doorbell == Doorbell::blueflame;
    ++posts[writes];
    write_requester_cqe(device.cqes++, device.qp->qp_num, kOpcodeRdmaWrite, device.posted - 1, kSlice);
    ibv_wc completion{};
    const int polled = count_poll ? measured_poll_cq(device.cq, &completion) : ibv_poll_cq(device.cq, 1, &completion);
    if (polled != 1) return fail("ibv_poll_cq did not return the completion", at);
    if (completion.status != IBV_WC_SUCCESS || completion.opcode != IBV_WC_RDMA_WRITE ||
        completion.wr_id != at * kBatch + writes - 1 || completion.qp_num != device.qp->qp_num)
        return fail("the completion is not the last write's successful RDMA write", at);
    return true;
}

struct Row {
    const char* post;
    const char* poll;
    std::uint32_t writes;
    const char* label;
};

constexpr Row kRows[] = {
    {"libmlx5_post_write", "libmlx5_poll_write", 1, "ibv_post_send: one 4 KiB RDMA write, signaled"},
    {"libmlx5_post_batch", "libmlx5_poll_batch", kBatch, "ibv_post_send: 16 chained 4 KiB RDMA writes, the last signaled (per write)"},
};

int print_table(const std::string& out_file, bool totals_only) {
    std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> measured;  // row -> instructions, writes
    for (int part = 1;; ++part) {
        std::ifstream input(out_file + "." + std::to_string(part));
        if (!input) break;
        std::string line, row;
        std::uint64_t writes = 0, instructions = 0;
        bool have_total = false;
        while (std::getline(input, line)) {
            const std::string trigger = "desc: Trigger: Client Request: ";
            if (line.rfind(trigger, 0) == 0) std::istringstream(line.substr(trigger.size())) >> row >> writes;
            if (line.rfind("totals: ", 0) == 0) have_total = static_cast<bool>(std::istringstream(line.substr(8)) >> instructions);
        }
        if (!row.empty() && have_total && writes != 0) measured[row] = {instructions, writes};
    }
    if (measured.size() != 2 * std::size(kRows)) {
        std::fprintf(stderr, "libmlx5_instruction_benchmark: found %zu of %zu rows in %s.N\n", measured.size(),
                     2 * std::size(kRows), out_file.c_str());
        return 1;
    }
    if (!totals_only) {
        std::printf("| libmlx5 (Debian's, as installed) | post, to the doorbell | completion polled | post + completion |\n");
        std::printf("|---|---:|---:|---:|\n");
    }
    for (const Row& row : kRows) {
        const auto [post_instructions, post_writes] = measured[row.post];
        const auto [poll_instructions, poll_writes] = measured[row.poll];
        const double post = static_cast<double>(post_instructions) / static_cast<double>(post_writes);
        const double poll = static_cast<double>(poll_instructions) / static_cast<double>(poll_writes);
        if (totals_only) {
            std::printf("%s%.1f", &row == kRows ? "" : " ", post + poll);
        } else {
            std::printf("| %s | %.1f | %.1f | %.1f |\n", row.label, post, poll, post + poll);
        }
    }
    if (totals_only) {
        std::printf("\n");
        return 0;
    }
    std::printf("\ninstructions per write, counted over %llu writes per row on the calling thread only.\n",
                static_cast<unsigned long long>(measured[kRows[0].post].second));
    return 0;
}

}  // namespace

int main(int argc, char** argv) {
    std::uint64_t operations = 1000;
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--table") == 0 && i + 1 < argc) return print_table(argv[i + 1], false);
        if (std::strcmp(argv[i], "--totals") == 0 && i + 1 < argc) return print_table(argv[i + 1], true);
        if (std::strcmp(argv[i], "--operations") == 0 && i + 1 < argc) {
            operations = std::strtoull(argv[++i], nullptr, 10);
        } else {
            std::fprintf(stderr, "usage: %s [--operations N] | --table CALLGRIND-OUT-FILE | --totals CALLGRIND-OUT-FILE\n", argv[0]);
            return 2;
        }
    }
    if (operations == 0) {
        std::fprintf(stderr, "libmlx5_instruction_benchmark: --operations must be at least 1\n");
        return 2;
    }
    Device device;
    if (!open_device(device)) return 1;
    std::uint64_t at = 0;
    // Warm-up, uncounted: every path the counted calls take has run once.
    for (const Row& row : kRows)
        if (!operation(device, row.writes, at++, false, false)) return 1;
    CALLGRIND_ZERO_STATS;
    for (const Row& row : kRows) {
        for (std::uint64_t i = 0; i < operations; ++i)
            if (!operation(device, row.writes, at++, true, false)) return 1;
        dump(row.post, operations * row.writes);
        for (std::uint64_t i = 0; i < operations; ++i)
            if (!operation(device, row.writes, at++, false, true)) return 1;
        dump(row.poll, operations * row.writes);
    }
    std::printf("libmlx5_instruction_benchmark: %llu single writes and %llu 16-write chains posted and polled through "
                "libmlx5, every doorbell record, doorbell register and completion checked; by BlueFlame: %llu of %llu "
                "single writes, %llu of %llu chains%s\n",
                static_cast<unsigned long long>(operations), static_cast<unsigned long long>(operations),
                static_cast<unsigned long long>(blueflame_posts[1]), static_cast<unsigned long long>(posts[1]),
                static_cast<unsigned long long>(blueflame_posts[kBatch]), static_cast<unsigned long long>(posts[kBatch]),
                RUNNING_ON_VALGRIND ? "" : " (not under callgrind: nothing counted)");
    return 0;
}
