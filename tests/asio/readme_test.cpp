// README.md's coroutine program ("In an event loop"), compiled from README.md itself
// (readme_block.cmake extracts the block) and run against a peer channel in this process.
#include <doctest/doctest.h>

#include <cstdio>
#include <nlohmann/json.hpp>
#include <vector>

#include "readme_includes.inc"
#include "tests/asio/asio_test_support.hpp"

using namespace rdmachan;

namespace {

// The names the README's program uses, as the README's first program defines them.
void readme_program(PreparedChannel prepared, const nlohmann::json& peer_json, const RemoteMemoryRegion& peer_region,
                    std::vector<std::uint8_t>& buffer) {
#include "readme_program.inc"
}

}  // namespace

TEST_CASE("README, In an event loop: the coroutine program writes, reads and sends to its peer") {
    PreparedChannel prepared = ChannelBuilder().device("soft").build();
    PreparedChannel peer_prepared = ChannelBuilder().device("soft").build();
    const nlohmann::json peer_json = peer_prepared.endpoint();
    Channel peer = std::move(peer_prepared).handshake(prepared.endpoint());
    std::vector<std::uint8_t> peer_memory(8192, 0);
    MemoryRegion peer_memory_region = peer.register_memory(peer_memory.data(), peer_memory.size());
    PendingWork received = peer.post_receive(peer_memory_region.slice(4096, 64));

    std::vector<std::uint8_t> buffer(1 << 20);
    for (std::size_t i = 0; i < 4096; ++i) buffer[i] = static_cast<std::uint8_t>(i * 7);
    readme_program(std::move(prepared), peer_json, peer_memory_region.remote(), buffer);

    const WorkResult message = received.wait();
    REQUIRE(message.ok());
    CHECK(message.completion().immediate == 7u);
    CHECK(message.completion().bytes == 64);
    for (std::size_t i = 0; i < 4096; ++i) {
        REQUIRE(peer_memory[i] == buffer[i]);         // the write
        REQUIRE(buffer[4096 + i] == peer_memory[i]);  // the read back
    }
}
