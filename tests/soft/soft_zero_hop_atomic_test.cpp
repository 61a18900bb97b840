// Zero-hop atomics on the software device's same-host path: a compare-and-swap or fetch-and-add
// on a word of the target's arena is executed by the initiator's thread with the CPU's atomic
// instruction on the shared mapping. Here: every result (the original value returned, the word
// left behind, the CQE) equals the request path's (RDMACHAN_SOFT_ZERO_HOP=0); a refused atomic
// gives the request path's CQE and leaves the word untouched; and zero-hop atomics stay atomic
// with respect to the target device's own, run at once on the same word.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "tests/soft/device_pair.hpp"
#include "tests/soft/scoped_environment.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::DevicePair;
using rdmachan::test::allocated_pair_settings;
using rdmachan::test::EndpointOptions;
using rdmachan::test::run_signaled;
using rdmachan::test::settle_path;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

constexpr std::uint64_t kWord = 4096;    // the target's word, in its buffer
constexpr std::uint64_t kResult = 8192;  // where the initiator receives the original value

mlx5::SendWorkRequest atomic_request(mlx5::SendOpcode opcode, const mlx5::ScatterGatherElement* result, std::uint64_t remote_addr,
                                     std::uint32_t rkey, std::uint64_t compare_add, std::uint64_t swap = 0) {
    mlx5::SendWorkRequest request = write_request(77, result, remote_addr, rkey);
    request.opcode = opcode;
    request.compare_add = compare_add;
    request.swap = swap;
    return request;
}

struct AtomicOutcome {
    mlx5::Completion completion;
    std::uint64_t returned = 0;  // what landed in the initiator's result word
    std::uint64_t word = 0;      // the target's word afterwards
    std::uint64_t zero_hop = 0;  // zero-hop atomics the initiator's device counted
};

// Runs one atomic on a fresh pair, the target's word starting at `initial`; `remote_offset` and
// `rkey_delta` make refused cases (a misaligned word, a key that does not exist).
AtomicOutcome run_atomic(const char* zero_hop, mlx5::SendOpcode opcode, std::uint64_t initial, std::uint64_t compare_add,
                   std::uint64_t swap, std::uint64_t remote_offset = kWord, std::uint32_t rkey_delta = 0) {
    DevicePair pair(allocated_pair_settings(zero_hop));
    REQUIRE(settle_path(pair.initiator, pair.remote));
    std::memcpy(pair.target.buffer() + kWord, &initial, 8);
    std::memset(pair.initiator.buffer() + kResult, 0xee, 8);
    const mlx5::ScatterGatherElement result = pair.initiator.local(kResult, 8);
    AtomicOutcome outcome;
    outcome.completion = run_signaled(pair.initiator, atomic_request(opcode, &result, pair.remote.buffer_addr + remote_offset,
                                                                     pair.remote.rkey + rkey_delta, compare_add, swap));
    std::memcpy(&outcome.returned, pair.initiator.buffer() + kResult, 8);
    std::memcpy(&outcome.word, pair.target.buffer() + kWord, 8);
    outcome.zero_hop = pair.initiator_device->zero_hop_atomics();
    return outcome;
}

void check_same(const AtomicOutcome& zero_hop, const AtomicOutcome& request_path) {
    CHECK(zero_hop.completion.status == request_path.completion.status);
    CHECK(zero_hop.completion.opcode == request_path.completion.opcode);
    CHECK(zero_hop.completion.byte_len == request_path.completion.byte_len);
    CHECK(zero_hop.completion.wr_id == request_path.completion.wr_id);
    CHECK(zero_hop.completion.vendor_error == request_path.completion.vendor_error);
    CHECK(zero_hop.completion.syndrome == request_path.completion.syndrome);
    CHECK(zero_hop.completion.flags == request_path.completion.flags);
    CHECK(zero_hop.returned == request_path.returned);
    CHECK(zero_hop.word == request_path.word);
    CHECK(request_path.zero_hop == 0);
}

}  // namespace

TEST_CASE("zero-hop atomics: compare-and-swap (taken and not) and fetch-and-add give what the request path gives") {
    struct Case {
        const char* name;
        mlx5::SendOpcode opcode;
        std::uint64_t initial, compare_add, swap, word_after;
    };
    const Case cases[] = {
        {"compare-and-swap, equal", mlx5::SendOpcode::atomic_compare_and_swap, 0x1122334455667788ull, 0x1122334455667788ull,
         0x0badc0de0badc0deull, 0x0badc0de0badc0deull},
        {"compare-and-swap, different", mlx5::SendOpcode::atomic_compare_and_swap, 0x1122334455667788ull, 1, 2,
         0x1122334455667788ull},
        {"fetch-and-add, carrying", mlx5::SendOpcode::atomic_fetch_and_add, 0x00000000ffffffffull, 0x0000000100000001ull, 0,
         0x0000000200000000ull},
    };
    for (const Case& c : cases) {
        CAPTURE(c.name);
        const AtomicOutcome zero_hop = run_atomic(nullptr, c.opcode, c.initial, c.compare_add, c.swap);
        const AtomicOutcome request_path = run_atomic("0", c.opcode, c.initial, c.compare_add, c.swap);
        CHECK(zero_hop.completion.status == mlx5::CompletionStatus::success);
        CHECK(zero_hop.returned == c.initial);
        CHECK(zero_hop.word == c.word_after);
        CHECK(zero_hop.zero_hop == 1);
        check_same(zero_hop, request_path);
    }
}

