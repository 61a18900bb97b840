// rdmachan::asio with each kind of completion token, on connected pairs inside this process
// (software device): callbacks, use_future, use_awaitable coroutines, deferred; every operation
// kind; many channels on one io_context beside a TCP acceptor and a timer.
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <future>
#include <string>
#include <thread>

#include "tests/asio/asio_test_support.hpp"
#if BOOST_VERSION >= 108000
#include <boost/asio/deferred.hpp>
#endif
#include <boost/asio/strand.hpp>

using namespace rdmachan;
namespace net = boost::asio;
using rdmachan::asio::AsyncChannel;

namespace {

constexpr std::uint32_t kMessage = 64;

struct AsyncPair {
    explicit AsyncPair(net::io_context& io, test::ChannelPair pair = test::connect_pair())
        : a(io, std::move(pair.a)), b(io, std::move(pair.b)) {
        a_region = a.channel().allocate_memory(64 * 1024);
        b_region = b.channel().allocate_memory(64 * 1024);
    }
    AsyncChannel a;
    AsyncChannel b;
    MemoryRegion a_region;
    MemoryRegion b_region;
};

}  // namespace

TEST_CASE("built against the Boost its CMake target was made for") {
    MESSAGE("Boost " << BOOST_LIB_VERSION << "; per-operation cancellation slots: "
                     << std::string(rdmachan::asio::kCancellationSlots ? "yes" : "no"));
    CHECK(BOOST_VERSION == RDMACHAN_EXPECTED_BOOST_VERSION);
}

TEST_CASE("callbacks: a receive and a send complete through their handlers on the io_context's thread, never inside the call") {
    net::io_context io;
    AsyncPair pair(io);
    std::memcpy(pair.a_region.data(), "hello", 6);
    bool inside_call = true;
    int completed = 0;
    std::thread::id handler_thread;
    std::optional<WorkResult> received;
    pair.b.async_receive(pair.b_region.slice(0, kMessage), [&](boost::system::error_code error, WorkResult result) {
        CHECK_FALSE(inside_call);
        CHECK_FALSE(error);
        handler_thread = std::this_thread::get_id();
        received.emplace(std::move(result));
        ++completed;
    });
    // On the software device's same-host path the send's completion is there before post
    // returns: the handler must still wait for the io_context.
    pair.a.async_send(pair.a_region.slice(0, 6), [&](boost::system::error_code error, WorkResult result) {
        CHECK_FALSE(inside_call);
        CHECK_FALSE(error);
        CHECK(result.ok());
        ++completed;
    });
    inside_call = false;
    CHECK(completed == 0);
    std::thread runner([&] { io.run(); });  // returns once nothing is pending: no wait is left behind
    const std::thread::id runner_id = runner.get_id();
    runner.join();
    CHECK(completed == 2);
    CHECK(handler_thread == runner_id);
    REQUIRE(received.has_value());
    REQUIRE(received->ok());
    CHECK(received->completion().bytes == 6);
    CHECK(std::memcmp(pair.b_region.data(), "hello", 6) == 0);
}

TEST_CASE("a completion there when the operation starts is not delivered inside the call, also when called from a handler") {
    net::io_context io;
    AsyncPair pair(io);
    int delivered = 0;
    bool returned = false;
    net::post(io, [&] {
        // Inside io_context::run(), where a dispatch would run the handler at once.
        pair.a.async_write(pair.a_region.slice(0, 8), pair.b_region.remote(0, 8), [&](boost::system::error_code error, WorkResult result) {
            CHECK(returned);
            CHECK_FALSE(error);
            CHECK(result.ok());
            ++delivered;
        });
        returned = true;
    });
    io.run();
    CHECK(delivered == 1);
}

