// Peers the application adds and removes itself (PreparedMultiChannel::open, MultiChannel::
// offer_peer, add_peer, remove_peer): endpoints carried as JSON text, as a store of the
// application's own would carry them. RC, or DC with RDMACHAN_TEST_MODE=dc. The members live in
// this process, one MultiChannel each, all used from this thread.
#include <doctest/doctest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "rdmachan/multi_channel.hpp"

using namespace rdmachan;
using namespace std::chrono_literals;

namespace {

constexpr std::uint32_t kCapacity = 4;
constexpr std::size_t kSlotBytes = 128;

MultiChannelMode test_mode() {
    const char* mode = std::getenv("RDMACHAN_TEST_MODE");
    return mode != nullptr && std::string(mode) == "dc" ? MultiChannelMode::dynamically_connected
                                                        : MultiChannelMode::reliable_connected;
}

struct Process {
    std::vector<std::uint8_t> inbox = std::vector<std::uint8_t>(kCapacity * kSlotBytes, 0);
    std::vector<std::uint8_t> outbox = std::vector<std::uint8_t>(kSlotBytes, 0);
    std::unique_ptr<MultiChannel> channel;
    MemoryRegion inbox_region;
    MemoryRegion outbox_region;
};

std::unique_ptr<Process> open_process(std::uint32_t rank, MultiChannelMode mode = test_mode()) {
    auto process = std::make_unique<Process>();
    PreparedMultiChannel prepared =
        MultiChannelBuilder(ChannelBuilder().deadline(3s)).rank(rank).world_size(kCapacity).mode(mode).dc_initiators(2).build();
    process->inbox_region = prepared.register_memory(process->inbox.data(), process->inbox.size());
    process->outbox_region = prepared.register_memory(process->outbox.data(), process->outbox.size());
    prepared.publish_region("inbox", process->inbox_region);
    process->channel = std::make_unique<MultiChannel>(std::move(prepared).open());
    return process;
}

// Each side offers, the offers cross as JSON text, each side adds the other.
void connect(Process& a, Process& b) {
    const std::string from_a = serialize_endpoint(a.channel->offer_peer(b.channel->rank()));
    const std::string from_b = serialize_endpoint(b.channel->offer_peer(a.channel->rank()));
    a.channel->add_peer(parse_endpoint(from_b));
    b.channel->add_peer(parse_endpoint(from_a));
}

std::uint8_t pattern(std::uint32_t from, std::uint32_t to, std::size_t index, std::uint32_t round) {
    return static_cast<std::uint8_t>(from * 29 + to * 5 + index + round * 11);
}

WorkResult write_share(Process& from, Process& to, std::uint32_t round) {
    const std::uint32_t me = from.channel->rank();
    const std::uint32_t peer = to.channel->rank();
    for (std::size_t i = 0; i < kSlotBytes; ++i) from.outbox[i] = pattern(me, peer, i, round);
    const RemoteMemoryRegion inbox = from.channel->remote_region(peer, "inbox").region.slice(me * kSlotBytes, kSlotBytes);
    return from.channel->write(peer, from.outbox_region.slice(0, kSlotBytes), inbox);
}

// Every ordered pair writes its share and the receiver checks every byte; then each reads its
// share back from the other's inbox.
void exchange(const std::vector<Process*>& processes, std::uint32_t round) {
    for (Process* from : processes) {
        for (Process* to : processes) {
            if (from == to) continue;
            const WorkResult result = write_share(*from, *to, round);
            REQUIRE_MESSAGE(result.ok(), from->channel->rank() << " -> " << to->channel->rank() << ": " << result.error().message());
            const std::uint32_t me = from->channel->rank();
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < kSlotBytes; ++i) {
                wrong += to->inbox[me * kSlotBytes + i] != pattern(me, to->channel->rank(), i, round);
            }
            CHECK_MESSAGE(wrong == 0, to->channel->rank() << "'s inbox from " << me << ": " << wrong << " bytes wrong");
            std::vector<std::uint8_t> back(kSlotBytes, 0);
            MemoryRegion back_region = from->channel->register_memory(back.data(), back.size());
            const RemoteMemoryRegion inbox =
                from->channel->remote_region(to->channel->rank(), "inbox").region.slice(me * kSlotBytes, kSlotBytes);
            REQUIRE(from->channel->read(to->channel->rank(), back_region.slice(0, kSlotBytes), inbox).ok());
            CHECK(std::equal(back.begin(), back.end(), to->inbox.begin() + me * kSlotBytes));
        }
    }
}

}  // namespace

