// The pairwise exchange for Channel: late listener, a stranger with the wrong token, a peer that
// never comes; plus the negotiation helpers.
#include <doctest/doctest.h>

#include <atomic>
#include <future>
#include <thread>

#include "rdmachan/error.hpp"
#include "rdmachan/handshake.hpp"
#include "tests/handshake/rendezvous_support.hpp"

using namespace std::chrono_literals;
using rdmachan::PairwiseSettings;
using rdmachan::test::predictable_endpoint;

namespace {

PairwiseSettings listener_settings(std::promise<std::uint16_t>& port,
                                   std::chrono::milliseconds timeout = 2500ms) {
    PairwiseSettings settings;
    settings.role = PairwiseSettings::Role::listen;
    settings.token = "pair-token";
    settings.timeout = timeout;
    settings.on_listening = [&port](std::uint16_t chosen) { port.set_value(chosen); };
    return settings;
}

PairwiseSettings connector_settings(std::uint16_t port,
                                    std::chrono::milliseconds timeout = 2500ms) {
    PairwiseSettings settings;
    settings.role = PairwiseSettings::Role::connect;
    settings.port = port;
    settings.token = "pair-token";
    settings.timeout = timeout;
    return settings;
}

}  // namespace

TEST_CASE("both sides get each other's endpoint, also when the listener starts late") {
    // Reserve a port number, release it, and let the connector retry before anyone listens.
    std::promise<std::uint16_t> reserved;
    std::uint16_t port = 0;
    {
        std::promise<std::uint16_t> probe;
        auto settings = listener_settings(probe, 50ms);
        CHECK_THROWS_AS(rdmachan::exchange_pairwise(settings, predictable_endpoint(0, 2)),
                        rdmachan::Error);
        port = probe.get_future().get();
    }
    // The listener starts only once the connector has been refused at least once, so the
    // exchange below can succeed only through a retry.
    std::promise<void> refused;
    std::atomic<int> refusals{0};
    auto connected = std::async(std::launch::async, [port, &refused, &refusals] {
        auto settings = connector_settings(port);
        settings.on_connect_refused = [&] {
            if (refusals.fetch_add(1) == 0) refused.set_value();
        };
        return rdmachan::exchange_pairwise(settings, predictable_endpoint(1, 2));
    });
    REQUIRE(refused.get_future().wait_for(2000ms) == std::future_status::ready);
    std::promise<std::uint16_t> chosen;
    auto settings = listener_settings(chosen);
    settings.port = port;
    const rdmachan::Endpoint from_connector =
        rdmachan::exchange_pairwise(settings, predictable_endpoint(0, 2));
    CHECK(from_connector == predictable_endpoint(1, 2));
    CHECK(connected.get() == predictable_endpoint(0, 2));
    CHECK(refusals.load() >= 1);  // connected on a retry
}

TEST_CASE("a connector with the wrong token is refused and the listener keeps waiting") {
    std::promise<std::uint16_t> chosen;
    auto port_ready = chosen.get_future();
    auto listened = std::async(std::launch::async, [&] {
        return rdmachan::exchange_pairwise(listener_settings(chosen), predictable_endpoint(0, 2));
    });
    const std::uint16_t port = port_ready.get();
    auto stranger = connector_settings(port);
    stranger.token = "wrong";
    CHECK_THROWS_WITH_AS(rdmachan::exchange_pairwise(stranger, predictable_endpoint(1, 2)),
                         doctest::Contains("failed to prove the job token"), rdmachan::Error);
    const auto from_listener =
        rdmachan::exchange_pairwise(connector_settings(port), predictable_endpoint(1, 2));
    CHECK(from_listener == predictable_endpoint(0, 2));
    CHECK(listened.get() == predictable_endpoint(1, 2));
}

TEST_CASE("a peer that never comes ends in a deadline error on either side") {
    std::promise<std::uint16_t> chosen;
    const auto start = std::chrono::steady_clock::now();
    CHECK_THROWS_WITH_AS(
        rdmachan::exchange_pairwise(listener_settings(chosen, 300ms), predictable_endpoint(0, 2)),
        doctest::Contains(
            "no peer proved the job token on 127.0.0.1:0 within the deadline of 300 ms"),
        rdmachan::Error);
    const std::uint16_t port = chosen.get_future().get();
    CHECK_THROWS_WITH_AS(
        rdmachan::exchange_pairwise(connector_settings(port, 300ms), predictable_endpoint(1, 2)),
        doctest::Contains("no answer from listener 127.0.0.1:"), rdmachan::Error);
    CHECK(std::chrono::steady_clock::now() - start < 2s);
}