TEST_CASE("use_future: another thread runs the io_context, this one waits on futures of every operation kind") {
    net::io_context io;
    AsyncPair pair(io);
    auto work = net::make_work_guard(io);
    std::thread runner([&] { io.run(); });
    const RemoteMemoryRegion remote = pair.b_region.remote();
    auto* words = static_cast<std::uint64_t*>(pair.b_region.data());

    // Everything is started on the io_context's thread: an AsyncChannel is used by one thread at a time.
    auto on_io = [&](auto start) { return net::post(io, std::packaged_task<decltype(start())()>(start)).get(); };

    std::memset(pair.a_region.data(), 0x5a, 256);
    std::future<WorkResult> written = on_io([&] { return pair.a.async_write(pair.a_region.slice(0, 256), remote.slice(1024, 256), net::use_future); });
    REQUIRE(written.get().ok());
    CHECK(static_cast<std::uint8_t*>(pair.b_region.data())[1024 + 255] == 0x5a);

    std::future<WorkResult> read = on_io([&] { return pair.a.async_read(pair.a_region.slice(4096, 256), remote.slice(1024, 256), net::use_future); });
    REQUIRE(read.get().ok());
    CHECK(static_cast<std::uint8_t*>(pair.a_region.data())[4096 + 255] == 0x5a);

    words[0] = 40;
    std::future<WorkResult> added = on_io([&] { return pair.a.async_fetch_and_add(pair.a_region.slice(8192, 8), remote.slice(0, 8), 2, net::use_future); });
    REQUIRE(added.get().ok());
    CHECK(*reinterpret_cast<std::uint64_t*>(pair.a_region.slice(8192, 8).bytes()) == 40);  // the value before
    CHECK(words[0] == 42);

    std::future<WorkResult> swapped = on_io([&] { return pair.a.async_compare_and_swap(pair.a_region.slice(8192, 8), remote.slice(0, 8), 42, 7, net::use_future); });
    REQUIRE(swapped.get().ok());
    CHECK(words[0] == 7);

    WorkBatch batch;
    for (std::uint32_t i = 0; i < 4; ++i) batch.write(pair.a_region.slice(i * 64, 64), remote.slice(2048 + i * 64, 64));
    std::future<WorkResult> executed = on_io([&] { return pair.a.async_execute(batch, net::use_future); });
    REQUIRE(executed.get().ok());
    CHECK(static_cast<std::uint8_t*>(pair.b_region.data())[2048 + 255] == 0x5a);

    // Send with immediate into a receive, and a write with immediate into another.
    std::future<WorkResult> first = on_io([&] { return pair.b.async_receive(pair.b_region.slice(0, kMessage), net::use_future); });
    std::future<WorkResult> second = on_io([&] { return pair.b.async_receive(pair.b_region.slice(kMessage, kMessage), net::use_future); });
    std::future<WorkResult> sent = on_io([&] { return pair.a.async_send(pair.a_region.slice(0, 16), 11u, net::use_future); });
    std::future<WorkResult> write_immediate =
        on_io([&] { return pair.a.async_write(pair.a_region.slice(0, 16), remote.slice(4096, 16), 12u, net::use_future); });
    REQUIRE(sent.get().ok());
    REQUIRE(write_immediate.get().ok());
    const WorkResult first_result = first.get();
    const WorkResult second_result = second.get();
    REQUIRE(first_result.ok());
    REQUIRE(second_result.ok());
    CHECK(first_result.completion().immediate == 11u);
    CHECK(second_result.completion().immediate == 12u);

    // A PendingWork posted by hand, handed over to async_wait.
    std::future<WorkResult> waited = on_io([&] {
        PendingWork posted = pair.a.channel().post_write(pair.a_region.slice(0, 8), remote.slice(0, 8));
        return pair.a.async_wait(std::move(posted), net::use_future);
    });
    CHECK(waited.get().ok());

    work.reset();
    runner.join();
}

