// N-peer rendezvous: threads and processes in random order, and every way a rank can be
// refused or missing.
#include "rdmachan/rendezvous.hpp"

#include <doctest/doctest.h>

#include <atomic>
#include <boost/asio/connect.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/write.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <random>

#include "handshake/frame.hpp"
#include "rdmachan/error.hpp"
#include "tests/handshake/rendezvous_support.hpp"

using namespace std::chrono_literals;
using rdmachan::test::predictable_endpoint;

namespace {

// Success paths use long deadlines: under AddressSanitizer 64 ranks parsing a 64-entry table
// on 2 cores take seconds, and a deadline only ends a run that is failing anyway.
rdmachan::RendezvousServerSettings server_settings(std::uint32_t world_size,
                                                   std::chrono::milliseconds timeout = 30000ms) {
    return {"127.0.0.1", 0, world_size, "job-A", "secret-token", timeout};
}

rdmachan::RendezvousSettings client_settings(std::uint16_t port, std::uint32_t rank,
                                             std::uint32_t world_size,
                                             std::chrono::milliseconds timeout = 30000ms) {
    return rdmachan::test::rendezvous_settings(port, rank, world_size, "job-A", "secret-token", timeout);
}

// Every rank's endpoint, with only the RC entry it made for `recipient` (protocol 2).
bool table_is_complete(const std::vector<rdmachan::Endpoint>& table, std::uint32_t world_size,
                       std::uint32_t recipient) {
    if (table.size() != world_size) return false;
    for (std::uint32_t rank = 0; rank < world_size; ++rank) {
        const rdmachan::Endpoint expected =
            rdmachan::test::as_received_by(predictable_endpoint(rank, world_size), recipient);
        if (!(table[rank] == expected)) return false;
        if (rank != recipient && table[rank].rc.size() != 1) return false;
    }
    return true;
}

using rdmachan::test::error_of;

}  // namespace

TEST_CASE("ranks in threads, arriving in random order, all get the full table") {
    for (std::uint32_t world_size : {2u, 8u, 64u}) {
        CAPTURE(world_size);
        rdmachan::RendezvousServer server(server_settings(world_size));
        server.start();
        std::atomic<std::uint32_t> entered{0};
        std::atomic<std::uint32_t> complete{0};
        std::atomic<std::uint32_t> left_early{0};
        std::vector<std::thread> ranks;
        std::mt19937 random(world_size);
        for (std::uint32_t rank = 0; rank < world_size; ++rank) {
            const auto delay = std::chrono::milliseconds(random() % 60);
            ranks.emplace_back([&, rank, delay] {
                std::this_thread::sleep_for(delay);
                try {
                    rdmachan::Rendezvous session(client_settings(server.port(), rank, world_size));
                    const auto table = session.exchange(predictable_endpoint(rank, world_size));
                    // Entering late on purpose for some ranks: nobody may leave before them.
                    std::this_thread::sleep_for(delay / 4);
                    entered.fetch_add(1);
                    session.barrier();
                    if (entered.load() != world_size) left_early.fetch_add(1);
                    if (table_is_complete(table, world_size, rank)) complete.fetch_add(1);
                } catch (const rdmachan::Error& error) {
                    MESSAGE(std::string(error.what()));
                }
            });
        }
        for (auto& thread : ranks) thread.join();
        CHECK(complete.load() == world_size);
        CHECK(left_early.load() == 0);
        CHECK_NOTHROW(server.wait());
    }
}

TEST_CASE("ranks in separate processes complete the rendezvous") {
    for (int world_size : {2, 8, 64}) {
        CAPTURE(world_size);
        // The children fork first and retry until the server (started afterwards) listens; no
        // thread runs in this process while it forks (see run_children).
        rdmachan::RendezvousServer server(server_settings(world_size));
        const std::uint16_t port = server.port();
        std::vector<int> order(world_size);
        for (int index = 0; index < world_size; ++index) order[index] = index;
        std::shuffle(order.begin(), order.end(), std::mt19937(world_size));
        const int succeeded = rdmachan::test::run_children(
            world_size,
            [&](int index) {
                const std::uint32_t rank = order[index];
                std::this_thread::sleep_for(std::chrono::milliseconds(rank * 7 % 50));
                const auto table =
                    rdmachan::rendezvous(client_settings(port, rank, world_size),
                                         predictable_endpoint(rank, world_size));
                return table_is_complete(table, world_size, rank) ? 0 : 3;
            },
            40000ms,
            [&server] {
                std::this_thread::sleep_for(30ms);
                server.start();
            });
        CHECK(succeeded == world_size);
        CHECK_NOTHROW(server.wait());
    }
}

