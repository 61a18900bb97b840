// Membership through etcd (include/rdmachan/membership.hpp): members join a running service one
// by one, leave, fail by their lease, reconnect a broken pair, meet in barriers while members
// come and go, and refuse what is garbled or taken. Each case starts its own etcd on loopback (tests/handshake/etcd_process.hpp). The
// members live in this process, one MultiChannel each: one thread polls those already there while
// another joins or leaves, as each member's own event loop would. RC, or DC with
// RDMACHAN_TEST_MODE=dc.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "handshake/etcd_store.hpp"
#include "handshake/membership_records.hpp"
#include "rdmachan/multi_channel.hpp"
#include "tests/error_of.hpp"
#include "tests/handshake/etcd_process.hpp"
#include "tests/loopback_port.hpp"

using namespace rdmachan;
using rdmachan::test::error_of;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const bool etcd_missing = test::etcd_missing_said();

constexpr std::uint32_t kCapacity = 8;
constexpr std::size_t kSlotBytes = 256;  // each member's share of every other's "inbox" region

MultiChannelMode test_mode() {
    const char* mode = std::getenv("RDMACHAN_TEST_MODE");
    return mode != nullptr && std::string(mode) == "dc" ? MultiChannelMode::dynamically_connected
                                                        : MultiChannelMode::reliable_connected;
}

// Waits until etcd answers (about a second after it starts).
void wait_for_etcd(const test::EtcdProcess& etcd) {
    handshake::EtcdSettings settings;
    settings.endpoint = etcd.endpoint();
    handshake::connect_etcd_store(settings)->get("probe", Clock::now() + 20s);
}

struct Member {
    std::vector<std::uint8_t> inbox = std::vector<std::uint8_t>(kCapacity * kSlotBytes, 0);
    std::vector<std::uint8_t> outbox = std::vector<std::uint8_t>(kSlotBytes, 0);
    std::unique_ptr<MultiChannel> channel;
    MemoryRegion inbox_region;
    MemoryRegion outbox_region;
    std::vector<PeerEvent> events;  // everything poll_peer_events reported, in order

    void poll() {
        for (PeerEvent& event : channel->poll_peer_events()) events.push_back(std::move(event));
    }
    bool saw(PeerEvent::Kind kind, std::uint32_t peer) const {
        return std::any_of(events.begin(), events.end(),
                           [&](const PeerEvent& event) { return event.kind == kind && event.peer == peer; });
    }
    std::size_t count(PeerEvent::Kind kind, std::uint32_t peer) const {
        return static_cast<std::size_t>(std::count_if(
            events.begin(), events.end(), [&](const PeerEvent& event) { return event.kind == kind && event.peer == peer; }));
    }
};

class Service {
  public:
    explicit Service(const test::EtcdProcess& etcd) : etcd_(etcd) {}

    MembershipSettings settings() const {
        MembershipSettings settings;
        settings.etcd = etcd_.endpoint();
        settings.key_prefix = "service/";
        settings.lease_ttl = 2s;
        settings.join_wait = 5s;
        return settings;
    }

    PreparedMultiChannel prepare(std::optional<std::uint32_t> id = std::nullopt) const {
        MultiChannelBuilder builder(ChannelBuilder().deadline(5s));
        builder.world_size(kCapacity).mode(test_mode()).dc_initiators(2).bootstrap(Bootstrap::etcd);
        if (id) builder.rank(*id);
        return builder.build();
    }

    // Joins a new member on another thread while this one polls the members already there.
    Member& join(MembershipSettings settings, std::optional<std::uint32_t> id = std::nullopt) {
        auto member = std::make_unique<Member>();
        PreparedMultiChannel prepared = prepare(id);
        member->inbox_region = prepared.register_memory(member->inbox.data(), member->inbox.size());
        member->outbox_region = prepared.register_memory(member->outbox.data(), member->outbox.size());
        prepared.publish_region("inbox", member->inbox_region);
        auto joined = std::async(std::launch::async, [prepared = std::move(prepared), settings]() mutable {
            return std::make_unique<MultiChannel>(std::move(prepared).join(settings));
        });
        while (joined.wait_for(1ms) != std::future_status::ready) poll_all();
        member->channel = joined.get();
        member->poll();  // what join() saw: the members it paired with
        members_.push_back(std::move(member));
        return *members_.back();
    }
    Member& join() { return join(settings()); }