TEST_CASE("with make_ready, neither side returns before both sides are ready") {
    // Each side's make_ready is slow; the other side must not return before it has finished.
    // (Without the ordering a connector returned, and sent, while the listener's queue pair was
    // still on its way to RTR.) The sleeps only make a wrong order visible: in the right order
    // no scheduling can make this case fail.
    std::atomic<bool> listener_ready{false}, connector_ready{false};
    std::atomic<bool> connector_saw_listener_ready{false}, listener_saw_connector_ready{false};
    std::promise<std::uint16_t> chosen;
    auto port_ready = chosen.get_future();
    auto listened = std::async(std::launch::async, [&] {
        const rdmachan::Endpoint theirs = rdmachan::exchange_pairwise(
            listener_settings(chosen, 10s), predictable_endpoint(0, 2), [&](const rdmachan::Endpoint& endpoint) {
                CHECK(endpoint == predictable_endpoint(1, 2));
                std::this_thread::sleep_for(200ms);
                listener_ready = true;
            });
        listener_saw_connector_ready = connector_ready.load();
        return theirs;
    });
    const rdmachan::Endpoint from_listener = rdmachan::exchange_pairwise(
        connector_settings(port_ready.get(), 10s), predictable_endpoint(1, 2), [&](const rdmachan::Endpoint& endpoint) {
            CHECK(endpoint == predictable_endpoint(0, 2));
            connector_saw_listener_ready = listener_ready.load();
            std::this_thread::sleep_for(200ms);
            connector_ready = true;
        });
    CHECK(from_listener == predictable_endpoint(0, 2));
    CHECK(listened.get() == predictable_endpoint(1, 2));
    CHECK(connector_saw_listener_ready.load());  // the listener was ready before its endpoint left
    CHECK(listener_saw_connector_ready.load());  // the listener returned only after the connector was ready
}

TEST_CASE("a side that cannot get ready ends the exchange on both sides, and the other is told why") {
    for (const bool listener_fails : {true, false}) {
        CAPTURE(listener_fails);
        std::promise<std::uint16_t> chosen;
        auto port_ready = chosen.get_future();
        const auto fail_if = [](bool fail) {
            return [fail](const rdmachan::Endpoint&) {
                if (fail) throw rdmachan::Error("MTU 1500 is not one of 256, 512, 1024, 2048, 4096");
            };
        };
        auto listened = std::async(std::launch::async, [&] {
            return rdmachan::test::error_of([&] {
                rdmachan::exchange_pairwise(listener_settings(chosen, 10s), predictable_endpoint(0, 2), fail_if(listener_fails));
            });
        });
        const std::string connector_error = rdmachan::test::error_of([&] {
            rdmachan::exchange_pairwise(connector_settings(port_ready.get(), 10s), predictable_endpoint(1, 2), fail_if(!listener_fails));
        });
        const std::string listener_error = listened.get();
        CAPTURE(connector_error);
        CAPTURE(listener_error);
        const std::string& told = listener_fails ? connector_error : listener_error;
        CHECK(told.find(listener_fails ? "the listener cannot connect: MTU 1500" : "the connector cannot connect: MTU 1500") !=
              std::string::npos);
        const std::string& failed = listener_fails ? listener_error : connector_error;
        CHECK(failed.find("cannot connect to") != std::string::npos);
        CHECK(failed.find("MTU 1500") != std::string::npos);
    }
}

TEST_CASE("negotiation: lowest MTU, random PSNs, keys and sessions") {
    CHECK(rdmachan::negotiate_mtu(4096, 1024, 2048) == 1024);
    CHECK(rdmachan::negotiate_mtu(4096, 4096, 2048) == 2048);
    CHECK_THROWS_WITH_AS(rdmachan::negotiate_mtu(4096, 1500, 4096),
                         "negotiate_mtu: remote MTU 1500 is not one of 256, 512, 1024, 2048, 4096",
                         rdmachan::Error);
    bool psn_varies = false;
    const std::uint32_t first = rdmachan::random_psn();
    for (int attempt = 0; attempt < 16; ++attempt) {
        const std::uint32_t psn = rdmachan::random_psn();
        CHECK(psn <= 0xffffff);
        psn_varies = psn_varies || psn != first;
    }
    CHECK(psn_varies);
    CHECK(rdmachan::random_dc_key() != rdmachan::random_dc_key());
    CHECK(rdmachan::random_session_id() != 0);
}