TEST_CASE("rank 0 can host the server in-process") {
    constexpr std::uint32_t world_size = 4;
    auto zero_settings = client_settings(0, 0, world_size);
    zero_settings.serve_in_process = true;
    rdmachan::Rendezvous zero(zero_settings);
    REQUIRE(zero.port() != 0);
    std::vector<std::thread> others;
    std::atomic<int> complete{0};
    for (std::uint32_t rank = 1; rank < world_size; ++rank)
        others.emplace_back([&, rank] {
            const auto table = rdmachan::rendezvous(client_settings(zero.port(), rank, world_size),
                                                    predictable_endpoint(rank, world_size));
            if (table_is_complete(table, world_size, rank)) complete.fetch_add(1);
        });
    const auto table = zero.exchange(predictable_endpoint(0, world_size));
    zero.barrier();
    for (auto& thread : others) thread.join();
    CHECK(table_is_complete(table, world_size, 0));
    CHECK(complete.load() == world_size - 1);
}

TEST_CASE("a rank that never arrives: the deadline error lists it") {
    // Only the server's deadline is under test: the ranks wait with the default one (30 s), so
    // they hear the server's list however late its thread runs. (With 1000 ms they did not,
    // under the soak: the server's error left 3.1 s after the ranks had registered.)
    rdmachan::RendezvousServer server(server_settings(4, 600ms));
    const auto started = std::chrono::steady_clock::now();
    server.start();
    std::vector<std::string> errors(4);
    std::vector<std::thread> ranks;
    for (std::uint32_t rank : {0u, 2u}) {
        ranks.emplace_back([&, rank] {
            errors[rank] = error_of([&] {
                rdmachan::rendezvous(client_settings(server.port(), rank, 4),
                                     predictable_endpoint(rank, 4));
            });
        });
    }
    for (auto& thread : ranks) thread.join();
    CHECK(std::chrono::steady_clock::now() - started >= 600ms);  // told at the server's deadline
    const std::string server_error = error_of([&] { server.wait(); });
    CHECK(server_error.find("ranks that never arrived: 1, 3") != std::string::npos);
    for (std::uint32_t rank : {0u, 2u}) {
        CAPTURE(errors[rank]);
        CHECK(errors[rank].find("ranks that never arrived: 1, 3") != std::string::npos);
    }
}

TEST_CASE("wait_registered: false at its timeout while nobody registered, true once a rank has") {
    rdmachan::RendezvousServer server(server_settings(2, 2500ms));
    server.start();
    CHECK_FALSE(server.wait_registered(1, 20ms));
    std::vector<rdmachan::Endpoint> tables[2];
    std::thread first([&] {
        tables[0] =
            rdmachan::rendezvous(client_settings(server.port(), 0, 2), predictable_endpoint(0, 2));
    });
    CHECK(server.wait_registered(1, 2000ms));
    CHECK_FALSE(server.wait_registered(2, 20ms));
    tables[1] = rdmachan::rendezvous(client_settings(server.port(), 1, 2), predictable_endpoint(1, 2));
    first.join();
    CHECK(server.wait_registered(2, 0ms));
    server.wait();
    CHECK(table_is_complete(tables[0], 2, 0));
    CHECK(table_is_complete(tables[1], 2, 1));
}