    // `count` members joined, every pair connected.
    void join_paired(std::uint32_t count) {
        for (std::uint32_t index = 0; index < count; ++index) join();
        REQUIRE(poll_until([&] { return all_paired(); }));
    }

    void poll_all() {
        for (auto& member : members_) {
            if (member->channel) member->poll();
        }
    }

    // Polls every member until `done` or `limit`; returns whether `done` held.
    bool poll_until(const std::function<bool()>& done, Clock::duration limit = 10s) {
        const auto until = Clock::now() + limit;
        while (!done()) {
            if (Clock::now() >= until) {
                // What each member saw, for the failure's message.
                for (const auto& member : members_) {
                    for (const PeerEvent& event : member->events) {
                        MESSAGE("member " << member->channel->rank() << ": " << to_string(event.kind) << " " << event.peer
                                          << " " << event.reason);
                    }
                }
                return false;
            }
            poll_all();
            std::this_thread::sleep_for(1ms);
        }
        return true;
    }

    // Every member lists every other (and itself) as ready.
    bool all_paired() const {
        std::vector<std::uint32_t> ids;
        for (const auto& member : members_) ids.push_back(member->channel->rank());
        std::sort(ids.begin(), ids.end());
        return std::all_of(members_.begin(), members_.end(),
                           [&](const auto& member) { return member->channel->members() == ids; });
    }

    std::vector<std::unique_ptr<Member>>& members() { return members_; }

    // Leaves on another thread while this one polls the others; returns leave()'s result.
    LeaveResult leave(Member& leaving) {
        auto result = std::async(std::launch::async, [&leaving] { return leaving.channel->leave(); });
        while (result.wait_for(1ms) != std::future_status::ready) {
            for (auto& member : members_) {
                if (member.get() != &leaving) member->poll();
            }
        }
        return result.get();
    }

    void forget(Member& member) {
        members_.erase(std::remove_if(members_.begin(), members_.end(),
                                      [&](const auto& entry) { return entry.get() == &member; }),
                       members_.end());
    }

  private:
    const test::EtcdProcess& etcd_;
    std::vector<std::unique_ptr<Member>> members_;
};

std::uint8_t pattern(std::uint32_t from, std::uint32_t to, std::size_t index, std::uint32_t round) {
    return static_cast<std::uint8_t>(from * 31 + to * 7 + index + round * 13);
}

// Every member writes its share into every other member's inbox (slot `from`), and checks what
// arrived in its own, byte for byte.
void exchange(Service& service, std::uint32_t round) {
    auto& members = service.members();
    for (auto& from : members) {
        const std::uint32_t me = from->channel->rank();
        for (auto& to : members) {
            const std::uint32_t peer = to->channel->rank();
            for (std::size_t i = 0; i < kSlotBytes; ++i) from->outbox[i] = pattern(me, peer, i, round);
            const RemoteMemoryRegion inbox = from->channel->remote_region(peer, "inbox").region.slice(me * kSlotBytes, kSlotBytes);
            const WorkResult result = from->channel->write(peer, from->outbox_region.slice(0, kSlotBytes), inbox);
            REQUIRE_MESSAGE(result.ok(), "member " << me << " -> " << peer << ": " << result.error().message());
        }
    }
    for (auto& to : members) {
        const std::uint32_t peer = to->channel->rank();
        for (auto& from : members) {
            const std::uint32_t me = from->channel->rank();
            std::size_t wrong = 0;
            for (std::size_t i = 0; i < kSlotBytes; ++i) wrong += to->inbox[me * kSlotBytes + i] != pattern(me, peer, i, round);
            CHECK_MESSAGE(wrong == 0, "member " << peer << "'s inbox from " << me << ": " << wrong << " bytes wrong");
        }
    }
}

}  // namespace