TEST_CASE("coroutines: co_spawn and use_awaitable, 1000 round trips between two coroutines on one io_context") {
    net::io_context io;
    AsyncPair pair(io);
    constexpr int kRounds = 1000;
    int pongs = 0;
    auto ping = [&]() -> net::awaitable<void> {
        for (int round = 0; round < kRounds; ++round) {
            std::memcpy(pair.a_region.data(), &round, sizeof round);
            const WorkResult sent = co_await pair.a.async_send(pair.a_region.slice(0, sizeof round), net::use_awaitable);
            REQUIRE(sent.ok());
            const WorkResult back = co_await pair.a.async_receive(pair.a_region.slice(64, sizeof round), net::use_awaitable);
            REQUIRE(back.ok());
            int value = 0;
            std::memcpy(&value, static_cast<std::uint8_t*>(pair.a_region.data()) + 64, sizeof value);
            CHECK(value == round + 1);
            ++pongs;
        }
    };
    auto pong = [&]() -> net::awaitable<void> {
        for (int round = 0; round < kRounds; ++round) {
            const WorkResult got = co_await pair.b.async_receive(pair.b_region.slice(0, sizeof round), net::use_awaitable);
            REQUIRE(got.ok());
            int value = 0;
            std::memcpy(&value, pair.b_region.data(), sizeof value);
            ++value;
            std::memcpy(static_cast<std::uint8_t*>(pair.b_region.data()) + 64, &value, sizeof value);
            const WorkResult sent = co_await pair.b.async_send(pair.b_region.slice(64, sizeof value), net::use_awaitable);
            REQUIRE(sent.ok());
        }
    };
    // The receive is posted before the first ping is sent: pong starts first.
    std::exception_ptr failure;
    auto note = [&](std::exception_ptr error) {
        if (error) failure = error;
    };
    net::co_spawn(io, pong(), note);
    net::co_spawn(io, ping(), note);
    io.run();
    if (failure) std::rethrow_exception(failure);
    CHECK(pongs == kRounds);
}

TEST_CASE("three threads run the io_context, each AsyncChannel on a strand, over TCP: 3000 round trips, none lost") {
    // With several threads, one waiting in the reactor may take a completion's event between
    // another's arm() and its queueing the descriptor's wait: the poll after the arm finds that
    // completion, or the round trip would stall. Over TCP the software device's own thread
    // writes the completions, at any moment.
    REQUIRE(setenv("RDMACHAN_SOFT_TRANSPORT", "tcp", 1) == 0);
    net::io_context io;
    test::ChannelPair connected = test::connect_pair();
    unsetenv("RDMACHAN_SOFT_TRANSPORT");
    AsyncChannel a(net::make_strand(io), std::move(connected.a));
    AsyncChannel b(net::make_strand(io), std::move(connected.b));
    MemoryRegion a_region = a.channel().allocate_memory(4096);
    MemoryRegion b_region = b.channel().allocate_memory(4096);
    constexpr int kRounds = 3000;
    std::atomic<int> pongs{0};
    std::atomic<bool> failed{false};
    net::co_spawn(
        b.get_executor(),
        [&]() -> net::awaitable<void> {
            for (int round = 0; round < kRounds; ++round) {
                auto request = b.async_receive(b_region.slice(0, 8), net::use_awaitable);
                if (!(co_await std::move(request)).ok()) failed = true;
                if (!(co_await b.async_send(b_region.slice(64, 8), net::use_awaitable)).ok()) failed = true;
            }
        },
        net::detached);
    net::co_spawn(
        a.get_executor(),
        [&]() -> net::awaitable<void> {
            for (int round = 0; round < kRounds; ++round) {
                auto reply = a.async_receive(a_region.slice(0, 8), net::use_awaitable);
                if (!(co_await a.async_send(a_region.slice(64, 8), net::use_awaitable)).ok()) failed = true;
                if (!(co_await std::move(reply)).ok()) failed = true;
                ++pongs;
            }
        },
        net::detached);
    auto guard = net::make_work_guard(io);
    std::thread threads[] = {std::thread([&] { io.run(); }), std::thread([&] { io.run(); }), std::thread([&] { io.run(); })};
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (pongs < kRounds && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    const int done = pongs;
    if (done < kRounds) {  // let the threads end: give up what is pending
        net::post(a.get_executor(), [&] { a.cancel(); });
        net::post(b.get_executor(), [&] { b.cancel(); });
    }
    guard.reset();
    for (std::thread& thread : threads) thread.join();
    CHECK(done == kRounds);
    CHECK_FALSE(failed);
}

TEST_CASE("an error the channel throws when an operation starts reaches the caller: callback and coroutine") {
    net::io_context io;
    AsyncPair pair(io);
    WorkBatch too_big;
    for (std::uint32_t i = 0; i < 200; ++i) too_big.write(pair.a_region.slice(0, 8), pair.b_region.remote(0, 8));
    CHECK_THROWS_AS(pair.a.async_execute(too_big, [](boost::system::error_code, WorkResult) {}), rdmachan::Error);
    bool caught = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            try {
                co_await pair.a.async_execute(too_big, net::use_awaitable);
            } catch (const rdmachan::Error&) {
                caught = true;
            }
        },
        net::detached);
    io.run();
    CHECK(caught);
}