TEST_CASE("duplicate rank, wrong world size, wrong job and wrong token are refused by name") {
    rdmachan::RendezvousServer server(server_settings(2, 2500ms));
    server.start();
    std::vector<rdmachan::Endpoint> first_table;
    std::thread first([&] {
        first_table =
            rdmachan::rendezvous(client_settings(server.port(), 0, 2), predictable_endpoint(0, 2));
    });
    REQUIRE(server.wait_registered(1, 2000ms));  // rank 0 registers first

    rdmachan::Endpoint impostor = predictable_endpoint(0, 2);
    impostor.session = 0x1234;
    const std::string duplicate =
        error_of([&] { rdmachan::rendezvous(client_settings(server.port(), 0, 2), impostor); });
    CHECK(duplicate.find("rank 0 is already registered (session 5e55000000000abc)") !=
          std::string::npos);
    CHECK(duplicate.find("session 0000000000001234 claims it too") != std::string::npos);

    const std::string world = error_of([&] {
        rdmachan::rendezvous(client_settings(server.port(), 1, 3), predictable_endpoint(1, 3));
    });
    CHECK(world.find("rank 1 at 127.0.0.1:") != std::string::npos);
    CHECK(world.find("expects world size 3, this rendezvous has world size 2") !=
          std::string::npos);

    auto other_job = client_settings(server.port(), 1, 2);
    other_job.job = "job-B";
    const std::string job =
        error_of([&] { rdmachan::rendezvous(other_job, predictable_endpoint(1, 2)); });
    CHECK(job.find("belongs to job 'job-B', this rendezvous serves job 'job-A'") !=
          std::string::npos);

    auto wrong_token = client_settings(server.port(), 1, 2);
    wrong_token.token = "guess";
    const std::string token =
        error_of([&] { rdmachan::rendezvous(wrong_token, predictable_endpoint(1, 2)); });
    CHECK(token.find("rank 1 at 127.0.0.1:") != std::string::npos);
    CHECK(token.find("failed to prove the job token") != std::string::npos);

    const std::string out_of_range = error_of([&] {
        rdmachan::Endpoint endpoint = predictable_endpoint(1, 2);
        endpoint.rank = 5;
        auto settings = client_settings(server.port(), 5, 6);
        rdmachan::rendezvous(settings, endpoint);
    });
    CHECK(out_of_range.find("world size") != std::string::npos);

    // The real rank 1 still completes the rendezvous after all the rejected attempts.
    const auto table =
        rdmachan::rendezvous(client_settings(server.port(), 1, 2), predictable_endpoint(1, 2));
    first.join();
    CHECK(table_is_complete(table, 2, 1));
    CHECK(table_is_complete(first_table, 2, 0));
    CHECK_NOTHROW(server.wait());
}

TEST_CASE("garbage, truncated, oversized and incompatible first frames are refused") {
    namespace asio = boost::asio;
    using tcp = asio::ip::tcp;
    rdmachan::RendezvousServer server(server_settings(1, 2500ms));
    server.start();
    asio::io_context io;
    const tcp::endpoint address(asio::ip::make_address("127.0.0.1"), server.port());
    auto reply_to = [&](const std::string& bytes) {
        tcp::socket socket(io);
        socket.connect(address);
        asio::write(socket, asio::buffer(bytes));
        boost::system::error_code error;
        socket.shutdown(tcp::socket::shutdown_send, error);  // the server sees the end of stream
        std::string reply;
        char chunk[4096];
        for (;;) {
            const std::size_t got = socket.read_some(asio::buffer(chunk), error);
            if (error) break;
            reply.append(chunk, got);
        }
        return reply;
    };
    using rdmachan::handshake::encode_frame;
    using rdmachan::handshake::encode_hello;
    const std::string newer = reply_to(encode_frame(encode_hello("{}", 9, 7)));
    CHECK(newer.find("speaks handshake protocol version 9 (compatible down to 7)") !=
          std::string::npos);
    const std::string garbage = reply_to("GET / HTTP/1.1\r\nHost: x\r\n\r\n");
    CHECK(garbage.find("announces") != std::string::npos);
    const std::string magic = reply_to(encode_frame("NOTMAGIC\0\0\0\1\0\0\0\1{}"));
    CHECK(magic.find("bad magic") != std::string::npos);
    const std::string oversized = reply_to(std::string("\x00\x10\x00\x00", 4));
    CHECK(oversized.find("more than the cap") != std::string::npos);
    const std::string truncated = reply_to(encode_frame(encode_hello("{}")).substr(0, 10));
    CHECK(truncated.find("ended inside a frame") != std::string::npos);
    const std::string not_json = reply_to(encode_frame(encode_hello("{not json")));
    CHECK(not_json.find("hello from 127.0.0.1:") != std::string::npos);

    // After all that, the real rank still gets through.
    const auto table =
        rdmachan::rendezvous(client_settings(server.port(), 0, 1), predictable_endpoint(0, 1));
    CHECK(table_is_complete(table, 1, 0));
    CHECK_NOTHROW(server.wait());
}

