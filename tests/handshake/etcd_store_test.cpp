// The membership store over a real etcd (each case starts its own, tests/handshake/etcd_process.hpp)
// and over a fake one answering nonsense. Without an etcd binary every case reports skipped
// (CTest registers the suite as skipped at configure time as well).
#include <doctest/doctest.h>

#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "handshake/crypto.hpp"
#include "handshake/etcd_client.hpp"
#include "handshake/etcd_store.hpp"
#include "rdmachan/error.hpp"
#include "tests/error_of.hpp"
#include "tests/handshake/etcd_process.hpp"
#include "tests/handshake/fake_http_server.hpp"
#include "tests/loopback_port.hpp"

using namespace rdmachan;
using rdmachan::test::error_of;
using namespace rdmachan::handshake;
using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

namespace {

const bool etcd_missing = test::etcd_missing_said();

// A store on the test's etcd, once etcd answers (it takes about a second to start).
std::unique_ptr<MembershipStore> store_on(const test::EtcdProcess& etcd, std::string prefix = "test/") {
    EtcdSettings settings;
    settings.endpoint = etcd.endpoint();
    settings.key_prefix = std::move(prefix);
    auto store = connect_etcd_store(settings);
    store->get("probe", Clock::now() + 20s);
    return store;
}

// Polls the watch until `count` events arrived or the deadline passed.
std::vector<StoreEvent> wait_for_events(StoreWatch& watch, std::size_t count, Clock::duration limit) {
    std::vector<StoreEvent> events;
    const auto deadline = Clock::now() + limit;
    while (events.size() < count && Clock::now() < deadline) {
        for (StoreEvent& event : watch.poll()) events.push_back(std::move(event));
        std::this_thread::sleep_for(10ms);
    }
    return events;
}

}  // namespace

TEST_CASE("base64: RFC 4648 vectors both ways, and strict refusals") {
    const std::pair<const char*, const char*> vectors[] = {{"", ""},         {"f", "Zg=="},         {"fo", "Zm8="},
                                                           {"foo", "Zm9v"},  {"foob", "Zm9vYg=="},  {"fooba", "Zm9vYmE="},
                                                           {"foobar", "Zm9vYmFy"}};
    for (const auto& [bytes, text] : vectors) {
        CHECK(base64_encode(bytes) == text);
        CHECK(base64_decode(text) == std::string(bytes));
    }
    const std::string binary("\0\x01\xff\xfe\x80", 5);
    CHECK(base64_decode(base64_encode(binary)) == binary);
    for (const char* bad : {"Zg=", "Zg==Zg==", "Z===", "Zm9v\n", " Zm9", "Zm=v", "Zm9*", "===="})
        CHECK_MESSAGE(!base64_decode(bad).has_value(), bad);
}

TEST_CASE("settings: RDMACHAN_ETCD is required and its form is checked") {
    ::unsetenv("RDMACHAN_ETCD");
    CHECK(error_of([] { etcd_settings_from_environment(); }).find("RDMACHAN_ETCD is not set") != std::string::npos);
    ::setenv("RDMACHAN_ETCD", "http://127.0.0.1:2379", 1);
    ::setenv("RDMACHAN_ETCD_PREFIX", "service-a/", 1);
    const EtcdSettings settings = etcd_settings_from_environment();
    CHECK(settings.endpoint == "http://127.0.0.1:2379");
    CHECK(settings.key_prefix == "service-a/");
    // What the caller gives wins; each field it leaves empty comes from its variable.
    ::setenv("RDMACHAN_ETCD_USER", "from-environment", 1);
    EtcdSettings given;
    given.endpoint = "http://10.0.0.1:2379";
    given.password = "given";
    const EtcdSettings filled = etcd_settings_from_environment(given);
    CHECK(filled.endpoint == "http://10.0.0.1:2379");
    CHECK(filled.key_prefix == "service-a/");
    CHECK(filled.user == "from-environment");
    CHECK(filled.password == "given");
    ::unsetenv("RDMACHAN_ETCD_USER");
    ::unsetenv("RDMACHAN_ETCD");
    ::unsetenv("RDMACHAN_ETCD_PREFIX");
    for (const char* bad : {"127.0.0.1:2379", "http://127.0.0.1", "http://:2379", "http://host:99999", "ftp://h:1"}) {
        EtcdSettings wrong;
        wrong.endpoint = bad;
        CHECK_MESSAGE(error_of([&] { connect_etcd_store(wrong); }).find(bad) != std::string::npos, bad);
    }
}

