// rdmachan::asio against a peer in another process (software device, the same-host path and
// TCP): a peer that dies while coroutines are suspended in co_await on the channel.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "tests/asio/asio_test_support.hpp"

using namespace rdmachan;
namespace net = boost::asio;
using rdmachan::asio::AsyncChannel;

namespace {

// Length-prefixed JSON over a pipe: the endpoint exchange. The pairwise exchange (connect())
// is not used: it runs the library's own Boost.Asio, which must not meet another Boost version
// in one process (asio_test_boost_1_81 builds this file against 1.81).
void send_json(int pipe_end, const nlohmann::json& json) {
    const std::string text = json.dump();
    const auto length = static_cast<std::uint32_t>(text.size());
    if (write(pipe_end, &length, sizeof length) != static_cast<ssize_t>(sizeof length) ||
        write(pipe_end, text.data(), length) != static_cast<ssize_t>(length)) {
        throw std::runtime_error("writing to the pipe failed");
    }
}

nlohmann::json receive_json(int pipe_end) {
    std::uint32_t length = 0;
    if (read(pipe_end, &length, sizeof length) != static_cast<ssize_t>(sizeof length)) throw std::runtime_error("the pipe closed");
    std::string text(length, '\0');
    for (std::size_t got = 0; got < length;) {
        const ssize_t count = read(pipe_end, text.data() + got, length - got);
        if (count <= 0) throw std::runtime_error("the pipe closed");
        got += static_cast<std::size_t>(count);
    }
    return nlohmann::json::parse(text);
}

PreparedChannel prepare(MemoryRegion& region) {
    PreparedChannel prepared = ChannelBuilder().deadline(std::chrono::seconds(10)).build();
    region = prepared.allocate_memory(4096);
    return prepared;
}

// The child: exchanges endpoints, connects, says so, then waits for a byte ('k': die by SIGKILL).
int child(int to_parent, int from_parent) try {
    MemoryRegion region;
    PreparedChannel prepared = prepare(region);
    send_json(to_parent, {{"endpoint", prepared.endpoint()}, {"region", region.remote()}});
    const nlohmann::json parent = receive_json(from_parent);
    Channel channel = std::move(prepared).handshake(parent.at("endpoint").get<ChannelEndpoint>());
    if (write(to_parent, "r", 1) != 1) return 3;
    char command = 0;
    if (read(from_parent, &command, 1) == 1 && command == 'k') raise(SIGKILL);
    return 0;
} catch (const std::exception& error) {
    std::fprintf(stderr, "child: %s\n", error.what());
    return 2;
}

class Peer {
public:
    explicit Peer(const char* transport) {
        REQUIRE(setenv("RDMACHAN_SOFT_TRANSPORT", transport, 1) == 0);
        int to_parent[2];
        int from_parent[2];
        REQUIRE(pipe(to_parent) == 0);
        REQUIRE(pipe(from_parent) == 0);
        pid_ = fork();
        if (pid_ == 0) {
            close(to_parent[0]);
            close(from_parent[1]);
            std::_Exit(child(to_parent[1], from_parent[0]));
        }
        close(to_parent[1]);
        close(from_parent[0]);
        from_child_ = to_parent[0];
        to_child_ = from_parent[1];
        const nlohmann::json theirs = receive_json(from_child_);
        remote = theirs.at("region").get<RemoteMemoryRegion>();
        PreparedChannel prepared = prepare(region);
        send_json(to_child_, {{"endpoint", prepared.endpoint()}});
        channel.emplace(std::move(prepared).handshake(theirs.at("endpoint").get<ChannelEndpoint>()));
        char ready = 0;
        REQUIRE(read(from_child_, &ready, 1) == 1);  // the child's side is connected too
    }
    ~Peer() {
        if (pid_ > 0) {
            (void)!write(to_child_, "q", 1);
            waitpid(pid_, nullptr, 0);
        }
        close(to_child_);
        close(from_child_);
        unsetenv("RDMACHAN_SOFT_TRANSPORT");
    }
    // Kills the child and reaps it; true if SIGKILL ended it.
    bool kill() {
        (void)!write(to_child_, "k", 1);
        int status = 0;
        const bool reaped = waitpid(pid_, &status, 0) == pid_;
        pid_ = -1;
        return reaped && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    }

    std::optional<Channel> channel;
    MemoryRegion region;
    RemoteMemoryRegion remote;

private:
    pid_t pid_ = -1;
    int to_child_ = -1;
    int from_child_ = -1;
};

}  // namespace

TEST_CASE("a peer that dies while coroutines are suspended in co_await: each gets the error, naming the peer") {
    for (const std::string transport : {"auto", "tcp"}) {
        CAPTURE(transport);
        Peer peer(transport.c_str());
        net::io_context io;
        const RemoteMemoryRegion remote = peer.remote;
        AsyncChannel channel(io, std::move(*peer.channel));
        const std::string name = channel.channel().peer();
        CHECK_FALSE(name.empty());

        // A receive that waits across the peer's death, and writes until one fails.
        std::optional<WorkResult> received;
        std::optional<WorkResult> failed_write;
        bool killed = false;
        int attempts = 0;
        net::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                received.emplace(co_await channel.async_receive(peer.region.slice(0, 64), net::use_awaitable));
            },
            net::detached);
        net::co_spawn(
            io,
            [&]() -> net::awaitable<void> {
                const WorkResult first = co_await channel.async_write(peer.region.slice(0, 64), remote.slice(0, 64), net::use_awaitable);
                REQUIRE(first.ok());
                killed = peer.kill();
                // A write may still land in memory the dead process left mapped (the same-host
                // path) until the device has noticed the death; the first that cannot be
                // delivered fails. Between writes the io_context is free for the receive.
                const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(15);
                while (std::chrono::steady_clock::now() < until) {
                    ++attempts;
                    WorkResult result = co_await channel.async_write(peer.region.slice(0, 64), remote.slice(0, 64), net::use_awaitable);
                    if (!result.ok()) {
                        failed_write.emplace(std::move(result));
                        break;
                    }
                    net::steady_timer pause(io, std::chrono::milliseconds(2));
                    co_await pause.async_wait(net::use_awaitable);
                }
            },
            net::detached);
        const bool ended = test::run_until(io, [&] { return failed_write.has_value() && received.has_value(); });
        CAPTURE(attempts);
        CAPTURE(failed_write.has_value());
        CAPTURE(received.has_value());
        REQUIRE(ended);
        CHECK(killed);
        CHECK(failed_write->error().peer == name);
        CHECK(failed_write->error().message().find(name) != std::string::npos);
        MESSAGE(transport << ": the write: " << failed_write->error().message());
        REQUIRE_FALSE(received->ok());
        CHECK(received->error().peer == name);
        MESSAGE(transport << ": the receive: " << received->error().message());
        CHECK_FALSE(channel.channel().healthy());
    }
}
