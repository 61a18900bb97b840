// A request/response service over a MultiChannel, written as Boost.Asio coroutines
// (rdmachan/asio.hpp): rank 0 serves, every other rank sends it requests and checks each answer.
// The service's one io_context runs a coroutine per client and a TCP status port beside them.
//
//   asio_service [ranks] [requests per client]
//
// The parent process plays the launcher: it forks the ranks, runs the rendezvous, learns the
// service's status port through a pipe, waits for the clients, then asks the status port to
// stop the service and checks the count it reports.
#include "rdmachan/asio.hpp"  // first: with clang and Boost 1.74 it enables Asio's coroutines

#include <unistd.h>

#include <boost/asio.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <optional>
#include <string>
#include <vector>

#include "rdmachan/multi_channel.hpp"

#include "local_ranks.hpp"

namespace net = boost::asio;

namespace {

// What travels in a send: a request (kind work or done) and its answer.
struct Message {
    std::uint32_t kind = 0;  // 0: work, 1: the client is done
    std::uint32_t sequence = 0;
    std::uint64_t value = 0;
};
constexpr std::uint32_t kWork = 0;
constexpr std::uint32_t kDone = 1;
constexpr std::uint32_t kSlot = 64;  // bytes per buffer

std::uint64_t answer(std::uint32_t client, std::uint64_t value) { return value * 3 + client; }

Message read_message(const rdmachan::MemoryRegion& region, std::uint64_t offset) {
    Message message;
    std::memcpy(&message, static_cast<const std::uint8_t*>(region.data()) + offset, sizeof message);
    return message;
}

void write_message(const rdmachan::MemoryRegion& region, std::uint64_t offset, const Message& message) {
    std::memcpy(static_cast<std::uint8_t*>(region.data()) + offset, &message, sizeof message);
}

struct ServiceState {
    std::uint64_t served = 0;
    std::uint32_t clients_done = 0;
    bool failed = false;
};

// One client's requests, until it says it is done. Its next request's receive is posted before
// the answer goes out, so the client never sends into a queue with no receive.
net::awaitable<void> serve(rdmachan::asio::AsyncMultiChannel& service, rdmachan::MemoryRegion& region,
                           std::uint32_t client, ServiceState& state) {
    const std::uint64_t request_at = 2 * client * kSlot;
    const std::uint64_t answer_at = request_at + kSlot;
    rdmachan::PendingWork next = service.channel().post_receive(client, region.slice(request_at, kSlot));
    for (;;) {
        const rdmachan::WorkResult received = co_await service.async_wait(std::move(next), net::use_awaitable);
        if (!received) {
            std::fprintf(stderr, "service: %s\n", received.error().message().c_str());
            state.failed = true;
            co_return;
        }
        const Message request = read_message(region, request_at);
        if (request.kind == kDone) break;
        next = service.channel().post_receive(client, region.slice(request_at, kSlot));
        write_message(region, answer_at, {kWork, request.sequence, answer(client, request.value)});
        const rdmachan::WorkResult sent = co_await service.async_send(client, region.slice(answer_at, kSlot), net::use_awaitable);
        if (!sent) {
            std::fprintf(stderr, "service: %s\n", sent.error().message().c_str());
            state.failed = true;
            co_return;
        }
        ++state.served;
    }
    ++state.clients_done;
}

// The status port: each connection sends one line, "status" or "stop", and gets the counts
// back; "stop" (the launcher's, once the clients have ended) ends the service.
net::awaitable<void> status_port(net::ip::tcp::acceptor& acceptor, const ServiceState& state, std::uint32_t clients) {
    for (;;) {
        net::ip::tcp::socket connection = co_await acceptor.async_accept(net::use_awaitable);
        std::string line;
        co_await net::async_read_until(connection, net::dynamic_buffer(line), '\n', net::use_awaitable);
        const std::string reply = "served " + std::to_string(state.served) + " clients_done " +
                                  std::to_string(state.clients_done) + " of " + std::to_string(clients) +
                                  (state.failed ? " failed" : "") + "\n";
        co_await net::async_write(connection, net::buffer(reply), net::use_awaitable);
        if (line == "stop\n") co_return;
    }
}

int run_service(rdmachan::MultiChannel channels, int status_pipe) {
    const std::uint32_t clients = channels.world_size() - 1;
    net::io_context io;
    rdmachan::asio::AsyncMultiChannel service(io, std::move(channels));
    rdmachan::MemoryRegion region = service.channel().allocate_memory(2 * (clients + 1) * kSlot);
    ServiceState state;

    net::ip::tcp::acceptor acceptor(io, {net::ip::address_v4::loopback(), 0});
    const std::uint16_t port = acceptor.local_endpoint().port();
    if (write(status_pipe, &port, sizeof port) != static_cast<ssize_t>(sizeof port)) return 1;
    close(status_pipe);

    for (std::uint32_t client = 1; client <= clients; ++client) {
        net::co_spawn(io, serve(service, region, client, state), [&state](std::exception_ptr error) {
            if (error) state.failed = true;  // a wait given up by stop: that client never said it was done
        });
    }
    // A service that hangs fails the example instead of its test's timeout.
    net::steady_timer watchdog(io, std::chrono::seconds(60));
    watchdog.async_wait([&](boost::system::error_code error) {
        if (error) return;
        std::fprintf(stderr, "service: still running after 60 s\n");
        state.failed = true;
        io.stop();
    });
    net::co_spawn(io, status_port(acceptor, state, clients), [&](std::exception_ptr) {
        service.cancel();  // whatever a client left unfinished
        watchdog.cancel();
    });
    io.run();
    std::printf("service: served %llu requests from %u clients (device %s)\n",
                static_cast<unsigned long long>(state.served), clients, service.channel().device_name().c_str());
    return state.failed || state.clients_done != clients ? 1 : 0;
}

// A client: each request's answer is awaited before the next goes; a receive for the answer is
// posted before its request is sent.
int run_client(rdmachan::MultiChannel channels, std::uint32_t requests) {
    const std::uint32_t rank = channels.rank();
    net::io_context io;
    rdmachan::asio::AsyncMultiChannel client(io, std::move(channels));
    rdmachan::MemoryRegion region = client.channel().allocate_memory(2 * kSlot);
    int failures = 0;
    net::co_spawn(
        io,
        [&]() -> net::awaitable<void> {
            for (std::uint32_t sequence = 0; sequence <= requests; ++sequence) {
                const bool done = sequence == requests;
                std::optional<net::awaitable<rdmachan::WorkResult>> answered;  // posted here, awaited below
                if (!done) answered.emplace(client.async_receive(0, region.slice(kSlot, kSlot), net::use_awaitable));
                const std::uint64_t value = 1000 * rank + sequence;
                write_message(region, 0, {done ? kDone : kWork, sequence, value});
                const rdmachan::WorkResult sent = co_await client.async_send(0, region.slice(0, kSlot), net::use_awaitable);
                if (!sent) {
                    std::fprintf(stderr, "rank %u: %s\n", rank, sent.error().message().c_str());
                    ++failures;
                    co_return;
                }
                if (done) break;
                const rdmachan::WorkResult got = co_await std::move(*answered);
                const Message reply = read_message(region, kSlot);
                if (!got || reply.sequence != sequence || reply.value != answer(rank, value)) {
                    std::fprintf(stderr, "rank %u: request %u got a wrong answer%s%s\n", rank, sequence, got ? "" : ": ",
                                 got ? "" : got.error().message().c_str());
                    ++failures;
                    co_return;
                }
            }
        },
        net::detached);
    io.run();
    if (failures == 0) std::printf("rank %u: %u requests answered, all checked\n", rank, requests);
    return failures == 0 ? 0 : 1;
}

int run_rank(const rdmachan::RendezvousSettings& settings, std::uint32_t requests, int status_pipe) {
    const std::uint32_t rank = settings.rank;
    rdmachan::PreparedMultiChannel prepared = rdmachan::MultiChannelBuilder(rdmachan::ChannelBuilder().deadline(std::chrono::seconds(20)))
                                                  .rank(rank)
                                                  .world_size(settings.world_size)
                                                  .build();
    rdmachan::MultiChannel channels = std::move(prepared).connect(settings);
    return rank == 0 ? run_service(std::move(channels), status_pipe) : run_client(std::move(channels), requests);
}

// The launcher's status query: one line out, one line back.
std::string ask_status(std::uint16_t port, const std::string& line) {
    net::io_context io;
    net::ip::tcp::socket socket(io);
    socket.connect({net::ip::address_v4::loopback(), port});
    net::write(socket, net::buffer(line));
    std::string reply;
    net::read_until(socket, net::dynamic_buffer(reply), '\n');
    return reply;
}

}  // namespace

