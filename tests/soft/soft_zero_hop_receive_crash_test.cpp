// A sender killed inside the target's receive lock (published_table.hpp's receive
// journal): a zero-hop send whose process dies between taking the lock and letting it go leaves
// the target's receive either still posted or completed exactly once, never consumed with no
// completion. The sender runs in a child process held at one step under the lock
// (soft::hold_zero_hop_receives) and is killed there; the target, this process, must then see:
//   - before the receive was consumed: no completion, and the receive still posted (moving the
//     QP to ERR flushes it);
//   - after it was consumed, or with the CQE visible but the CQ's producer index not yet moved:
//     one successful completion with every byte of the message, and the next CQE in the next slot
//     (the flush of the receive after it).
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "tests/soft/child_process.hpp"
#include "tests/soft/eventually.hpp"
#include "tests/soft/scoped_environment.hpp"
#include "tests/soft/soft_dc_endpoint.hpp"
#include "tests/soft/soft_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::ChildProcess;
using rdmachan::test::complete;
using rdmachan::test::EndpointOptions;
using rdmachan::test::Environment;
using rdmachan::test::eventually;
using rdmachan::test::read_all;
using rdmachan::test::send_request;
using rdmachan::test::settle_path;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_all;

namespace {

constexpr std::uint32_t kMessageBytes = 4096;

std::uint8_t message_byte(std::uint32_t index) { return static_cast<std::uint8_t>(index * 7 + 1); }

EndpointOptions arena_endpoint() {
    EndpointOptions options;
    options.allocated = true;  // zero-hop receives need both sides' bytes in their arenas
    return options;
}

// The sender: connects to the target's QP, settles the path, then sends one message of
// kMessageBytes that stops at `step` under the target's receive lock; says 'p' just before
// posting, and 'h' once it stops there. It is killed there; reaching the end means the send did
// not go zero-hop.
[[noreturn]] void held_sender(int from_parent, int to_parent, soft::ZeroHopReceiveStep step) {
    Address target{};
    if (!read_all(from_parent, &target, sizeof target)) ::_exit(100);
    auto device = soft::Device::open();
    SoftEndpoint endpoint(device, arena_endpoint());
    const Address mine = endpoint.address();
    if (!write_all(to_parent, &mine, sizeof mine)) ::_exit(101);
    endpoint.connect(target);
    char connected = 0;
    if (!read_all(from_parent, &connected, 1)) ::_exit(102);
    if (!settle_path(endpoint, target)) ::_exit(103);
    for (std::uint32_t b = 0; b < kMessageBytes; ++b) endpoint.buffer()[b] = message_byte(b);
    soft::hold_zero_hop_receives(step, std::chrono::seconds(60), to_parent);
    if (!write_all(to_parent, "p", 1)) ::_exit(104);
    const mlx5::ScatterGatherElement source = endpoint.local(0, kMessageBytes);
    const mlx5::SendWorkRequest send = send_request(1, &source, 1, mlx5::SendOpcode::send);
    if (endpoint.post(&send, 1) != mlx5::PostResult::ok) ::_exit(105);
    (void)endpoint.wait_send(std::chrono::seconds(20));
    ::_exit(106);
}

// Kills the sender once it says it stopped at its step, holding the target device's receive
// lock; its connection closes and its process has exited, so the device takes the lock over by
// itself, with nothing of this process asking for it.
void kill_while_holding_the_lock(ChildProcess& sender, soft::Device& device) {
    char held = 0;
    REQUIRE_MESSAGE(read_all(sender.from_child, &held, 1, 10), "the sender never stopped under the receive lock (its send did not go zero-hop)");
    REQUIRE(held == 'h');
    REQUIRE(device.receive_lock_holder() == static_cast<std::uint32_t>(sender.pid));
    sender.kill();
    CHECK(sender.wait(10) == ChildProcess::ended_by(SIGKILL));
    // The takeover is counted while the device still holds the lock it took (it finishes the
    // dead sender's journal under it), so both are waited for: counted, then let go.
    REQUIRE(eventually([&] { return device.receive_lock_takeovers() == 1 && device.receive_lock_holder() == 0; }));
}

void kill_sender_at(soft::ZeroHopReceiveStep step, bool expect_completion) {
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "1");
    auto sender = ChildProcess::start("the sender", [step](int from_parent, int to_parent) { held_sender(from_parent, to_parent, step); });
    auto device = soft::Device::open();
    SoftEndpoint target(device, arena_endpoint());
    std::memset(target.buffer(), 0, 3 * kMessageBytes);
    REQUIRE(target.post_receive(41, 0, kMessageBytes) == mlx5::PostResult::ok);
    REQUIRE(target.post_receive(42, 2 * kMessageBytes, kMessageBytes) == mlx5::PostResult::ok);
    sender->send(target.address(), "the target's address");
    const Address remote = sender->receive<Address>("its address");
    target.connect(remote);
    sender->send('g', "the go-ahead");
    REQUIRE(sender->receive<char>("the word that it posts") == 'p');