TEST_CASE("zero-hop atomics refused: a misaligned word or an unknown key gives the request path's CQE, the word untouched") {
    SUBCASE("misaligned") {
        const AtomicOutcome zero_hop = run_atomic(nullptr, mlx5::SendOpcode::atomic_fetch_and_add, 5, 1, 0, kWord + 4);
        const AtomicOutcome request_path = run_atomic("0", mlx5::SendOpcode::atomic_fetch_and_add, 5, 1, 0, kWord + 4);
        CHECK(zero_hop.completion.status != mlx5::CompletionStatus::success);
        CHECK(zero_hop.word == 5);
        CHECK(zero_hop.zero_hop == 0);
        check_same(zero_hop, request_path);
    }
    SUBCASE("unknown key") {
        const AtomicOutcome zero_hop = run_atomic(nullptr, mlx5::SendOpcode::atomic_compare_and_swap, 5, 5, 6, kWord, 0x100);
        const AtomicOutcome request_path = run_atomic("0", mlx5::SendOpcode::atomic_compare_and_swap, 5, 5, 6, kWord, 0x100);
        CHECK(zero_hop.completion.status == mlx5::CompletionStatus::remote_access_error);
        CHECK(zero_hop.word == 5);
        CHECK(zero_hop.zero_hop == 0);
        check_same(zero_hop, request_path);
    }
}

TEST_CASE("zero-hop fetch-and-adds and the target device's own, on one word at once: every original value once, the sum exact") {
    constexpr std::uint64_t kEach = 2000;
    EndpointOptions allocated;
    allocated.allocated = true;
    auto target_device = soft::Device::open();
    std::shared_ptr<soft::Device> zero_hop_device = soft::Device::open();
    std::shared_ptr<soft::Device> request_path_device;
    {
        rdmachan::test::Environment off("RDMACHAN_SOFT_ZERO_HOP", "0");
        request_path_device = soft::Device::open();
    }
    // Two QPs of the target in one protection domain, so both initiators may use the key of the
    // first one's buffer: the word is the same memory for both.
    SoftEndpoint target_for_zero_hop(target_device, allocated);
    SoftEndpoint target_for_requests(target_device, allocated, target_for_zero_hop.domain_pointer());
    SoftEndpoint zero_hop(zero_hop_device, allocated);
    SoftEndpoint requests(request_path_device, allocated);
    zero_hop.connect(target_for_zero_hop.address());
    target_for_zero_hop.connect(zero_hop.address());
    requests.connect(target_for_requests.address());
    target_for_requests.connect(requests.address());
    const Address word = target_for_zero_hop.address();
    REQUIRE(settle_path(zero_hop, word));
    REQUIRE(settle_path(requests, word));

    // The request path's adds are far slower (a round trip through both progress threads each):
    // the zero-hop side keeps adding until the other side is done, so the two overlap throughout.
    std::atomic<bool> requests_done{false};
    auto add_ones = [&](SoftEndpoint& initiator, std::vector<std::uint64_t>& originals, bool until_requests_done) {
        const mlx5::ScatterGatherElement result = initiator.local(kResult, 8);
        for (std::uint64_t i = 0; until_requests_done ? !requests_done.load() || i < kEach : i < kEach; ++i) {
            const mlx5::Completion completion = run_signaled(
                initiator, atomic_request(mlx5::SendOpcode::atomic_fetch_and_add, &result, word.buffer_addr + kWord, word.rkey, 1));
            if (completion.status != mlx5::CompletionStatus::success) return;
            std::uint64_t original = 0;
            std::memcpy(&original, initiator.buffer() + kResult, 8);
            originals.push_back(original);
        }
    };
    std::vector<std::uint64_t> by_zero_hop, by_requests;
    std::thread other([&] {
        add_ones(requests, by_requests, false);
        requests_done.store(true);
    });
    add_ones(zero_hop, by_zero_hop, true);
    other.join();

    REQUIRE(by_zero_hop.size() >= kEach);
    REQUIRE(by_requests.size() == kEach);
    const std::uint64_t total = by_zero_hop.size() + by_requests.size();
    std::uint64_t final_word = 0;
    std::memcpy(&final_word, target_for_zero_hop.buffer() + kWord, 8);
    CHECK(final_word == total);
    std::vector<std::uint32_t> seen(total, 0);
    std::uint64_t out_of_range = 0;
    for (const auto* originals : {&by_zero_hop, &by_requests}) {
        for (const std::uint64_t original : *originals) {
            if (original < seen.size()) ++seen[original];
            else ++out_of_range;
        }
    }
    CHECK(out_of_range == 0);
    std::uint64_t not_once = 0;
    for (const std::uint32_t count : seen) not_once += count != 1;
    CHECK(not_once == 0);
    // Every one of this side's went zero-hop, none of the other's.
    CHECK(zero_hop_device->zero_hop_atomics() == by_zero_hop.size());
    CHECK(request_path_device->zero_hop_atomics() == 0);
}