TEST_CASE("etcd unreachable: an error naming the address, the operation and the key, at the deadline") {
    EtcdSettings settings;
    const test::LoopbackPort nowhere(test::LoopbackPort::Mode::refusing);
    settings.endpoint = "http://127.0.0.1:" + std::to_string(nowhere.port());
    auto store = connect_etcd_store(settings);
    const auto started = Clock::now();
    const std::string error = error_of([&] { store->get("members/3", Clock::now() + 1s); });
    const auto took = Clock::now() - started;
    INFO(error);
    CHECK(error.find("etcd " + settings.endpoint) != std::string::npos);
    CHECK(error.find("get 'members/3'") != std::string::npos);
    CHECK(error.find("deadline") != std::string::npos);
    CHECK(took >= 900ms);
    CHECK(took < 2s);
    const std::string watch_error = error_of([&] { store->watch_prefix("members/", 0, Clock::now() + 1s); });
    CHECK(watch_error.find("etcd " + settings.endpoint + ": watch") != std::string::npos);
}

TEST_CASE("put, get and delete: binary keys and values round trip" * doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    const auto deadline = [] { return Clock::now() + 5s; };
    std::string value;
    for (int byte = 0; byte < 256; ++byte) value += static_cast<char>(byte);
    const std::string key("members/\0\xff", 10);
    const std::int64_t written = store->put(key, value, 0, deadline());
    CHECK(written > 0);
    const StoreSnapshot found = store->get(key, deadline());
    REQUIRE(found.entries.size() == 1);
    CHECK(found.entries[0].key == key);
    CHECK(found.entries[0].value == value);
    CHECK(found.entries[0].modified_revision == written);
    CHECK(found.entries[0].lease == 0);
    CHECK(found.revision >= written);
    store->put("empty", "", 0, deadline());
    REQUIRE(store->get("empty", deadline()).entries.size() == 1);
    CHECK(store->get("empty", deadline()).entries[0].value.empty());
    CHECK(store->remove(key, deadline()));
    CHECK(store->get(key, deadline()).entries.empty());
    CHECK_FALSE(store->remove(key, deadline()));
}

TEST_CASE("create writes a key only when no key of that name exists, and returns the holder's entry otherwise" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    const auto deadline = [] { return Clock::now() + 20s; };
    const LeaseId lease = store->grant_lease(5s, deadline());
    CHECK_FALSE(store->create("members/1", "first", lease, deadline()).has_value());
    const std::optional<StoreEntry> holder = store->create("members/1", "second", 0, deadline());
    REQUIRE(holder.has_value());
    CHECK(holder->key == "members/1");
    CHECK(holder->value == "first");
    CHECK(holder->lease == lease);
    // The losing create wrote nothing.
    CHECK(store->get("members/1", deadline()).entries.at(0).value == "first");
    // Once the key is gone (here its lease revoked), the next create takes it.
    store->revoke_lease(lease, deadline());
    CHECK_FALSE(store->create("members/1", "third", 0, deadline()).has_value());
    CHECK(store->get("members/1", deadline()).entries.at(0).value == "third");
}

TEST_CASE("put_all writes up to 128 keys under one lease in one transaction; more, or none, are refused" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    const auto deadline = [] { return Clock::now() + 20s; };
    const LeaseId lease = store->grant_lease(5s, deadline());
    std::vector<MembershipStore::KeyValue> entries;
    for (int index = 0; index < 128; ++index) entries.push_back({"pairs/" + std::to_string(index), "value " + std::to_string(index)});
    const std::int64_t revision = store->put_all(entries, lease, deadline());
    const StoreSnapshot written = store->get_prefix("pairs/", deadline());
    REQUIRE(written.entries.size() == 128);
    for (const StoreEntry& entry : written.entries) {
        CHECK(entry.modified_revision == revision);  // one transaction: one revision
        CHECK(entry.lease == lease);
        CHECK(entry.value == "value " + entry.key.substr(6));
    }
    entries.push_back({"pairs/128", "one too many"});
    CHECK(error_of([&] { store->put_all(entries, lease, deadline()); }).find("129 keys") != std::string::npos);
    CHECK(error_of([&] { store->put_all({}, lease, deadline()); }).find("0 keys") != std::string::npos);
    CHECK(store->get("pairs/128", deadline()).entries.empty());
}

