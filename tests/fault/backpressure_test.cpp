// Limits: more work than a queue holds is held back (backpressure) or refused as an error value
// saying so — never posted over the ring. Writes beyond the send budget (max_send_wr) and
// receives beyond the receive queue's capacity wait for room until the deadline; a post with every
// operation slot holding an untaken result is refused at once, saying so.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <string>
#include <cstring>
#include <thread>
#include <vector>

#include "rdmachan/channel.hpp"

using namespace rdmachan;
using namespace std::chrono_literals;

namespace {

struct Pair {
    Channel a;
    Channel b;
};

Pair connect_pair(const ChannelBuilder& builder) {
    PreparedChannel first = ChannelBuilder(builder.settings()).build();
    PreparedChannel second = ChannelBuilder(builder.settings()).build();
    const ChannelEndpoint first_endpoint = first.endpoint();
    const ChannelEndpoint second_endpoint = second.endpoint();
    return {std::move(first).handshake(second_endpoint), std::move(second).handshake(first_endpoint)};
}

}  // namespace

TEST_CASE("receives beyond the receive queue wait for room, and say so when the deadline passes") {
    Pair pair = connect_pair(ChannelBuilder().max_recv_wr(4).deadline(400ms));
    std::vector<std::uint8_t> inbox(8 * 64, 0), outbox(64, 0x5a);
    MemoryRegion in = pair.b.register_memory(inbox.data(), inbox.size());
    MemoryRegion out = pair.a.register_memory(outbox.data(), outbox.size());

    std::vector<PendingWork> receives;
    for (std::uint32_t index = 0; index < 4; ++index) receives.push_back(pair.b.post_receive(in.slice(index * 64, 64)));
    // The fifth finds the ring full; nobody sends, so it is refused at the deadline, unposted.
    const auto started = std::chrono::steady_clock::now();
    PendingWork refused = pair.b.post_receive(in.slice(4 * 64, 64));
    const WorkResult fifth = refused.wait();
    REQUIRE_FALSE(fifth.ok());
    CAPTURE(fifth.error().message());
    CHECK(fifth.error().not_posted != nullptr);
    CHECK(fifth.error().message().find("stayed full") != std::string::npos);
    CHECK(std::chrono::steady_clock::now() - started >= 400ms);

    // The four posted ones are intact: each send lands in its own buffer, in order.
    for (std::uint32_t index = 0; index < 4; ++index) {
        outbox[0] = static_cast<std::uint8_t>(index + 1);
        REQUIRE(pair.a.send(out.slice(0, 64)).ok());
    }
    for (std::uint32_t index = 0; index < 4; ++index) {
        CHECK(receives[index].wait().ok());
        CHECK(inbox[index * 64] == index + 1);
    }
    CHECK(inbox[4 * 64] == 0);  // the refused receive's buffer was never handed to the device
}

TEST_CASE("a receive posted while the receive queue is full goes in as soon as a completion frees room") {
    // The default deadline: how long the post waits is not under test here (the case above tests
    // the deadline), and with 400 ms a sender thread the scheduler started 1.25 s late left the
    // post refused and the last send without a receive (the soak's round 64 at fa8990e).
    Pair pair = connect_pair(ChannelBuilder().max_recv_wr(4));
    std::vector<std::uint8_t> inbox(8 * 64, 0), outbox(64, 0x5a);
    MemoryRegion in = pair.b.register_memory(inbox.data(), inbox.size());
    MemoryRegion out = pair.a.register_memory(outbox.data(), outbox.size());
    std::vector<PendingWork> more;
    for (std::uint32_t index = 0; index < 4; ++index) more.push_back(pair.b.post_receive(in.slice(index * 64, 64)));
    // The sender starts late so the post below finds the ring full; room comes only from this
    // send's receive completing, so the post must not return before the send was issued.
    std::atomic<bool> sending{false};
    std::thread sender([&] {
        std::this_thread::sleep_for(50ms);
        outbox[0] = 0xee;
        sending = true;
        pair.a.send(out.slice(0, 64));
    });
    PendingWork waiting = pair.b.post_receive(in.slice(5 * 64, 64));  // waits for room
    CHECK(sending.load());  // the post waited for the send that made room
    sender.join();
    CHECK(more[0].wait().ok());
    for (std::uint32_t index = 1; index < 4; ++index) {
        outbox[0] = static_cast<std::uint8_t>(0xf0 + index);
        REQUIRE(pair.a.send(out.slice(0, 64)).ok());
        CHECK(more[index].wait().ok());
    }
    outbox[0] = 0x99;
    REQUIRE(pair.a.send(out.slice(0, 64)).ok());
    CHECK(waiting.wait().ok());
    CHECK(inbox[5 * 64] == 0x99);
}

