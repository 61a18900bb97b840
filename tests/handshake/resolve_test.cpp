// handshake::resolve: numeric addresses taken as they are, without the thread Asio's resolver
// starts on each io_context; names through the resolver.
#include <doctest/doctest.h>
#include <net/if.h>

#include <chrono>
#include <filesystem>
#include <string>
#include <vector>

#include "handshake/connection.hpp"
#include "handshake/resolve.hpp"

using namespace std::chrono_literals;
using rdmachan::handshake::tcp;
namespace asio = rdmachan::handshake::asio;

namespace {

std::size_t threads_of_this_process() {
    std::size_t count = 0;
    for ([[maybe_unused]] const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) ++count;
    return count;
}

struct Resolved {
    std::vector<tcp::endpoint> endpoints;
    std::size_t threads_started = 0;  // counted while the io_context, and any resolver thread, lives
};

Resolved resolve_on_fresh_context(const std::string& host, const std::string& port) {
    Resolved resolved;
    asio::io_context io;
    const std::size_t before = threads_of_this_process();
    auto resolve = [&]() -> rdmachan::handshake::Task<void> {
        resolved.endpoints = co_await rdmachan::handshake::resolve(host, port);
    };
    REQUIRE(rdmachan::handshake::run_until(io, resolve(), std::chrono::steady_clock::now() + 10s));
    resolved.threads_started = threads_of_this_process() - before;
    return resolved;
}

}  // namespace

TEST_CASE("a numeric address is taken as it is, starting no resolver thread") {
    const Resolved v4 = resolve_on_fresh_context("127.0.0.1", "4242");
    REQUIRE(v4.endpoints.size() == 1);
    CHECK(v4.endpoints[0] == tcp::endpoint(asio::ip::make_address("127.0.0.1"), 4242));
    CHECK(v4.threads_started == 0);

    const Resolved v6 = resolve_on_fresh_context("::1", "65535");
    REQUIRE(v6.endpoints.size() == 1);
    CHECK(v6.endpoints[0] == tcp::endpoint(asio::ip::make_address("::1"), 65535));
    CHECK(v6.threads_started == 0);

    // A link-local address with its interface: the scope is kept.
    const Resolved scoped = resolve_on_fresh_context("fe80::1%lo", "7");
    REQUIRE(scoped.endpoints.size() == 1);
    REQUIRE(scoped.endpoints[0].address().is_v6());
    CHECK(scoped.endpoints[0].address().to_v6().scope_id() == if_nametoindex("lo"));
    CHECK(scoped.threads_started == 0);
}

TEST_CASE("a name goes through the resolver, whose thread the count above would see") {
    // What the numeric path spares: on this Asio the first resolve of an io_context starts a
    // thread. If it ever stops doing so, this case says the numeric case's count proves nothing.
    const Resolved named = resolve_on_fresh_context("localhost", "4242");
    REQUIRE_FALSE(named.endpoints.empty());
    for (const tcp::endpoint& endpoint : named.endpoints) {
        CHECK(endpoint.address().is_loopback());
        CHECK(endpoint.port() == 4242);
    }
    CHECK(named.threads_started == 1);
}