TEST_CASE("deferred (Boost 1.80 and later): posted at the call, waited for when launched, as a callback or co_await" *
          doctest::skip(BOOST_VERSION < 108000)) {
#if BOOST_VERSION >= 108000
    net::io_context io;
    AsyncPair pair(io);
    auto receive = pair.b.async_receive(pair.b_region.slice(0, kMessage), net::deferred);
    auto send = pair.a.async_send(pair.a_region.slice(0, 8), net::deferred);
    CHECK(pair.a.channel().counters().outstanding == 1);  // posted, not waited for
    io.run();
    CHECK(pair.a.channel().counters().outstanding == 1);  // nothing waits yet: its completion is not taken
    io.restart();
    std::optional<WorkResult> received;
    std::move(receive)([&](boost::system::error_code error, WorkResult result) {
        CHECK_FALSE(error);
        received.emplace(std::move(result));
    });
    bool sent = false;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            const WorkResult result = co_await std::move(send);
            sent = result.ok();
        },
        net::detached);
    io.run();
    CHECK(sent);
    REQUIRE(received.has_value());
    CHECK(received->ok());
    CHECK(received->completion().bytes == 8);
#endif
}

TEST_CASE("many channels on one io_context and one thread, beside a TCP acceptor and a timer") {
    constexpr int kPairs = 8;
    constexpr int kRounds = 200;
    net::io_context io;
    std::vector<std::unique_ptr<AsyncPair>> pairs;
    for (int i = 0; i < kPairs; ++i) pairs.push_back(std::make_unique<AsyncPair>(io));

    int pairs_done = 0;
    for (auto& pair : pairs) {
        net::co_spawn(
            io,
            [&pair = *pair, &pairs_done]() -> net::awaitable<void> {
                for (int round = 0; round < kRounds; ++round) {
                    const WorkResult written = co_await pair.a.async_write(pair.a_region.slice(0, kMessage),
                                                                           pair.b_region.remote(kMessage, kMessage), net::use_awaitable);
                    REQUIRE(written.ok());
                    const WorkResult read = co_await pair.b.async_read(pair.b_region.slice(256, kMessage),
                                                                       pair.a_region.remote(0, kMessage), net::use_awaitable);
                    REQUIRE(read.ok());
                }
                ++pairs_done;
            },
            net::detached);
    }

    // A TCP echo of one line through an acceptor and a client, both on this io_context.
    net::ip::tcp::acceptor acceptor(io, {net::ip::address_v4::loopback(), 0});
    const std::uint16_t port = acceptor.local_endpoint().port();
    std::string echoed;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            net::ip::tcp::socket peer = co_await acceptor.async_accept(net::use_awaitable);
            char line[5];
            co_await net::async_read(peer, net::buffer(line), net::use_awaitable);
            co_await net::async_write(peer, net::buffer(line), net::use_awaitable);
        },
        net::detached);
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            net::ip::tcp::socket client(io);
            co_await client.async_connect({net::ip::address_v4::loopback(), port}, net::use_awaitable);
            co_await net::async_write(client, net::buffer("ping", 5), net::use_awaitable);
            char line[5];
            co_await net::async_read(client, net::buffer(line), net::use_awaitable);
            echoed.assign(line, 4);
        },
        net::detached);

    int ticks = 0;
    net::steady_timer timer(io);
    std::function<void(boost::system::error_code)> tick = [&](boost::system::error_code error) {
        if (error) return;
        ++ticks;
        if (pairs_done < kPairs) {
            timer.expires_after(std::chrono::milliseconds(1));
            timer.async_wait(tick);
        }
    };
    timer.expires_after(std::chrono::milliseconds(1));
    timer.async_wait(tick);

    REQUIRE(test::run_until(io, [&] { return pairs_done == kPairs && echoed == "ping"; }));
    CHECK(ticks >= 1);
    for (auto& pair : pairs) {
        CHECK(pair->a.channel().counters().operations >= kRounds);
    }
}