TEST_CASE("members join one by one, take the lowest free ids, and every pair moves bytes both ways; one leaves "
          "gracefully and a newcomer takes its id" * doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    Service service(etcd);
    for (std::uint32_t count = 1; count <= 4; ++count) {
        Member& member = service.join();
        CHECK(member.channel->rank() == count - 1);
        REQUIRE_MESSAGE(service.poll_until([&] { return service.all_paired(); }), "member " << count - 1 << " never paired");
        exchange(service, count);
    }
    // Each member saw every other join exactly once, and nothing failed.
    for (auto& member : service.members()) {
        for (auto& other : service.members()) {
            const std::uint32_t peer = other->channel->rank();
            if (peer == member->channel->rank()) continue;
            CHECK_MESSAGE(member->count(PeerEvent::Kind::joined, peer) == 1,
                          "member " << member->channel->rank() << " saw " << peer << " join "
                                    << member->count(PeerEvent::Kind::joined, peer) << " times");
        }
        for (const PeerEvent& event : member->events) {
            CHECK_MESSAGE(event.kind == PeerEvent::Kind::joined, to_string(event.kind) << " " << event.peer << ": " << event.reason);
        }
    }

    Member& leaving = *service.members()[1];
    std::map<std::uint32_t, RemoteMemoryRegion> inbox_of_one;
    for (auto& member : service.members()) inbox_of_one[member->channel->rank()] = member->channel->remote_region(1, "inbox").region;
    const std::uint64_t left_session = leaving.channel->peer_session(1);
    const auto leave_started = Clock::now();
    const LeaveResult result = service.leave(leaving);
    const auto leave_took = Clock::now() - leave_started;
    CHECK(result.ok());
    CHECK(result.released == std::vector<std::uint32_t>{0, 2, 3});
    MESSAGE("a graceful leave of 1 among 4 members: " << std::chrono::duration<double, std::milli>(leave_took).count()
                                                      << " ms until every member released it");
    CHECK_THROWS_WITH_AS(leaving.channel->leave(), doctest::Contains("already left"), Error);
    CHECK_FALSE(leaving.channel->write(0, leaving.outbox_region.slice(0, 8), leaving.channel->remote_region(0, "inbox").region.slice(0, 8)).ok());
    service.forget(leaving);
    for (auto& member : service.members()) {
        CHECK(member->saw(PeerEvent::Kind::left, 1));
        CHECK_FALSE(member->saw(PeerEvent::Kind::failed, 1));
        const WorkResult write =
            member->channel->write(1, member->outbox_region.slice(0, 8), inbox_of_one[member->channel->rank()].slice(0, 8));
        REQUIRE_FALSE(write.ok());
        CHECK(write.error().message().find("left the service") != std::string::npos);
        CHECK_THROWS_WITH_AS(member->channel->remote_region(1, "inbox"), doctest::Contains("no region"), Error);
    }
    exchange(service, 10);

    // A newcomer takes the lowest free id, 1, as a new session.
    Member& newcomer = service.join();
    CHECK(newcomer.channel->rank() == 1);
    REQUIRE(service.poll_until([&] { return service.all_paired(); }));
    CHECK(newcomer.channel->peer_session(1) != left_session);
    for (auto& member : service.members()) {
        if (member.get() != &newcomer) CHECK(member->count(PeerEvent::Kind::joined, 1) == 2);
    }
    exchange(service, 11);
}

// One barrier at one of the three levels, by `level` % 3: blocking, an unpolled handle polled to
// its end, a scoped handle waited for.
BarrierResult barrier_at_level(MultiChannel& channel, std::size_t level) {
    if (level % 3 == 0) return channel.barrier();
    if (level % 3 == 1) {
        PendingBarrier pending = channel.post_barrier();
        while (true) {
            if (std::optional<BarrierResult> result = pending.poll()) return std::move(*result);
        }
    }
    BarrierResult result;
    channel.scope([&](MultiScope& scope) { result = scope.post_barrier().wait(); });
    return result;
}