TEST_CASE("a prefix get returns every key under it, in key order, with the revision" * doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    const auto deadline = Clock::now() + 10s;
    store->put("members/2", "two", 0, deadline);
    store->put("members/1", "one", 0, deadline);
    const std::int64_t last = store->put("other/1", "x", 0, deadline);
    // Another job's keys: outside this store's prefix, never seen.
    EtcdSettings other;
    other.endpoint = etcd.endpoint();
    other.key_prefix = "tesu/";  // "test/" raised by one: the range's end, excluded
    connect_etcd_store(other)->put("members/9", "not ours", 0, deadline);
    const StoreSnapshot members = store->get_prefix("members/", deadline);
    REQUIRE(members.entries.size() == 2);
    CHECK(members.entries[0].key == "members/1");
    CHECK(members.entries[0].value == "one");
    CHECK(members.entries[1].key == "members/2");
    CHECK(members.revision >= last);
    CHECK(store->get_prefix("", deadline).entries.size() == 3);
}

TEST_CASE("a lease kept alive outlives its TTL; one no longer renewed expires within TTL + 1 s, and the "
          "watch reports the delete" * doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    const auto deadline = [] { return Clock::now() + 5s; };
    const LeaseId lease = store->grant_lease(2s, deadline());
    const std::int64_t written = store->put("members/0", "alive", lease, deadline());
    auto watch = store->watch_prefix("members/", written + 1, deadline());
    std::this_thread::sleep_for(3500ms);
    const StoreSnapshot later = store->get("members/0", deadline());
    REQUIRE(later.entries.size() == 1);
    CHECK(later.entries[0].lease == lease);
    CHECK(store->poll_lost_leases().empty());
    CHECK(watch->poll().empty());

    store->stop_keepalive(lease);
    const auto stopped = Clock::now();
    const std::vector<StoreEvent> events = wait_for_events(*watch, 1, 5s);
    const auto took = Clock::now() - stopped;
    REQUIRE(events.size() == 1);
    CHECK(events[0].kind == StoreEvent::Kind::removed);
    CHECK(events[0].key == "members/0");
    CHECK(events[0].revision > written);
    CHECK(took < 3s);
    CHECK(store->get("members/0", deadline()).entries.empty());
}

TEST_CASE("revoking a lease deletes its keys at once; the renewal reports a lease revoked elsewhere" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    auto other = store_on(etcd);
    const auto deadline = [] { return Clock::now() + 5s; };
    const LeaseId lease = store->grant_lease(6s, deadline());
    store->put("members/5", "five", lease, deadline());
    store->put("members/6", "six", lease, deadline());
    other->revoke_lease(lease, deadline());
    CHECK(store->get_prefix("members/", deadline()).entries.empty());
    // The renewal runs every 2 s for a 6 s lease.
    std::vector<LostLease> lost;
    for (auto until = Clock::now() + 5s; lost.empty() && Clock::now() < until; std::this_thread::sleep_for(50ms))
        lost = store->poll_lost_leases();
    REQUIRE(lost.size() == 1);
    CHECK(lost[0].lease == lease);
    CHECK(lost[0].reason.find("gone") != std::string::npos);
}