    kill_while_holding_the_lock(*sender, *device);

    if (expect_completion) {
        const auto completion = target.wait_receive(std::chrono::seconds(5));
        REQUIRE_MESSAGE(completion.has_value(), "the consumed receive got no completion");
        CHECK(completion->wr_id == 41);
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->opcode == mlx5::CompletionOpcode::receive);
        CHECK(completion->byte_len == kMessageBytes);
        soft::acquire_remote_writes();
        std::uint32_t wrong = 0;
        for (std::uint32_t b = 0; b < kMessageBytes; ++b) wrong += target.buffer()[b] != message_byte(b);
        CHECK(wrong == 0);
    } else {
        CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(200)).has_value());
    }
    // What is still posted is flushed, in order, each CQE in the slot after the last.
    target.queue_pair().modify_to_error();
    if (!expect_completion) {
        const auto flushed = target.wait_receive(std::chrono::seconds(5));
        REQUIRE_MESSAGE(flushed.has_value(), "the receive the sender had not consumed was not flushed");
        CHECK(flushed->wr_id == 41);
        CHECK(flushed->status == mlx5::CompletionStatus::work_request_flushed);
    }
    const auto next = target.wait_receive(std::chrono::seconds(5));
    REQUIRE_MESSAGE(next.has_value(), "the second receive's flush was not seen");
    CHECK(next->wr_id == 42);
    CHECK(next->status == mlx5::CompletionStatus::work_request_flushed);
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(200)).has_value());
}

}  // namespace

TEST_CASE("zero-hop receive: a sender killed under the receive lock before consuming the receive leaves it posted") {
    kill_sender_at(soft::ZeroHopReceiveStep::journal_written, false);
}

TEST_CASE("zero-hop receive: a sender killed under the receive lock after consuming the receive: the target completes it") {
    kill_sender_at(soft::ZeroHopReceiveStep::receive_consumed, true);
}

TEST_CASE("zero-hop receive: a sender killed with its CQE visible but the producer index not moved: completed once") {
    kill_sender_at(soft::ZeroHopReceiveStep::completion_visible, true);
}