// Runs `rounds` barriers on every member of `members`, each on its own thread (a channel is used
// by one thread at a time: nobody else polls them meanwhile) and at its own level (member i at
// level i). Before barrier b a member marks that it entered b; once barrier b returned, every
// member must have entered it. `late`: the index of a member that comes 100 ms late to its first
// barrier.
void barriers_on_threads(std::vector<Member*> members, std::uint32_t rounds, std::optional<std::size_t> late = std::nullopt) {
    std::vector<std::atomic<std::uint32_t>> entered(kCapacity);
    std::vector<std::string> problems(members.size());
    std::vector<std::thread> threads;
    for (std::size_t index = 0; index < members.size(); ++index) {
        threads.emplace_back([&, index] {
            Member& member = *members[index];
            const std::uint32_t me = member.channel->rank();
            for (std::uint32_t round = 1; round <= rounds; ++round) {
                if (round % 5 == index % 5) std::this_thread::sleep_for(2ms);  // someone is always late
                if (round == 1 && late == index) std::this_thread::sleep_for(100ms);
                entered[me].store(round);
                const BarrierResult result = barrier_at_level(*member.channel, index);
                if (!result.ok()) {
                    problems[index] = "member " + std::to_string(me) + ", barrier " + std::to_string(round) + ": " + result.message();
                    return;
                }
                for (Member* other : members) {
                    const std::uint32_t peer = other->channel->rank();
                    if (entered[peer].load() < round) {
                        problems[index] = "member " + std::to_string(me) + " left barrier " + std::to_string(round) +
                                          " before member " + std::to_string(peer) + " entered it";
                        return;
                    }
                }
            }
        });
    }
    for (std::thread& thread : threads) thread.join();
    for (const std::string& problem : problems) CHECK_MESSAGE(problem.empty(), problem);
}

TEST_CASE("barriers among members: none returns before every member entered it; a newcomer is in from its first "
          "barrier; a member that leaves during one is not waited for; one that never comes is named" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    Service service(etcd);
    service.join_paired(3);
    std::vector<Member*> three;
    for (auto& member : service.members()) three.push_back(member.get());
    barriers_on_threads(three, 30);

    // A fourth member joins: its first barrier is everyone's next one.
    Member& fourth = service.join();
    REQUIRE(service.poll_until([&] { return service.all_paired(); }));
    std::vector<Member*> four = three;
    four.push_back(&fourth);
    barriers_on_threads(four, 30);

    // Member 2 leaves while 0, 1 and 3 wait for it in a barrier: they see it go and end the
    // barrier among themselves (each advances the membership while it waits).
    Member& leaving = *three[2];
    std::vector<std::thread> threads;
    std::vector<BarrierResult> results(3);
    std::vector<Member*> staying{three[0], three[1], &fourth};
    for (std::size_t index = 0; index < staying.size(); ++index) {
        threads.emplace_back([&, index] { results[index] = staying[index]->channel->barrier(); });
    }
    std::this_thread::sleep_for(100ms);
    const LeaveResult left = leaving.channel->leave();
    for (std::thread& thread : threads) thread.join();
    CHECK(left.ok());
    for (std::size_t index = 0; index < staying.size(); ++index) {
        CHECK_MESSAGE(results[index].ok(), "member " << staying[index]->channel->rank() << ": " << results[index].message());
    }
    service.forget(leaving);
    REQUIRE(service.poll_until([&] { return service.all_paired(); }));
    barriers_on_threads(staying, 10);

    // A newcomer takes id 2: the words the member that left wrote (its 60th barrier) are of
    // another pairing and do not count as the newcomer's arrival.
    Member& newcomer = service.join();
    REQUIRE(newcomer.channel->rank() == 2);
    REQUIRE(service.poll_until([&] { return service.all_paired(); }));
    staying.push_back(&newcomer);
    barriers_on_threads(staying, 10, staying.size() - 1);

    // A member that never comes to the barrier is named when the deadline (5 s) passes.
    const auto started = Clock::now();
    const BarrierResult alone = staying[0]->channel->barrier();
    REQUIRE_FALSE(alone.ok());
    CHECK(alone.failed_peers() == std::vector<std::uint32_t>{1, 2, 3});
    CHECK(alone.message().find("did not arrive at barrier") != std::string::npos);
    CHECK(Clock::now() - started >= 5s);
}