TEST_CASE("a client with no server gives up at its deadline") {
    // Bind a port and close it again, so nothing listens there.
    std::uint16_t port = 0;
    {
        rdmachan::RendezvousServer placeholder(server_settings(1));
        port = placeholder.port();
    }
    const auto start = std::chrono::steady_clock::now();
    const std::string error = error_of([&] {
        rdmachan::rendezvous(client_settings(port, 0, 2, 300ms), predictable_endpoint(0, 2));
    });
    const auto elapsed = std::chrono::steady_clock::now() - start;
    CHECK(error.find("rank 0 of job 'job-A'") != std::string::npos);
    CHECK(error.find("deadline of 300 ms expired") != std::string::npos);
    CHECK(elapsed < 2s);
}

TEST_CASE("an endpoint whose rc entries name a rank outside the world or a peer twice is refused") {
    rdmachan::RendezvousServer server(server_settings(2, 2500ms));
    server.start();
    rdmachan::Endpoint outside = predictable_endpoint(1, 2);
    outside.rc.push_back({7, 1, 1});
    const std::string outside_error =
        error_of([&] { rdmachan::rendezvous(client_settings(server.port(), 1, 2), outside); });
    CHECK(outside_error.find("rank 1 at 127.0.0.1:") != std::string::npos);
    CHECK(outside_error.find("'rc[1].peer' = 7 is not a rank of world size 2") != std::string::npos);
    rdmachan::Endpoint twice = predictable_endpoint(1, 2);
    twice.rc.push_back(twice.rc.front());
    const std::string twice_error =
        error_of([&] { rdmachan::rendezvous(client_settings(server.port(), 1, 2), twice); });
    CHECK(twice_error.find("'rc[1].peer' = 0 names a peer that an earlier rc entry names") !=
          std::string::npos);
    // The genuine endpoints still complete it.
    std::vector<rdmachan::Endpoint> zero_table;
    std::thread zero([&] {
        zero_table =
            rdmachan::rendezvous(client_settings(server.port(), 0, 2), predictable_endpoint(0, 2));
    });
    const auto table =
        rdmachan::rendezvous(client_settings(server.port(), 1, 2), predictable_endpoint(1, 2));
    zero.join();
    CHECK(table_is_complete(table, 2, 1));
    CHECK(table_is_complete(zero_table, 2, 0));
    CHECK_NOTHROW(server.wait());
}

TEST_CASE("bytes received per rank grow linearly: each peer's rc is cut to the entry for the recipient") {
    // 64 ranks, each publishing 63 rc entries: the whole table would be 64 * 63 entries.
    constexpr std::uint32_t world_size = 64;
    rdmachan::RendezvousServer server(server_settings(world_size));
    server.start();
    std::vector<std::uint64_t> received(world_size);
    std::vector<std::thread> ranks;
    std::atomic<std::uint32_t> complete{0};
    for (std::uint32_t rank = 0; rank < world_size; ++rank)
        ranks.emplace_back([&, rank] {
            rdmachan::Rendezvous session(client_settings(server.port(), rank, world_size));
            const auto table = session.exchange(predictable_endpoint(rank, world_size));
            received[rank] = session.bytes_received();
            session.barrier();
            if (table_is_complete(table, world_size, rank)) complete.fetch_add(1);
        });
    for (auto& thread : ranks) thread.join();
    CHECK(complete.load() == world_size);
    CHECK_NOTHROW(server.wait());
    // One endpoint with all its rc entries is larger than the whole table a rank receives
    // divided by the world size several times over; version 1 sent world_size such endpoints.
    const std::size_t full_endpoint = rdmachan::serialize_endpoint(predictable_endpoint(3, world_size)).size();
    for (std::uint32_t rank = 0; rank < world_size; ++rank) {
        CAPTURE(rank);
        CHECK(received[rank] > 0);
        CHECK(received[rank] < world_size * 400);
        CHECK(received[rank] * 4 < world_size * full_endpoint);
    }
}