TEST_CASE("a watch reports puts and deletes in order with their revisions, from a past revision" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    const auto deadline = [] { return Clock::now() + 5s; };
    const std::int64_t first = store->put("members/1", "a", 0, deadline());
    const std::int64_t second = store->put("members/2", std::string("b\0c", 3), 0, deadline());
    auto watch = store->watch_prefix("members/", first, deadline());
    store->put("unwatched", "x", 0, deadline());
    const std::int64_t third = store->put("members/1", "A", 0, deadline());
    store->remove("members/2", deadline());
    const std::vector<StoreEvent> events = wait_for_events(*watch, 4, 5s);
    REQUIRE(events.size() == 4);
    CHECK(events[0].kind == StoreEvent::Kind::put);
    CHECK(events[0].key == "members/1");
    CHECK(events[0].revision == first);
    CHECK(events[1].value == std::string("b\0c", 3));
    CHECK(events[1].revision == second);
    CHECK(events[2].value == "A");
    CHECK(events[2].revision == third);
    CHECK(events[3].kind == StoreEvent::Kind::removed);
    CHECK(events[3].key == "members/2");
    CHECK(events[3].revision == third + 1);

    // wait(): false at its deadline when nothing came; true as soon as a put arrives.
    const auto quiet_started = Clock::now();
    CHECK_FALSE(watch->wait(Clock::now() + 200ms));
    CHECK(Clock::now() - quiet_started >= 200ms);
    std::thread writer([&] {
        std::this_thread::sleep_for(50ms);
        store->put("members/3", "c", 0, deadline());
    });
    CHECK(watch->wait(Clock::now() + 5s));
    writer.join();
    const std::vector<StoreEvent> woken = watch->poll();
    REQUIRE(woken.size() == 1);
    CHECK(woken[0].key == "members/3");
}

TEST_CASE("a watch across an etcd restart resumes from its revision and misses nothing" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    auto store = store_on(etcd);
    const auto deadline = [] { return Clock::now() + 20s; };
    auto watch = store->watch_prefix("members/", 0, deadline());
    store->put("members/1", "before", 0, deadline());
    REQUIRE(wait_for_events(*watch, 1, 5s).size() == 1);
    // While the watch cannot reach it, etcd runs on another port and its keys change there: the
    // watch sees those changes only if it resumes from its revision when etcd is back.
    etcd.stop();
    const std::uint16_t side_port = etcd.start_elsewhere();
    EtcdSettings side;
    side.endpoint = etcd.endpoint_on(side_port);
    side.key_prefix = "test/";
    {
        auto side_store = connect_etcd_store(side);
        side_store->put("members/2", "while away", 0, deadline());
        side_store->remove("members/1", deadline());
        side_store->put("members/3", "while away", 0, deadline());
    }
    etcd.stop();
    etcd.start();
    store->put("members/4", "after", 0, deadline());
    const std::vector<StoreEvent> events = wait_for_events(*watch, 4, 10s);
    REQUIRE(events.size() == 4);
    CHECK(events[0].key == "members/2");
    CHECK(events[1].kind == StoreEvent::Kind::removed);
    CHECK(events[1].key == "members/1");
    CHECK(events[2].key == "members/3");
    CHECK(events[3].key == "members/4");
    for (std::size_t index = 1; index < events.size(); ++index) CHECK(events[index - 1].revision < events[index].revision);
    CHECK(watch->poll().empty());
}

TEST_CASE("the etcd fixture: a start on a port another listener holds fails naming etcd's reason, at once" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    store_on(etcd);
    // A listener of this process holds a port, as another test's listener bound to port 0 may
    // hold the one the fixture chose between choosing it and etcd's bind.
    const auto holder = std::make_unique<test::LoopbackPort>(test::LoopbackPort::Mode::listening);
    const std::uint16_t held = holder->port();
    etcd.stop();
    const auto started = Clock::now();
    std::string refused;
    try {
        etcd.start_on(held);
    } catch (const std::runtime_error& error) {
        refused = error.what();
    }
    INFO(refused);
    CHECK(refused.find("etcd on " + etcd.endpoint_on(held)) != std::string::npos);
    CHECK(refused.find("exited") != std::string::npos);
    CHECK(refused.find("address already in use") != std::string::npos);
    CHECK(Clock::now() - started < 10s);
    // Started again on its own port, with its data.
    etcd.start();
    CHECK(store_on(etcd)->get("probe", Clock::now() + 20s).entries.empty());
}