// The same for a DCI's send into a same-host DCT's SRQ, which is consumed under the lock too: the
// consumption word (the next WQE and the count, one word) says whether the dead sender consumed
// the WQE. Not consumed, the WQE is the one the next message fills; consumed, it completes once
// and the next message fills the WQE after it.
namespace {

[[noreturn]] void held_dc_sender(int from_parent, int to_parent, soft::ZeroHopReceiveStep step) {
    rdmachan::test::DcTargetAddress target{};
    if (!read_all(from_parent, &target, sizeof target)) ::_exit(100);
    rdmachan::test::DcInitiatorEndpoint endpoint(soft::Device::open(), 17, 1 << 20, true);
    // Settles the path to the target's device (the first request takes the request path).
    const mlx5::ScatterGatherElement settle = endpoint.local(8192, 8);
    if (endpoint.post(rdmachan::test::dc_request(mlx5::SendOpcode::rdma_write, 1, &settle, target.buffer_addr + 900000, target.rkey),
                      target) != mlx5::PostResult::ok) {
        ::_exit(101);
    }
    const auto settled = endpoint.wait_send(std::chrono::seconds(20));
    if (!settled || settled->status != mlx5::CompletionStatus::success) ::_exit(102);
    for (std::uint32_t b = 0; b < kMessageBytes; ++b) endpoint.buffer()[b] = message_byte(b);
    soft::hold_zero_hop_receives(step, std::chrono::seconds(60), to_parent);
    if (!write_all(to_parent, "p", 1)) ::_exit(104);
    const mlx5::ScatterGatherElement source = endpoint.local(0, kMessageBytes);
    if (endpoint.post(rdmachan::test::dc_request(mlx5::SendOpcode::send, 2, &source), target) != mlx5::PostResult::ok) ::_exit(105);
    (void)endpoint.wait_send(std::chrono::seconds(20));
    ::_exit(106);
}

void kill_dc_sender_at(soft::ZeroHopReceiveStep step, bool expect_completion) {
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "1");
    auto sender = ChildProcess::start("the DC sender", [step](int from_parent, int to_parent) { held_dc_sender(from_parent, to_parent, step); });
    auto device = soft::Device::open();
    rdmachan::test::DcTargetEndpoint target(device, rdmachan::test::kDcKey, 1 << 20, 1, true);
    std::memset(target.buffer(), 0, 3 * kMessageBytes);
    REQUIRE(target.post_receive(41, 0, kMessageBytes) == mlx5::PostResult::ok);
    REQUIRE(target.post_receive(42, 2 * kMessageBytes, kMessageBytes) == mlx5::PostResult::ok);
    sender->send(target.address(), "the DCT's address");
    REQUIRE(sender->receive<char>("the word that it posts") == 'p');
    kill_while_holding_the_lock(*sender, *device);

    std::uint64_t next_wr_id = 41;
    if (expect_completion) {
        const auto completion = target.wait_receive(std::chrono::seconds(5));
        REQUIRE_MESSAGE(completion.has_value(), "the consumed WQE got no completion");
        CHECK(completion->wr_id == 41);
        CHECK(completion->status == mlx5::CompletionStatus::success);
        CHECK(completion->byte_len == kMessageBytes);
        soft::acquire_remote_writes();
        std::uint32_t wrong = 0;
        for (std::uint32_t b = 0; b < kMessageBytes; ++b) wrong += target.buffer()[b] != message_byte(b);
        CHECK(wrong == 0);
        next_wr_id = 42;
    } else {
        CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(200)).has_value());
    }
    // The next message, from a sender of this process, fills the WQE the dead one left.
    rdmachan::test::DcInitiatorEndpoint next(soft::Device::open(), 17, 1 << 20, true);
    std::memset(next.buffer(), 0x5a, 64);
    const mlx5::ScatterGatherElement element = next.local(0, 64);
    REQUIRE(complete(next, rdmachan::test::dc_request(mlx5::SendOpcode::send, 7, &element), target.address()).status ==
            mlx5::CompletionStatus::success);
    const auto received = target.wait_receive(std::chrono::seconds(5));
    REQUIRE_MESSAGE(received.has_value(), "the next message was not received");
    CHECK(received->wr_id == next_wr_id);
    CHECK(received->byte_len == 64);
    CHECK_FALSE(target.wait_receive(std::chrono::milliseconds(100)).has_value());
}

}  // namespace

TEST_CASE("zero-hop DC receive: a sender killed under the receive lock before consuming the SRQ's WQE leaves it posted") {
    kill_dc_sender_at(soft::ZeroHopReceiveStep::journal_written, false);
}

TEST_CASE("zero-hop DC receive: a sender killed after consuming the SRQ's WQE: the target completes it once") {
    kill_dc_sender_at(soft::ZeroHopReceiveStep::receive_consumed, true);
}

TEST_CASE("zero-hop DC receive: a sender killed with its CQE visible but the producer index not moved: completed once") {
    kill_dc_sender_at(soft::ZeroHopReceiveStep::completion_visible, true);
}