TEST_CASE("old and new protocol versions refuse each other, naming both versions") {
    namespace asio = boost::asio;
    using tcp = asio::ip::tcp;
    using rdmachan::handshake::decode_hello;
    using rdmachan::handshake::encode_frame;
    using rdmachan::handshake::encode_hello;
    REQUIRE(rdmachan::handshake::protocol_version == 3);
    REQUIRE(rdmachan::handshake::protocol_min_compatible_version == 2);
    const nlohmann::json hello_body = {{"rank", 0}, {"world_size", 1}, {"job", "job-A"},
                                       {"session", "5e55000000000abc"}, {"nonce", "00"}};

    SUBCASE("a version-1 client against this server") {
        rdmachan::RendezvousServer server(server_settings(1, 1500ms));
        server.start();
        asio::io_context io;
        tcp::socket socket(io);
        socket.connect({asio::ip::make_address("127.0.0.1"), server.port()});
        asio::write(socket, asio::buffer(encode_frame(encode_hello(hello_body.dump(), 1, 1))));
        rdmachan::handshake::FrameDecoder decoder("server", 1 << 16);
        std::optional<std::string> frame;
        while (!(frame = decoder.next_frame())) {
            char chunk[4096];
            boost::system::error_code error;
            const std::size_t got = socket.read_some(asio::buffer(chunk), error);
            REQUIRE_FALSE(error);
            decoder.feed({reinterpret_cast<const std::uint8_t*>(chunk), got});
        }
        // The server answers with a hello of its own version carrying the reason; a version-1
        // client would refuse that hello too, and either way the text names both versions.
        REQUIRE(frame->size() > rdmachan::handshake::hello_header_size);
        const std::string reason = frame->substr(rdmachan::handshake::hello_header_size);
        CAPTURE(reason);
        CHECK(reason.find("speaks handshake protocol version 1 (compatible down to 1)") != std::string::npos);
        CHECK(reason.find("this side's version 3 (compatible down to 2)") != std::string::npos);
        const rdmachan::handshake::Hello reply = decode_hello(*frame, "server");
        CHECK(reply.version == 3);
        CHECK(reply.min_compatible_version == 2);  // above 1: a version-1 client refuses it
        CHECK_THROWS(server.wait());  // the lone rank never registered
    }

    SUBCASE("this client against a version-1 server") {
        asio::io_context io;
        tcp::acceptor acceptor(io, {asio::ip::make_address("127.0.0.1"), 0});
        const std::uint16_t port = acceptor.local_endpoint().port();
        std::string client_hello;
        std::thread old_server([&] {
            tcp::socket socket = acceptor.accept();
            rdmachan::handshake::FrameDecoder decoder("client", 1 << 16);
            std::optional<std::string> frame;
            while (!(frame = decoder.next_frame())) {
                char chunk[4096];
                boost::system::error_code error;
                const std::size_t got = socket.read_some(asio::buffer(chunk), error);
                if (error) return;
                decoder.feed({reinterpret_cast<const std::uint8_t*>(chunk), got});
            }
            client_hello = *frame;
            // A version-1 server would accept and answer with its own version-1 hello.
            asio::write(socket, asio::buffer(encode_frame(encode_hello(R"({"nonce":"00"})", 1, 1))));
            boost::system::error_code ignored;
            char rest[64];
            socket.read_some(asio::buffer(rest), ignored);  // until the client hangs up
        });
        const std::string error = error_of([&] {
            rdmachan::rendezvous(client_settings(port, 0, 1, 3000ms), predictable_endpoint(0, 1));
        });
        old_server.join();
        CAPTURE(error);
        CHECK(error.find("speaks handshake protocol version 1 (compatible down to 1)") != std::string::npos);
        CHECK(error.find("this side's version 3 (compatible down to 2)") != std::string::npos);
        // And the client announced version 3, oldest 2, in its hello.
        REQUIRE(client_hello.size() >= rdmachan::handshake::hello_header_size);
        CHECK(client_hello.substr(8, 8) == std::string("\0\0\0\3\0\0\0\2", 8));
    }
}
