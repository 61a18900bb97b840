// Test helpers for rdmachan::asio: connected channels inside this process on the software
// device (both ends' queue pairs handshake with each other directly), and the Boost.Asio headers
// the suites use, included one way.
#pragma once

#include "rdmachan/asio.hpp"  // first: it tells Boost 1.74 about clang's coroutines

#include <boost/asio/awaitable.hpp>
#include <boost/asio/bind_executor.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/read.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/use_future.hpp>
#include <boost/asio/write.hpp>

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "rdmachan/channel.hpp"
#include "rdmachan/multi_channel.hpp"

namespace rdmachan::test {

struct ChannelPair {
    Channel a;
    Channel b;
};

inline ChannelPair connect_pair(std::chrono::milliseconds deadline = std::chrono::seconds(10)) {
    const ChannelSettings settings = ChannelBuilder().device("soft").deadline(deadline).settings();
    PreparedChannel first = ChannelBuilder(settings).build();
    PreparedChannel second = ChannelBuilder(settings).build();
    const ChannelEndpoint first_endpoint = first.endpoint();
    const ChannelEndpoint second_endpoint = second.endpoint();
    return {std::move(first).handshake(second_endpoint), std::move(second).handshake(first_endpoint)};
}

inline std::vector<MultiChannel> make_world(std::uint32_t size,
                                            MultiChannelMode mode = MultiChannelMode::reliable_connected) {
    std::vector<PreparedMultiChannel> prepared;
    std::vector<Endpoint> table;
    for (std::uint32_t rank = 0; rank < size; ++rank) {
        prepared.push_back(MultiChannelBuilder(ChannelBuilder().device("soft").deadline(std::chrono::seconds(10)))
                               .rank(rank)
                               .world_size(size)
                               .mode(mode)
                               .build());
        table.push_back(nlohmann::json(prepared.back().endpoint()).get<Endpoint>());
    }
    std::vector<MultiChannel> world;
    for (std::uint32_t rank = 0; rank < size; ++rank) world.push_back(std::move(prepared[rank]).handshake(table));
    return world;
}

// Runs the io_context until `done` says so or 20 s passed; false on the timeout.
template <typename Done>
bool run_until(boost::asio::io_context& io, Done done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done() && std::chrono::steady_clock::now() < until) {
        io.restart();
        io.run_for(std::chrono::milliseconds(10));
    }
    return done();
}

}  // namespace rdmachan::test