TEST_CASE("a member whose lease runs out is failed within the TTL + 1 s; its operations fail naming why" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    Service service(etcd);
    service.join_paired(3);
    // Dropped without leave(): its lease is no longer renewed, as for a process that died.
    Member& dropped = *service.members()[2];
    std::map<std::uint32_t, RemoteMemoryRegion> inbox_of_two;
    for (auto& member : service.members()) inbox_of_two[member->channel->rank()] = member->channel->remote_region(2, "inbox").region;
    const auto dropped_at = Clock::now();
    dropped.channel.reset();
    service.forget(dropped);
    const bool seen = service.poll_until(
        [&] {
            return std::all_of(service.members().begin(), service.members().end(),
                               [](const auto& member) { return member->saw(PeerEvent::Kind::failed, 2); });
        },
        10s);
    const double seconds = std::chrono::duration<double>(Clock::now() - dropped_at).count();
    REQUIRE(seen);
    MESSAGE("a member whose lease (TTL 2 s) stopped being renewed was seen failed after " << seconds << " s");
    CHECK(seconds < 2.0 + 1.0);
    for (auto& member : service.members()) {
        CHECK_FALSE(member->saw(PeerEvent::Kind::left, 2));
        const WorkResult write =
            member->channel->write(2, member->outbox_region.slice(0, 8), inbox_of_two[member->channel->rank()].slice(0, 8));
        REQUIRE_FALSE(write.ok());
        CHECK(write.error().message().find("failed") != std::string::npos);
    }
    exchange(service, 1);
}

TEST_CASE("a pair broken by a bad remote key is connected again while both members live" * doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    Service service(etcd);
    service.join_paired(3);
    Member& zero = *service.members()[0];
    Member& one = *service.members()[1];
    RemoteMemoryRegion wrong = zero.channel->remote_region(1, "inbox").region;
    wrong.rkey ^= 0x5a5a;
    const WorkResult bad = zero.channel->read(1, zero.outbox_region.slice(0, 8), wrong.slice(0, 8));
    REQUIRE_FALSE(bad.ok());
    if (test_mode() == MultiChannelMode::reliable_connected) {
        // RC: the queue pair is in ERR for good; the pair is reported failed by the queue pairs.
        CHECK_FALSE(zero.channel->healthy(1));
        REQUIRE(service.poll_until([&] { return zero.saw(PeerEvent::Kind::failed, 1); }));
    }
    zero.channel->reconnect(1);
    REQUIRE(service.poll_until([&] { return zero.saw(PeerEvent::Kind::reconnected, 1); }));
    if (test_mode() == MultiChannelMode::reliable_connected) {
        REQUIRE(service.poll_until([&] { return one.saw(PeerEvent::Kind::reconnected, 0); }));
    }
    CHECK(zero.channel->healthy(1));
    exchange(service, 2);
    // Member 2 was never touched.
    CHECK(service.members()[2]->count(PeerEvent::Kind::joined, 0) == 1);
    CHECK_FALSE(service.members()[2]->saw(PeerEvent::Kind::reconnected, 0));
}

TEST_CASE("automatic reconnection: a broken pair comes back within the attempts allowed" * doctest::skip(etcd_missing) *
          doctest::skip(test_mode() == MultiChannelMode::dynamically_connected)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    Service service(etcd);
    MembershipSettings settings = service.settings();
    settings.reconnect_attempts = 3;
    settings.reconnect_backoff = 20ms;
    service.join(settings);
    service.join(settings);
    REQUIRE(service.poll_until([&] { return service.all_paired(); }));
    Member& zero = *service.members()[0];
    RemoteMemoryRegion wrong = zero.channel->remote_region(1, "inbox").region;
    wrong.rkey ^= 0x77;
    REQUIRE_FALSE(zero.channel->write(1, zero.outbox_region.slice(0, 8), wrong.slice(0, 8)).ok());
    // Each side's operations work once it has seen the other connected to its new queue pair.
    Member& one = *service.members()[1];
    REQUIRE(service.poll_until(
        [&] { return zero.saw(PeerEvent::Kind::reconnected, 1) && one.saw(PeerEvent::Kind::reconnected, 0); }));
    exchange(service, 3);
}