TEST_CASE("writes beyond the send budget wait for room as completions come, and all land") {
    // max_send_wr 4, sixteen writes posted without waiting: from the fifth on, each post waits
    // until earlier writes complete (the budget), instead of being refused.
    Pair pair = connect_pair(ChannelBuilder().max_send_wr(4).max_recv_wr(16));
    constexpr std::uint32_t kWrites = 16;
    std::vector<std::uint8_t> target(kWrites * 64, 0), source(kWrites * 64, 0);
    for (std::uint32_t index = 0; index < source.size(); ++index) source[index] = static_cast<std::uint8_t>(index * 7 + 1);
    MemoryRegion into = pair.b.register_memory(target.data(), target.size());
    MemoryRegion from = pair.a.register_memory(source.data(), source.size());
    std::vector<PendingWork> writes;
    for (std::uint32_t index = 0; index < kWrites; ++index) {
        writes.push_back(pair.a.post_write(from.slice(index * 64, 64), into.remote().slice(index * 64, 64)));
    }
    for (std::uint32_t index = 0; index < kWrites; ++index) {
        const WorkResult result = writes[index].wait();
        CAPTURE(index);
        CHECK_MESSAGE(result.ok(), (result.ok() ? std::string() : result.error().message()));
    }
    CHECK(target == source);
}

TEST_CASE("a post with every operation slot holding an untaken result is refused at once, naming why") {
    // max_send_wr 2 + max_recv_wr 2: four slots. Four writes whose handles are kept hold all
    // four, completed or not; only taking a result frees one, so the fifth post cannot be helped
    // by waiting: it is refused at once, long before the 3 s deadline.
    Pair pair = connect_pair(ChannelBuilder().max_send_wr(2).max_recv_wr(2).deadline(3000ms));
    std::vector<std::uint8_t> target(6 * 64, 0), source(6 * 64, 0x3c);
    MemoryRegion into = pair.b.register_memory(target.data(), target.size());
    MemoryRegion from = pair.a.register_memory(source.data(), source.size());
    std::vector<PendingWork> held;
    for (std::uint32_t index = 0; index < 4; ++index) {
        held.push_back(pair.a.post_write(from.slice(index * 64, 64), into.remote().slice(index * 64, 64)));
    }
    const auto started = std::chrono::steady_clock::now();
    PendingWork fifth = pair.a.post_write(from.slice(4 * 64, 64), into.remote().slice(4 * 64, 64));
    const WorkResult refused = fifth.wait();
    const auto waited = std::chrono::steady_clock::now() - started;
    REQUIRE_FALSE(refused.ok());
    CAPTURE(refused.error().message());
    CHECK(refused.error().not_posted != nullptr);
    CHECK(refused.error().message().find("every operation slot holds a result not taken yet") != std::string::npos);
    CHECK(waited < 1000ms);
    CHECK(target[4 * 64] == 0);  // nothing was posted for it

    // A handle polled for the refusal gets it too, instead of waiting forever.
    PendingWork polled = pair.a.post_write(from.slice(4 * 64, 64), into.remote().slice(4 * 64, 64));
    const std::optional<WorkResult> polled_result = polled.poll();
    REQUIRE(polled_result.has_value());
    CHECK_FALSE(polled_result->ok());

    // Taking one result frees its slot: the next write goes.
    REQUIRE(held[0].wait().ok());
    REQUIRE(pair.a.post_write(from.slice(5 * 64, 64), into.remote().slice(5 * 64, 64)).wait().ok());
    CHECK(target[5 * 64] == 0x3c);
    for (std::uint32_t index = 1; index < 4; ++index) CHECK(held[index].wait().ok());
}