TEST_CASE("with etcd's authentication on: a user's token in every call, taken again after a restart; "
          "a wrong password refused naming the user" * doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd;
    store_on(etcd);
    // etcdctl user add root; user grant-role root root; auth enable, through the gateway.
    const EtcdAddress address = parse_etcd_address(etcd.endpoint());
    const auto administer = [&](const char* target, const char* body) {
        const HttpAnswer answer = post_once(address, "", target, body, "", Clock::now() + 5s);
        REQUIRE_MESSAGE(answer.status == 200, target << ": " << answer.body);
    };
    administer("/v3/auth/user/add", R"({"name":"root","password":"secret"})");
    administer("/v3/auth/user/grant", R"({"user":"root","role":"root"})");
    administer("/v3/auth/enable", "{}");

    const auto deadline = [] { return Clock::now() + 20s; };
    EtcdSettings settings;
    settings.endpoint = etcd.endpoint();
    settings.key_prefix = "secure/";
    const std::string anonymous = error_of([&] { connect_etcd_store(settings)->get("members/1", deadline()); });
    CHECK(anonymous.find("get 'members/1': etcd refused") != std::string::npos);

    settings.user = "root";
    settings.password = "wrong";
    const std::string wrong = error_of([&] { connect_etcd_store(settings)->get("members/1", deadline()); });
    CHECK(wrong.find("authenticate as 'root': etcd refused") != std::string::npos);
    CHECK(wrong.find("authentication failed") != std::string::npos);

    settings.password = "secret";
    auto store = connect_etcd_store(settings);
    const LeaseId lease = store->grant_lease(5s, deadline());
    const std::int64_t written = store->put("members/1", "one", lease, deadline());
    auto watch = store->watch_prefix("members/", written, deadline());
    REQUIRE(store->get("members/1", deadline()).entries.size() == 1);
    // etcd's simple tokens live in its memory: after a restart every token is refused, and the
    // store (its calls, its renewal, its watch) authenticates again.
    etcd.stop();
    etcd.start();
    store->put("members/2", "two", lease, deadline());
    const std::vector<StoreEvent> events = wait_for_events(*watch, 2, 10s);
    REQUIRE(events.size() == 2);
    CHECK(events[0].key == "members/1");
    CHECK(events[1].key == "members/2");
    std::this_thread::sleep_for(6s);  // past the lease's TTL: renewed with a new token
    CHECK(store->get_prefix("members/", deadline()).entries.size() == 2);
    CHECK(store->poll_lost_leases().empty());

    // Authenticating while etcd is away is retried until the call's deadline, as any call is.
    etcd.stop();
    auto fresh = connect_etcd_store(settings);
    const auto started = Clock::now();
    const std::string away = error_of([&] { fresh->get("members/1", Clock::now() + 500ms); });
    CHECK(Clock::now() - started >= 400ms);
    INFO(away);
    CHECK(away.find("get 'members/1': no answer by the deadline") != std::string::npos);
}

TEST_CASE("over https: etcd's self-signed certificate trusted through the CA file, refused without it" *
          doctest::skip(etcd_missing)) {
    test::EtcdProcess etcd(true);
    EtcdSettings settings;
    settings.endpoint = etcd.endpoint();
    settings.key_prefix = "tls/";
    REQUIRE(settings.endpoint.starts_with("https://"));
    settings.ca_file = etcd.certificate_file();
    auto store = connect_etcd_store(settings);
    const auto deadline = [] { return Clock::now() + 20s; };
    const LeaseId lease = store->grant_lease(3s, deadline());
    const std::int64_t written = store->put("members/1", "one", lease, deadline());
    auto watch = store->watch_prefix("members/", written, deadline());
    store->remove("members/1", deadline());
    const std::vector<StoreEvent> events = wait_for_events(*watch, 2, 5s);
    REQUIRE(events.size() == 2);
    CHECK(events[0].value == "one");
    CHECK(events[1].kind == StoreEvent::Kind::removed);

    settings.ca_file.clear();  // the system's authorities: they never signed this certificate
    // Refused at once, not tried again until the deadline: a certificate stays untrusted.
    const auto untrusted_started = Clock::now();
    const std::string untrusted = error_of([&] { connect_etcd_store(settings)->get("members/1", deadline()); });
    INFO(untrusted);
    CHECK(Clock::now() - untrusted_started < 10s);
    CHECK(untrusted.find("get 'members/1'") != std::string::npos);
    CHECK(untrusted.find("certificate verify failed") != std::string::npos);
    CHECK(untrusted.find("the system's certificate authorities") != std::string::npos);
    CHECK(untrusted.find("no answer by the deadline") == std::string::npos);
    settings.ca_file = "/nonexistent/ca.pem";
    const std::string missing = error_of([&] { connect_etcd_store(settings)->get("members/1", Clock::now() + 1s); });
    CHECK(missing.find("/nonexistent/ca.pem") != std::string::npos);
}