TEST_CASE("refusals: an id already held, a garbled or hostile value under the prefix, etcd unreachable" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    Service service(etcd);
    service.join_paired(2);

    // The same member id registered twice.
    const std::string taken = error_of([&] { service.prepare(0).join(service.settings()); });
    CHECK(taken.find("members/0") != std::string::npos);
    CHECK(taken.find("already registered") != std::string::npos);

    // Garbled and hostile values, put straight into the store.
    handshake::EtcdSettings raw;
    raw.endpoint = etcd.endpoint();
    raw.key_prefix = "service/";
    auto store = handshake::connect_etcd_store(raw);
    store->put("members/5", "{not json", 0, Clock::now() + 5s);
    store->put("members/6", R"({"version":1,"rank":6})", 0, Clock::now() + 5s);
    store->put("members/99", "{}", 0, Clock::now() + 5s);
    store->put("members/007", "{}", 0, Clock::now() + 5s);
    store->put("pairs/0/1", R"({"version":1,"state":"connected","from_session":"zz"})", 0, Clock::now() + 5s);
    // A well-formed member of the other mode.
    const bool rc = test_mode() == MultiChannelMode::reliable_connected;
    Endpoint other_mode = MultiChannelBuilder()
                              .rank(4)
                              .world_size(kCapacity)
                              .mode(rc ? MultiChannelMode::dynamically_connected : MultiChannelMode::reliable_connected)
                              .dc_initiators(2)
                              .build()
                              .endpoint();
    other_mode.session = 0x5eed;
    store->put("members/4", nlohmann::json(other_mode).dump(), 0, Clock::now() + 5s);
    auto refused = [&](Member& member, const std::string& key) {
        return std::any_of(member.events.begin(), member.events.end(), [&](const PeerEvent& event) {
            return event.kind == PeerEvent::Kind::refused && event.reason.find("'" + key + "'") != std::string::npos;
        });
    };
    Member& zero = *service.members()[0];
    REQUIRE(service.poll_until([&] {
        return refused(zero, "members/5") && refused(zero, "members/6") && refused(zero, "members/99") &&
               refused(zero, "members/007") && refused(zero, "pairs/0/1") && refused(zero, "members/4");
    }));
    const std::string other_mode_reason =
        rc ? "'members/4' refused: the member is in DC mode (endpoint field 'dc' is set), this process in RC mode"
           : "'members/4' refused: the member has no DC target (endpoint field 'dc' is empty)";
    CHECK(std::any_of(zero.events.begin(), zero.events.end(), [&](const PeerEvent& event) {
        return event.kind == PeerEvent::Kind::refused && event.peer == 4 &&
               event.reason.find(other_mode_reason) != std::string::npos;
    }));
    for (const PeerEvent& event : zero.events) {
        if (event.kind == PeerEvent::Kind::refused) MESSAGE(event.reason);
    }
    if (!rc) {
        // A pair record naming a queue pair, from member 1's session to member 0's: a DC pair
        // has none to answer with, so it is refused, not taken as a reconnection.
        const auto session_of = [&](const char* key) {
            return nlohmann::json::parse(store->get(key, Clock::now() + 5s).entries.at(0).value).get<Endpoint>().session;
        };
        handshake::PairRecord hostile;
        hostile.state = handshake::PairRecord::State::connected;
        hostile.from_session = session_of("members/1");
        hostile.to_session = session_of("members/0");
        hostile.qpn = 77;
        store->put("pairs/0/1", handshake::serialize_pair_record(hostile), 0, Clock::now() + 5s);
        REQUIRE(service.poll_until([&] {
            return std::any_of(zero.events.begin(), zero.events.end(), [](const PeerEvent& event) {
                return event.kind == PeerEvent::Kind::refused && event.peer == 1 &&
                       event.reason.find("'pairs/0/1' refused: it names queue pair 77: a DC pair has no queue pair") !=
                           std::string::npos;
            });
        }));
    }
    // Nothing refused became a member, and the pair 0-1 still works.
    CHECK(zero.channel->members() == std::vector<std::uint32_t>{0, 1});
    exchange(service, 4);

    // etcd unreachable at start: an error naming the address, within the channel's deadline.
    MembershipSettings nowhere = service.settings();
    const test::LoopbackPort refusing(test::LoopbackPort::Mode::refusing);
    nowhere.etcd = "http://127.0.0.1:" + std::to_string(refusing.port());
    const auto started = Clock::now();
    const std::string unreachable = error_of([&] {
        MultiChannelBuilder builder(ChannelBuilder().deadline(1s));
        builder.world_size(kCapacity).mode(test_mode()).bootstrap(Bootstrap::etcd);
        builder.build().join(nowhere);
    });
    const double seconds = std::chrono::duration<double>(Clock::now() - started).count();
    CHECK(unreachable.find(nowhere.etcd) != std::string::npos);
    CHECK(seconds < 3.0);
    MESSAGE(unreachable);

    // join under another bootstrap, and an id beyond the capacity.
    CHECK(error_of([&] { MultiChannelBuilder().rank(0).world_size(2).bootstrap(Bootstrap::tcp).build().join(service.settings()); })
              .find("join needs the etcd bootstrap") != std::string::npos);
    CHECK(error_of([&] {
              MultiChannelBuilder builder;
              builder.world_size(kCapacity).bootstrap(Bootstrap::etcd);
              builder.build().join(MembershipSettings{});
          }).find("RDMACHAN_ETCD") != std::string::npos);
}

