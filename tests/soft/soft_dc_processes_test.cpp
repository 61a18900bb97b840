// DC between two processes (fork), each with its own software device: the child hosts a DCT
// and checks what arrives; the parent's DCI reaches it by the number, key and address the
// child sent through a pipe, exactly what a real peer would publish.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>

#include "tests/soft/child_process.hpp"
#include "tests/soft/soft_dc_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::ChildProcess;
using rdmachan::test::dc_request;
using rdmachan::test::DcInitiatorEndpoint;
using rdmachan::test::DcTargetAddress;
using rdmachan::test::DcTargetEndpoint;

namespace {

using rdmachan::test::read_all;
using rdmachan::test::write_all;

struct InitiatorIdentity {
    std::uint16_t lid;
    std::uint32_t qpn;
};

std::uint8_t pattern(std::uint32_t i) {
    return static_cast<std::uint8_t>(i * 13 + 5);
}

// The child: a DCT with one receive posted and a counter word. It expects a write, then a send
// with immediate from the parent's DCI, and exits with the number of mismatches (100+ for
// set-up failures).
[[noreturn]] void run_target(int from_parent, int to_parent) {
    int bad = 0;
    {
        DcTargetEndpoint target(soft::Device::open());
        const std::uint64_t counter = 7;
        std::memcpy(target.buffer() + 8192, &counter, 8);
        for (std::uint32_t i = 0; i < 512; ++i) target.buffer()[4096 + i] = pattern(i + 1);
        if (target.post_receive(0, 65536, 4096) != mlx5::PostResult::ok) ::_exit(100);
        const DcTargetAddress mine = target.address();
        InitiatorIdentity parent{};
        if (!write_all(to_parent, &mine, sizeof mine) ||
            !read_all(from_parent, &parent, sizeof parent))
            ::_exit(101);
        const auto received = target.wait_receive(std::chrono::seconds(20));
        if (!received.has_value() || received->status != mlx5::CompletionStatus::success)
            ::_exit(102);
        bad += received->wr_id != 0;
        bad += received->immediate != 0xdc0000dcu;
        bad += received->src_qp != parent.qpn;
        bad += received->slid != parent.lid;
        bad += received->qp_num != mine.dctn;
        bad += received->byte_len != 300;
        for (std::uint32_t i = 0; i < 300; ++i) bad += target.buffer()[65536 + i] != pattern(i);
        // The write came before the send on the same DCI, so it is in place now.
        for (std::uint32_t i = 0; i < 1000; ++i) bad += target.buffer()[i] != pattern(i);
        char done = 0;
        if (!read_all(from_parent, &done, 1)) ::_exit(103);
        // The parent's "done" says the fetch-and-add completed: read the word as the device wrote
        // it.
        bad += __atomic_load_n(reinterpret_cast<const std::uint64_t*>(target.buffer() + 8192),
                               __ATOMIC_ACQUIRE) != 7 + 35;
    }
    ::_exit(bad > 99 ? 99 : bad);
}

}  // namespace

TEST_CASE(
    "a DCI in one process reaches a DCT in another: write, send with immediate, read, atomic") {
    auto child = ChildProcess::start("the DCT process", run_target);
    const auto to = child->receive<DcTargetAddress>("its DCT's address");
    DcInitiatorEndpoint initiator(soft::Device::open());
    child->send(InitiatorIdentity{initiator.lid(), initiator.initiator().qpn()}, "this DCI's identity");

    for (std::uint32_t i = 0; i < 1000; ++i) initiator.buffer()[i] = pattern(i);
    mlx5::ScatterGatherElement element = initiator.local(0, 1000);
    REQUIRE(initiator.post(
                dc_request(mlx5::SendOpcode::rdma_write, 1, &element, to.buffer_addr, to.rkey),
                to) == mlx5::PostResult::ok);
    element = initiator.local(0, 300);
    mlx5::SendWorkRequest send = dc_request(mlx5::SendOpcode::send_with_immediate, 2, &element);
    send.immediate = 0xdc0000dc;
    REQUIRE(initiator.post(send, to) == mlx5::PostResult::ok);
    const mlx5::ScatterGatherElement landing = initiator.local(100000, 512);
    REQUIRE(initiator.post(dc_request(mlx5::SendOpcode::rdma_read, 3, &landing,
                                      to.buffer_addr + 4096, to.rkey),
                           to) == mlx5::PostResult::ok);
    const mlx5::ScatterGatherElement original = initiator.local(200000, 8);
    mlx5::SendWorkRequest add = dc_request(mlx5::SendOpcode::atomic_fetch_and_add, 4, &original,
                                           to.buffer_addr + 8192, to.rkey);
    add.compare_add = 35;
    REQUIRE(initiator.post(add, to) == mlx5::PostResult::ok);
    for (std::uint64_t wr_id = 1; wr_id <= 4; ++wr_id) {
        const auto done = initiator.wait_send(std::chrono::seconds(20));
        REQUIRE(done.has_value());
        CHECK(done->status == mlx5::CompletionStatus::success);
        CHECK(done->wr_id == wr_id);
    }
    for (std::uint32_t i = 0; i < 512; ++i)
        REQUIRE(initiator.buffer()[100000 + i] == pattern(i + 1));
    std::uint64_t before = 0;
    std::memcpy(&before, initiator.buffer() + 200000, 8);
    CHECK(before == 7);
    child->send('d', "'done'");
    child->expect_exit(0, 30);  // the DCT process checked every byte and the counter
}
