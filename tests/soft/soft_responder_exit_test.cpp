// A responder process that dies right after a message arrived (responder.cpp: the answer leaves
// before the CQE). A NIC's ACK leaves whatever the process does next; the software device's is
// sent by a thread of the process, so it must be on its way before the application can see the
// CQE and exit. The responder runs in a child process held between its answer and its CQE
// (soft::hold_responder_completions) and is killed there; the sender, this process, must then
// complete its send successfully, not with transport retry exceeded. Zero-hop is off: the
// request path is the one that answers.
#include <doctest/doctest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>

#include "tests/soft/child_endpoint.hpp"
#include "tests/soft/scoped_environment.hpp"
#include "tests/soft/soft_dc_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::ChildProcess;
using rdmachan::test::DcInitiatorEndpoint;
using rdmachan::test::DcTargetAddress;
using rdmachan::test::DcTargetEndpoint;
using rdmachan::test::Environment;
using rdmachan::test::SoftEndpoint;

namespace {

constexpr std::uint32_t kMessageBytes = 64;

// In the child, once its receive is posted: from now on its device stops after each answer that
// consumed a receive, and says 'h' on the pipe to the parent when it does.
void hold_after_answers(int to_parent) { soft::hold_responder_completions(std::chrono::seconds(60), to_parent); }

// Waits for the child to stop between its answer and its CQE, kills it there, and returns the
// sender's completion.
template <typename Sender>
std::optional<mlx5::Completion> kill_after_answer(ChildProcess& responder, Sender& sender) {
    char held = 0;
    REQUIRE_MESSAGE(rdmachan::test::read_all(responder.from_child, &held, 1, 10), "the responder never stopped after an answer");
    REQUIRE(held == 'h');
    responder.kill();
    CHECK(responder.wait(10) == ChildProcess::ended_by(SIGKILL));
    return sender.wait_send(std::chrono::seconds(20));
}

[[noreturn]] void reliable_connected_responder(int from_parent, int to_parent) {
    SoftEndpoint endpoint(soft::Device::open());
    if (endpoint.post_receive(7, 0, kMessageBytes) != mlx5::PostResult::ok) ::_exit(100);
    if (!rdmachan::test::connect_to_parent(endpoint, from_parent, to_parent)) ::_exit(101);
    hold_after_answers(to_parent);
    if (!rdmachan::test::tell_parent_ready(to_parent)) ::_exit(102);
    char never = 0;
    (void)rdmachan::test::read_all(from_parent, &never, 1, 60);
    ::_exit(103);  // killed before: reaching here means the parent gave up
}

[[noreturn]] void dc_target_responder(int from_parent, int to_parent) {
    DcTargetEndpoint target(soft::Device::open());
    if (target.post_receive(7, 0, kMessageBytes) != mlx5::PostResult::ok) ::_exit(100);
    const DcTargetAddress mine = target.address();
    if (!rdmachan::test::write_all(to_parent, &mine, sizeof mine)) ::_exit(101);
    hold_after_answers(to_parent);
    if (!rdmachan::test::tell_parent_ready(to_parent)) ::_exit(102);
    char never = 0;
    (void)rdmachan::test::read_all(from_parent, &never, 1, 60);
    ::_exit(103);
}

}  // namespace

TEST_CASE("RC: a responder killed right after answering a send: the sender's send succeeds") {
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "0");
    auto responder = ChildProcess::start("the responder", reliable_connected_responder);
    SoftEndpoint sender(soft::Device::open());
    rdmachan::test::connect_to_child(*responder, sender);
    const mlx5::ScatterGatherElement source = sender.local(0, kMessageBytes);
    const mlx5::SendWorkRequest send = rdmachan::test::send_request(1, &source, 1, mlx5::SendOpcode::send);
    REQUIRE(sender.post(&send, 1) == mlx5::PostResult::ok);
    const auto completion = kill_after_answer(*responder, sender);
    REQUIRE_MESSAGE(completion.has_value(), "no completion for the send");
    CHECK(completion->wr_id == 1);
    CHECK(completion->status == mlx5::CompletionStatus::success);
}

TEST_CASE("DC: a DCT's process killed right after answering a send: the DCI's send succeeds") {
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "0");
    auto responder = ChildProcess::start("the DCT process", dc_target_responder);
    const auto to = responder->receive<DcTargetAddress>("its DCT's address");
    REQUIRE(responder->receive<char>("'ready'") == 'r');
    DcInitiatorEndpoint sender(soft::Device::open());
    const mlx5::ScatterGatherElement source = sender.local(0, kMessageBytes);
    REQUIRE(sender.post(rdmachan::test::dc_request(mlx5::SendOpcode::send, 1, &source), to) == mlx5::PostResult::ok);
    const auto completion = kill_after_answer(*responder, sender);
    REQUIRE_MESSAGE(completion.has_value(), "no completion for the send");
    CHECK(completion->wr_id == 1);
    CHECK(completion->status == mlx5::CompletionStatus::success);
}
