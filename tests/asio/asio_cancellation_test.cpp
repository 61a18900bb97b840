// rdmachan::asio when a wait is given up: cancel(), per-operation cancellation slots (Boost 1.77
// and later), an AsyncChannel destroyed with operations pending, a device without completion
// events, and a completion nobody takes.
#include <doctest/doctest.h>

#include <cstring>
#include <memory>
#include <string>

#include "tests/asio/asio_test_support.hpp"
#include "transport/fault/fault_injection.hpp"
#if BOOST_VERSION >= 107700
#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/experimental/awaitable_operators.hpp>
#endif

using namespace rdmachan;
namespace net = boost::asio;
using rdmachan::asio::AsyncChannel;

namespace {

struct Outcome {
    bool done = false;
    boost::system::error_code error;
    std::optional<WorkResult> result;
    auto handler() {
        return [this](boost::system::error_code e, WorkResult r) {
            done = true;
            error = e;
            result.emplace(std::move(r));
        };
    }
};

struct AsyncPair {
    explicit AsyncPair(net::io_context& io, test::ChannelPair pair = test::connect_pair())
        : a(std::make_unique<AsyncChannel>(io, std::move(pair.a))), b(std::make_unique<AsyncChannel>(io, std::move(pair.b))) {
        a_region = a->channel().allocate_memory(4096);
        b_region = b->channel().allocate_memory(4096);
    }
    std::unique_ptr<AsyncChannel> a;
    std::unique_ptr<AsyncChannel> b;
    MemoryRegion a_region;
    MemoryRegion b_region;
};

void send_text(net::io_context& io, AsyncChannel& channel, const MemoryRegion& region, const char* text) {
    std::strcpy(static_cast<char*>(region.data()), text);
    Outcome sent;
    channel.async_send(region.slice(0, static_cast<std::uint32_t>(std::strlen(text) + 1)), sent.handler());
    REQUIRE(test::run_until(io, [&] { return sent.done; }));
    REQUIRE(sent.result->ok());
}

}  // namespace

TEST_CASE("cancel(): a pending receive gets operation_aborted at once; it stays posted and takes the next message; the channel goes on") {
    net::io_context io;
    AsyncPair pair(io);
    Outcome cancelled;
    pair.b->async_receive(pair.b_region.slice(0, 64), cancelled.handler());
    io.run_for(std::chrono::milliseconds(20));
    CHECK_FALSE(cancelled.done);
    pair.b->cancel();
    CHECK_FALSE(cancelled.done);  // the handler is posted, not run inside cancel()
    io.restart();
    io.run_for(std::chrono::seconds(2));
    CHECK(io.stopped());  // ran out of work: nothing is waited for once the only operation is cancelled
    REQUIRE(cancelled.done);
    CHECK(cancelled.error == net::error::operation_aborted);
    REQUIRE(cancelled.result.has_value());
    REQUIRE_FALSE(cancelled.result->ok());
    CHECK(cancelled.result->error().cancelled);
    CHECK(cancelled.result->error().operation == Operation::receive);
    CHECK(cancelled.result->error().peer == pair.b->channel().peer());
    CHECK(cancelled.result->error().message().find("cancelled") != std::string::npos);

    // The cancelled receive is still posted: the next message lands in its buffer (as on a NIC).
    Outcome next;
    pair.b->async_receive(pair.b_region.slice(64, 64), next.handler());
    send_text(io, *pair.a, pair.a_region, "first");
    send_text(io, *pair.a, pair.a_region, "second");
    REQUIRE(test::run_until(io, [&] { return next.done; }));
    CHECK_FALSE(next.error);
    REQUIRE(next.result->ok());
    CHECK(std::string(static_cast<char*>(pair.b_region.data())) == "first");
    CHECK(std::string(static_cast<char*>(pair.b_region.data()) + 64) == "second");
    CHECK(pair.b->channel().healthy());
}

TEST_CASE("cancellation slots (Boost 1.77 and later): terminal and partial give up the wait, total is ignored" *
          doctest::skip(!rdmachan::asio::kCancellationSlots)) {
#if BOOST_VERSION >= 107700
    net::io_context io;
    // Signals outlive the operations bound to them, the AsyncChannels included (also when a
    // check fails and the test ends early).
    net::cancellation_signal signals[3];
    Outcome outcomes[3];
    AsyncPair pair(io);
    for (int i = 0; i < 2; ++i) {
        const net::cancellation_type type = i == 0 ? net::cancellation_type::terminal : net::cancellation_type::partial;
        net::cancellation_signal& signal = signals[i];
        Outcome& outcome = outcomes[i];
        pair.b->async_receive(pair.b_region.slice(0, 64), net::bind_cancellation_slot(signal.slot(), outcome.handler()));
        io.restart();
        io.run_for(std::chrono::milliseconds(10));
        CHECK_FALSE(outcome.done);
        signal.emit(type);
        io.restart();
        io.run_for(std::chrono::milliseconds(200));  // a given-up wait completes at once
        REQUIRE(outcome.done);
        CHECK(outcome.error == net::error::operation_aborted);
        CHECK(outcome.result->error().cancelled);
    }
    // Both cancelled receives are still posted: two messages go to them.
    send_text(io, *pair.a, pair.a_region, "one");
    send_text(io, *pair.a, pair.a_region, "two");

    Outcome& kept = outcomes[2];
    pair.b->async_receive(pair.b_region.slice(64, 64), net::bind_cancellation_slot(signals[2].slot(), kept.handler()));
    signals[2].emit(net::cancellation_type::total);  // a posted receive cannot be undone
    io.restart();
    io.run_for(std::chrono::milliseconds(10));
    CHECK_FALSE(kept.done);
    send_text(io, *pair.a, pair.a_region, "three");
    REQUIRE(test::run_until(io, [&] { return kept.done; }));
    CHECK_FALSE(kept.error);
    REQUIRE(kept.result->ok());
    CHECK(std::string(static_cast<char*>(pair.b_region.data()) + 64) == "three");
#endif
}