int main(int argc, char** argv) {
    const std::uint32_t ranks = argc > 1 ? static_cast<std::uint32_t>(std::strtoul(argv[1], nullptr, 10)) : 4;
    const std::uint32_t requests = argc > 2 ? static_cast<std::uint32_t>(std::strtoul(argv[2], nullptr, 10)) : 200;
    if (ranks < 2 || ranks > 64 || requests > 1000000) {
        std::fprintf(stderr, "usage: asio_service [ranks 2..64] [requests per client 0..1000000]\n");
        return 2;
    }
    int status_ends[2];
    if (pipe(status_ends) != 0) return 1;
    examples::LocalRanks launcher(ranks, "asio_service");
    launcher.start([&](const rdmachan::RendezvousSettings& settings) {
        close(status_ends[0]);
        return run_rank(settings, requests, status_ends[1]);
    });
    close(status_ends[1]);
    int failures = launcher.rendezvous();

    std::uint16_t status_port = 0;
    if (read(status_ends[0], &status_port, sizeof status_port) != static_cast<ssize_t>(sizeof status_port)) {
        std::fprintf(stderr, "launcher: the service never said where its status port is\n");
        ++failures;
    }
    for (std::uint32_t rank = 1; rank < ranks; ++rank) failures += launcher.wait(rank);
    const std::string expected = "served " + std::to_string(static_cast<std::uint64_t>(ranks - 1) * requests) + " clients_done " +
                                 std::to_string(ranks - 1) + " of " + std::to_string(ranks - 1) + "\n";
    if (status_port != 0) {
        try {
            const std::string reply = ask_status(status_port, "stop\n");
            std::printf("launcher: the status port says: %s", reply.c_str());
            if (reply != expected) {
                std::fprintf(stderr, "launcher: expected: %s", expected.c_str());
                ++failures;
            }
        } catch (const std::exception& error) {
            std::fprintf(stderr, "launcher: the status port: %s\n", error.what());
            ++failures;
        }
    }
    failures += launcher.wait(0);
    if (failures != 0) {
        std::fprintf(stderr, "asio_service: %d failure(s)\n", failures);
        return 1;
    }
    std::printf("asio_service: %u clients, %u requests each, every answer checked\n", ranks - 1, requests);
    return 0;
}