TEST_CASE("etcd that accepts and never answers: each call and the watch's start fail at their deadline") {
    test::FakeHttpServer hung(test::FakeHttpServer::silent);
    EtcdSettings settings;
    settings.endpoint = hung.endpoint();
    auto store = connect_etcd_store(settings);
    auto started = Clock::now();
    const std::string put_error = error_of([&] { store->put("members/1", "x", 0, Clock::now() + 1s); });
    CHECK(Clock::now() - started < 2s);
    CHECK(put_error.find("put 'members/1': no answer by the deadline") != std::string::npos);
    started = Clock::now();
    const std::string watch_error = error_of([&] { store->watch_prefix("members/", 0, Clock::now() + 1s); });
    CHECK(Clock::now() - started < 2s);
    CHECK(watch_error.find("watch 'rdmachan/members/': not accepted by the deadline") != std::string::npos);

    // A deadline met inside the authentication reads as any other: the call, then what was under way.
    settings.user = "root";
    settings.password = "secret";
    auto authenticating = connect_etcd_store(settings);
    started = Clock::now();
    const std::string get_error = error_of([&] { authenticating->get("members/1", Clock::now() + 1s); });
    CHECK(Clock::now() - started < 2s);
    INFO(get_error);
    CHECK(get_error.find("get 'members/1': no answer by the deadline while authenticating as 'root'") !=
          std::string::npos);
}

TEST_CASE("a garbled answer is refused naming the field") {
    const auto deadline = [] { return Clock::now() + 3s; };
    const auto error_from = [&](const std::string& body, const std::function<void(MembershipStore&)>& call) {
        test::FakeHttpServer server(body);
        EtcdSettings settings;
        settings.endpoint = server.endpoint();
        settings.key_prefix = "test/";
        auto store = connect_etcd_store(settings);
        return error_of([&] { call(*store); });
    };
    const auto get = [&](MembershipStore& store) { store.get("members/1", deadline()); };
    std::string error = error_from("not json at all", get);
    CHECK(error.find(": get 'members/1': the answer is not a JSON object") != std::string::npos);
    error = error_from(R"({"header":{"revision":"12x"}})", get);
    CHECK(error.find("answer field 'header.revision' is not a decimal integer") != std::string::npos);
    error = error_from(R"({"kvs":[]})", get);
    CHECK(error.find("answer field 'header' is missing") != std::string::npos);
    error = error_from(R"({"header":{"revision":"3"},"kvs":[{"key":"dGVzdC9h","mod_revision":"2","value":"!!"}],"count":"1"})", get);
    CHECK(error.find("answer field 'kvs[0].value' is not valid base64") != std::string::npos);
    error = error_from(R"({"header":{"revision":"3"},"kvs":[{"key":"b3RoZXI=","mod_revision":"2"}],"count":"1"})", get);
    CHECK(error.find("answer field 'kvs[0].key' is outside the key prefix") != std::string::npos);
    error = error_from(R"({"header":{"revision":"3"},"kvs":{"a":1}})", get);
    CHECK(error.find("answer field 'kvs' is not an array") != std::string::npos);
    error = error_from(R"({"header":{"revision":"3"},"kvs":[{"key":"dGVzdC9h","mod_revision":"2"}],"count":"7"})", get);
    CHECK(error.find("answer field 'count'") != std::string::npos);
    error = error_from(R"({"header":{"revision":"99999999999999999999"}})", get);
    CHECK(error.find("answer field 'header.revision'") != std::string::npos);
    error = error_from(R"({"header":{"revision":"3"},"ID":"-4","TTL":"5"})",
                       [&](MembershipStore& store) { store.grant_lease(5s, deadline()); });
    CHECK(error.find("grant lease of 5 s: answer field 'ID' is not a positive lease id") != std::string::npos);

    // A watch whose stream carries nonsense fails at its start, naming the field.
    test::FakeHttpServer watch_server(R"({"result":{"header":{"revision":"3"},"created":"yes"}})" "\n", true);
    EtcdSettings settings;
    settings.endpoint = watch_server.endpoint();
    auto store = connect_etcd_store(settings);
    error = error_of([&] { store->watch_prefix("members/", 0, deadline()); });
    CHECK(error.find(": watch 'rdmachan/members/': answer field 'result.created' is not a boolean") != std::string::npos);
}