TEST_CASE("cancellation slots (Boost 1.77 and later): co_await (receive || timer) gives up the receive when the timer wins" *
          doctest::skip(!rdmachan::asio::kCancellationSlots)) {
#if BOOST_VERSION >= 107700
    using namespace boost::asio::experimental::awaitable_operators;
    net::io_context io;
    AsyncPair pair(io);
    bool timed_out = false;
    bool received_after = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            net::steady_timer timer(io, std::chrono::milliseconds(20));
            auto first = co_await (pair.b->async_receive(pair.b_region.slice(0, 64), net::use_awaitable) ||
                                   timer.async_wait(net::use_awaitable));
            timed_out = first.index() == 1;
            // The given-up receive takes the next message; the one after comes to this receive.
            auto next = pair.b->async_receive(pair.b_region.slice(64, 64), net::use_awaitable);
            co_await pair.a->async_send(pair.a_region.slice(0, 8), net::use_awaitable);
            co_await pair.a->async_send(pair.a_region.slice(0, 8), net::use_awaitable);
            received_after = (co_await std::move(next)).ok();
        },
        net::detached);
    REQUIRE(test::run_until(io, [&] { return received_after; }));
    CHECK(timed_out);
#endif
}

TEST_CASE("destroying an AsyncChannel with operations pending: handlers get operation_aborted, nothing blocks") {
    net::io_context io;
    AsyncPair pair(io);  // a 10 s deadline: a destructor that waited for it would show
    Outcome first, second;
    pair.b->async_receive(pair.b_region.slice(0, 64), first.handler());
    pair.b->async_receive(pair.b_region.slice(64, 64), second.handler());
    io.run_for(std::chrono::milliseconds(10));
    const auto before = std::chrono::steady_clock::now();
    pair.b.reset();
    const auto took = std::chrono::steady_clock::now() - before;
    CHECK(took < std::chrono::seconds(2));
    CHECK_FALSE(first.done);  // posted to the io_context, not run inside the destructor
    io.restart();
    io.run();
    REQUIRE(first.done);
    REQUIRE(second.done);
    CHECK(first.error == net::error::operation_aborted);
    CHECK(second.error == net::error::operation_aborted);
    CHECK(first.result->error().cancelled);
}

TEST_CASE("destroying an AsyncChannel while a coroutine awaits it: the coroutine resumes with operation_aborted") {
    net::io_context io;
    AsyncPair pair(io);
    std::optional<boost::system::error_code> caught;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            try {
                co_await pair.b->async_receive(pair.b_region.slice(0, 64), net::use_awaitable);
            } catch (const boost::system::system_error& error) {
                caught = error.code();
            }
        },
        net::detached);
    net::steady_timer timer(io, std::chrono::milliseconds(10));
    timer.async_wait([&](boost::system::error_code) { pair.b.reset(); });
    io.run();
    REQUIRE(caught.has_value());
    CHECK(*caught == net::error::operation_aborted);
}

TEST_CASE("a device without completion events (native_handle -1): operations complete through the timer; "
          "destroying one whose completions are held fails its queue pair instead of waiting") {
    auto plan = std::make_shared<transport::FaultPlan>();
    transport::FaultInjection injection(plan);  // its completion queues give no events
    net::io_context io;
    AsyncPair pair(io);
    CHECK(pair.a->channel().native_handle() == -1);
    Outcome received, sent;
    pair.b->async_receive(pair.b_region.slice(0, 64), received.handler());
    pair.a->async_send(pair.a_region.slice(0, 8), sent.handler());
    REQUIRE(test::run_until(io, [&] { return received.done && sent.done; }));
    CHECK(received.result->ok());
    CHECK(sent.result->ok());

    plan->hold_until_error = true;  // no completion comes until a queue pair fails
    Outcome held;
    pair.a->async_write(pair.a_region.slice(0, 8), pair.b_region.remote(0, 8), held.handler());
    io.restart();
    io.run_for(std::chrono::milliseconds(20));
    CHECK_FALSE(held.done);
    const auto before = std::chrono::steady_clock::now();
    pair.a.reset();
    CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(2));
    CHECK(plan->moved_to_error);
    io.restart();
    io.run();
    REQUIRE(held.done);
    CHECK(held.error == net::error::operation_aborted);
}

TEST_CASE("a completion of the application's own left unpolled does not stall asynchronous operations") {
    net::io_context io;
    AsyncPair pair(io);
    // Its completion waits in b's send queue, where nobody polls: arm() keeps failing.
    PendingWork mine = pair.b->channel().post_write(pair.b_region.slice(0, 8), pair.a_region.remote(0, 8));
    Outcome received;
    pair.b->async_receive(pair.b_region.slice(64, 64), received.handler());  // polls only the receive queue
    io.run_for(std::chrono::milliseconds(20));
    CHECK_FALSE(received.done);
    send_text(io, *pair.a, pair.a_region, "late");
    REQUIRE(test::run_until(io, [&] { return received.done; }));
    CHECK(received.result->ok());
    const std::optional<WorkResult> taken = mine.poll();
    REQUIRE(taken.has_value());
    CHECK(taken->ok());
    io.restart();
    io.run_for(std::chrono::seconds(2));
    CHECK(io.stopped());  // ran out of work: nothing left to poll again
}