TEST_CASE("etcd restarted mid-run: membership resumes, nobody is failed, and a member joins afterwards" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    Service service(etcd);
    service.join_paired(2);
    // Away for less than the TTL (2 s): etcd restores the leases when it comes back.
    etcd.stop();
    for (int round = 0; round < 20; ++round) {
        service.poll_all();
        std::this_thread::sleep_for(10ms);
    }
    exchange(service, 5);  // the data path never needed etcd
    etcd.start();
    wait_for_etcd(etcd);
    service.join();
    REQUIRE(service.poll_until([&] { return service.all_paired(); }));
    exchange(service, 6);
    for (auto& member : service.members()) {
        for (const PeerEvent& event : member->events) {
            CHECK_MESSAGE(event.kind == PeerEvent::Kind::joined, to_string(event.kind) << " " << event.peer << ": " << event.reason);
        }
    }
}

namespace {

// The frozen member's process: joins, polls until the parent writes to `commands` (its lease
// lost while it was stopped shows as `failed` for every peer, then it rejoins and they join
// again), then leaves. Its exit status says what it saw: 0 all, 2 no failure seen, 3 no
// rejoin seen, 4 an error.
int run_frozen_member(const std::string& etcd_endpoint, int commands) {
    try {
        MultiChannelBuilder builder(ChannelBuilder().deadline(5s));
        builder.world_size(kCapacity).mode(test_mode()).dc_initiators(2).bootstrap(Bootstrap::etcd).rank(5);
        PreparedMultiChannel prepared = builder.build();
        std::vector<std::uint8_t> inbox(kCapacity * kSlotBytes, 0);
        const MemoryRegion inbox_region = prepared.register_memory(inbox.data(), inbox.size());
        prepared.publish_region("inbox", inbox_region);
        MembershipSettings settings;
        settings.etcd = etcd_endpoint;
        settings.key_prefix = "service/";
        settings.lease_ttl = 2s;
        MultiChannel channel = std::move(prepared).join(settings);
        bool failed_seen = false;
        bool rejoined = false;
        const auto until = Clock::now() + 60s;
        char command = 0;
        bool told_to_leave = false;
        // Until told to leave and, as its peers may have paired before it saw their side, rejoined.
        while (Clock::now() < until && !(told_to_leave && rejoined)) {
            if (!told_to_leave) told_to_leave = ::read(commands, &command, 1) == 1;
            for (const PeerEvent& event : channel.poll_peer_events()) {
                if (event.kind == PeerEvent::Kind::failed) failed_seen = true;
                if (event.kind == PeerEvent::Kind::joined && failed_seen) rejoined = true;
            }
            std::this_thread::sleep_for(1ms);
        }
        channel.leave();
        return !failed_seen ? 2 : !rejoined ? 3 : 0;
    } catch (const std::exception& error) {
        std::fprintf(stderr, "frozen member: %s\n", error.what());
        return 4;
    }
}

}  // namespace