TEST_CASE("peers added and removed by the application while the others keep moving bytes") {
    auto zero = open_process(0);
    auto one = open_process(1);
    auto two = open_process(2);

    // Nobody added yet: operations on the slots fail naming why.
    const WorkResult early = zero->channel->write(1, zero->outbox_region.slice(0, 8), RemoteMemoryRegion{0x1000, 8, 1});
    REQUIRE_FALSE(early.ok());
    CHECK(early.error().message().find("was not added") != std::string::npos);

    connect(*zero, *one);
    exchange({zero.get(), one.get()}, 1);
    connect(*zero, *two);
    connect(*one, *two);
    exchange({zero.get(), one.get(), two.get()}, 2);
    CHECK(zero->channel->peer_session(2) == two->channel->peer_session(2));

    // One is removed on both sides: its slot fails again, naming why; 0 and 2 go on.
    zero->channel->remove_peer(1);
    two->channel->remove_peer(1);
    one->channel->remove_peer(0);
    one->channel->remove_peer(2);
    const WorkResult removed = write_share(*zero, *two, 3);
    CHECK(removed.ok());
    const WorkResult gone = zero->channel->write(1, zero->outbox_region.slice(0, 8), RemoteMemoryRegion{0x1000, 8, 1});
    REQUIRE_FALSE(gone.ok());
    CHECK(gone.error().message().find("was removed") != std::string::npos);
    CHECK_THROWS_WITH_AS(zero->channel->remote_region(1, "inbox"), doctest::Contains("no region"), Error);
    exchange({zero.get(), two.get()}, 4);

    // A new process takes slot 1 (a new session); the others connect it as they did the first.
    one.reset();
    auto newcomer = open_process(1);
    connect(*zero, *newcomer);
    connect(*two, *newcomer);
    CHECK(zero->channel->peer_session(1) != 0);
    exchange({zero.get(), newcomer.get(), two.get()}, 5);
}

TEST_CASE("add_peer and offer_peer refuse what does not fit, naming the peer and the field") {
    auto zero = open_process(0);
    auto one = open_process(1);
    const Endpoint offer = one->channel->offer_peer(0);

    CHECK_THROWS_WITH_AS(zero->channel->offer_peer(0), doctest::Contains("own rank"), Error);
    CHECK_THROWS_WITH_AS(zero->channel->offer_peer(kCapacity), doctest::Contains("out of range"), Error);
    Endpoint own = offer;
    own.rank = 0;
    CHECK_THROWS_WITH_AS(zero->channel->add_peer(own), doctest::Contains("'rank' is this process's own rank"), Error);
    Endpoint beyond = offer;
    beyond.rank = kCapacity;
    CHECK_THROWS_WITH_AS(zero->channel->add_peer(beyond), doctest::Contains("out of range"), Error);
    Endpoint other_device = offer;
    other_device.device = offer.device == DeviceKind::soft ? DeviceKind::mlx5 : DeviceKind::soft;
    CHECK_THROWS_WITH_AS(zero->channel->add_peer(other_device), doctest::Contains("'device'"), Error);
    if (test_mode() == MultiChannelMode::reliable_connected) {
        // Added before this side offered anything: the peer would have no queue pair to talk to.
        CHECK_THROWS_WITH_AS(zero->channel->add_peer(offer), doctest::Contains("offer_peer(1) first"), Error);
        (void)zero->channel->offer_peer(1);
        Endpoint for_someone_else = offer;
        for_someone_else.rc[0].peer = 3;
        CHECK_THROWS_WITH_AS(zero->channel->add_peer(for_someone_else), doctest::Contains("'rc' has no entry for rank 0"), Error);
        auto dc_process = open_process(2, MultiChannelMode::dynamically_connected);
        CHECK_THROWS_WITH_AS(zero->channel->add_peer(dc_process->channel->offer_peer(0)),
                             doctest::Contains("the peer is in DC mode"), Error);
    } else {
        Endpoint no_target = offer;
        no_target.dc.clear();
        CHECK_THROWS_WITH_AS(zero->channel->add_peer(no_target), doctest::Contains("'dc' is empty"), Error);
    }
    CHECK_THROWS_WITH_AS(zero->channel->barrier(), doctest::Contains("peers added by add_peer have no barrier"), Error);

    // A multi-channel connected as a fixed world does not take added peers.
    PreparedMultiChannel first = MultiChannelBuilder().rank(0).world_size(2).mode(test_mode()).dc_initiators(2).build();
    PreparedMultiChannel second = MultiChannelBuilder().rank(1).world_size(2).mode(test_mode()).dc_initiators(2).build();
    const std::vector<Endpoint> table{first.endpoint(), second.endpoint()};
    MultiChannel fixed = std::move(first).handshake(table);
    MultiChannel fixed_second = std::move(second).handshake(table);
    CHECK_THROWS_WITH_AS(fixed.add_peer(offer), doctest::Contains("not from PreparedMultiChannel::open()"), Error);
    CHECK_THROWS_WITH_AS(fixed.remove_peer(1), doctest::Contains("not from PreparedMultiChannel::open()"), Error);
}
