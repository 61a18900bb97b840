// The engine's slot table and its linked index queues (src/slot_table.hpp,
// src/linked_index_queue.hpp): what a ticket names, when it goes stale, and the wr_id space the
// tickets leave to the engine's own receive buffers.
#include <doctest/doctest.h>

#include <cstdint>
#include <set>
#include <vector>

#include "rdmachan/error.hpp"
#include "src/linked_index_queue.hpp"
#include "src/slot_table.hpp"

using namespace rdmachan::detail;
using rdmachan::Operation;

TEST_CASE("a ticket names its slot until the slot is released, then never again") {
    SlotTable table;
    table.allocate(4);
    REQUIRE(table.size() == 4);
    const std::uint64_t first = table.claim(7, Operation::rdma_write);
    CHECK(static_cast<std::uint32_t>(first) == 0);  // slot 0 is on top of the free stack
    Slot* slot = table.find(first);
    REQUIRE(slot != nullptr);
    CHECK(slot->peer == 7);
    CHECK(slot->operation == Operation::rdma_write);
    CHECK(slot->state == SlotState::pending);
    CHECK(slot->shared_queue == nullptr);
    CHECK(table.find(first | kFinalRequest) == slot);  // the final request's wr_id names it too

    table.release(static_cast<std::uint32_t>(first));
    CHECK(table.find(first) == nullptr);
    const std::uint64_t second = table.claim(7, Operation::rdma_write);
    CHECK(static_cast<std::uint32_t>(second) == static_cast<std::uint32_t>(first));
    CHECK(second != first);  // a new generation
    CHECK(table.find(first) == nullptr);
    CHECK(table.find(second) != nullptr);
}

TEST_CASE("the free slots run out, and every claimed slot is a different one") {
    SlotTable table;
    table.allocate(3);
    std::set<std::uint32_t> slots;
    while (table.has_free()) slots.insert(static_cast<std::uint32_t>(table.claim(0, Operation::send)));
    CHECK(slots == std::set<std::uint32_t>{0, 1, 2});
    table.release(1);
    REQUIRE(table.has_free());
    CHECK(static_cast<std::uint32_t>(table.claim(0, Operation::send)) == 1);
}

TEST_CASE("no ticket sets bit 63, which names the engine's receive buffers, however long a slot is reused") {
    SlotTable table;
    table.allocate(2);
    // A slot near the end of its generations: reused 2^31 times by a service that runs for days.
    table[0].generation = kGenerationMask - 1;
    for (int round = 0; round < 4; ++round) {
        const std::uint64_t ticket = table.claim(0, Operation::rdma_read);
        CHECK((ticket & kEngineReceiveBuffer) == 0);
        CHECK(((ticket | kFinalRequest) & kEngineReceiveBuffer) == 0);
        CHECK(table.find(ticket) != nullptr);
        table.release(static_cast<std::uint32_t>(ticket));
    }
    CHECK(table[0].generation == 2);  // wrapped within 31 bits
    // A receive buffer's wr_id finds no slot, even one pending in generation 0 at that index.
    const std::uint64_t pending = table.claim(0, Operation::receive);
    REQUIRE(static_cast<std::uint32_t>(pending) == 0);
    CHECK(table.find(kEngineReceiveBuffer | 0) == nullptr);
    CHECK(table.find(kNoTicket) == nullptr);
}

TEST_CASE("a table larger than the wr_id's slot bits is refused") {
    SlotTable table;
    CHECK_THROWS_AS(table.allocate(kFinalRequest - 1), rdmachan::Error);
}

TEST_CASE("linked index queues sharing one array of links are each first in, first out") {
    std::vector<std::uint32_t> links(8, LinkedIndexQueue::kNone);
    LinkedIndexQueue left;
    LinkedIndexQueue right;
    for (std::uint32_t item : {3u, 0u, 6u}) left.push(links, item);
    for (std::uint32_t item : {5u, 1u}) right.push(links, item);
    CHECK(left.size() == 3);
    CHECK(right.size() == 2);
    CHECK(left.pop(links) == 3);
    CHECK(right.pop(links) == 5);
    left.push(links, 3);  // an index popped may be pushed again
    CHECK(left.pop(links) == 0);
    CHECK(left.pop(links) == 6);
    CHECK(left.pop(links) == 3);
    CHECK(left.empty());
    CHECK(right.pop(links) == 1);
    CHECK(right.empty());
}