TEST_CASE("a member stopped (SIGSTOP) beyond its lease is failed, and comes back as a new member when resumed" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    wait_for_etcd(etcd);
    // The member's process is forked before this one starts any thread of its own.
    int pipe_ends[2];
    REQUIRE(::pipe(pipe_ends) == 0);
    ::fcntl(pipe_ends[0], F_SETFL, O_NONBLOCK);
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        ::close(pipe_ends[1]);
        ::_exit(run_frozen_member(etcd.endpoint(), pipe_ends[0]));
    }
    ::close(pipe_ends[0]);
    Service service(etcd);
    service.join();
    service.join();
    const auto has_five = [&](std::uint32_t joins) {
        return std::all_of(service.members().begin(), service.members().end(), [&](const auto& member) {
            return member->count(PeerEvent::Kind::joined, 5) == joins && member->channel->members().back() == 5;
        });
    };
    REQUIRE(service.poll_until([&] { return has_five(1); }, 20s));
    const std::uint64_t first_session = service.members()[0]->channel->peer_session(5);

    ::kill(child, SIGSTOP);
    const auto stopped_at = Clock::now();
    REQUIRE(service.poll_until([&] {
        return std::all_of(service.members().begin(), service.members().end(),
                           [](const auto& member) { return member->saw(PeerEvent::Kind::failed, 5); });
    }));
    const double seconds = std::chrono::duration<double>(Clock::now() - stopped_at).count();
    MESSAGE("a member stopped with SIGSTOP (lease TTL 2 s) was seen failed after " << seconds << " s");
    CHECK(seconds < 2.0 + 1.0);
    ::kill(child, SIGCONT);
    REQUIRE(service.poll_until([&] { return has_five(2); }, 20s));
    CHECK(service.members()[0]->channel->peer_session(5) != first_session);
    // The member is back: bytes move to it.
    for (auto& member : service.members()) {
        const RemoteMemoryRegion inbox = member->channel->remote_region(5, "inbox").region.slice(member->channel->rank() * kSlotBytes, 8);
        const WorkResult write = member->channel->write(5, member->outbox_region.slice(0, 8), inbox);
        CHECK_MESSAGE(write.ok(), (write.ok() ? std::string() : write.error().message()));
    }
    REQUIRE(::write(pipe_ends[1], "q", 1) == 1);
    // Its leave waits for these members' release: they poll meanwhile.
    int status = 0;
    REQUIRE(service.poll_until([&] { return ::waitpid(child, &status, WNOHANG) == child; }, 20s));
    ::close(pipe_ends[1]);
    CHECK(WIFEXITED(status));
    CHECK_MESSAGE(WEXITSTATUS(status) == 0, "the member's process exited with " << WEXITSTATUS(status));
    for (auto& member : service.members()) CHECK(member->saw(PeerEvent::Kind::left, 5));
}

TEST_CASE("membership over TLS: members join and move bytes through an https etcd, trusting its authority" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd(true);
    {
        handshake::EtcdSettings probe;
        probe.endpoint = etcd.endpoint();
        probe.ca_file = etcd.certificate_file();
        handshake::connect_etcd_store(probe)->get("probe", Clock::now() + 20s);
    }
    Service service(etcd);
    MembershipSettings settings = service.settings();
    settings.ca_file = etcd.certificate_file();
    service.join(settings);
    service.join(settings);
    REQUIRE(service.poll_until([&] { return service.all_paired(); }));
    exchange(service, 7);
    // Without the authority the certificate is refused, naming the address.
    MembershipSettings untrusting = service.settings();
    const std::string refused = error_of([&] {
        MultiChannelBuilder builder(ChannelBuilder().deadline(1s));
        builder.world_size(kCapacity).mode(test_mode()).bootstrap(Bootstrap::etcd);
        builder.build().join(untrusting);
    });
    CHECK(refused.find(etcd.endpoint()) != std::string::npos);
    MESSAGE(refused);
}
