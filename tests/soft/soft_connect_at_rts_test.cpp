// When an RC QP reaches RTS, the software device opens the connection to the QP's remote device
// in the background: the hello, the same-host probe and the mapping of the peer's table happen
// before the first request, not inside it. Here: the path settles with nothing posted and the
// first write then goes zero-hop; a remote device that does not exist costs nothing until a
// request needs it, which then completes with transport retry exceeded; QPs connected to their
// own device open no connection; the progress thread's polling window is checked and works.
#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <string>
#include <thread>

#include "tests/soft/device_pair.hpp"
#include "tests/soft/eventually.hpp"
#include "tests/loopback_port.hpp"
#include "tests/soft/scoped_environment.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::bytes_differing;
using rdmachan::test::DevicePair;
using rdmachan::test::EndpointOptions;
using rdmachan::test::eventually;
using rdmachan::test::LoopbackPort;
using rdmachan::test::run_signaled;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

TEST_CASE("an RC QP at RTS settles the path to its remote device before any request, and the first write goes zero-hop") {
    DevicePair pair;  // both QPs at RTS, nothing posted
    REQUIRE(eventually([&] { return pair.initiator_device->answered_hellos() == 1 && pair.target_device->answered_hellos() == 1; }, std::chrono::seconds(5)));
    CHECK(pair.initiator_device->connects_started() == 1);
    CHECK(pair.initiator_device->connects_failed() == 0);
    CHECK(pair.initiator_device->requests_from_doorbell() == 0);

    std::memset(pair.initiator.buffer(), 0x5a, 65536);
    const std::uint64_t zero_hop_before = pair.initiator_device->zero_hop_writes();
    const mlx5::ScatterGatherElement source = pair.initiator.local(0, 65536);
    CHECK(run_signaled(pair.initiator, write_request(1, &source, pair.remote.buffer_addr, pair.remote.rkey)).status ==
          mlx5::CompletionStatus::success);
    CHECK(pair.initiator_device->zero_hop_writes() == zero_hop_before + 1);
    CHECK(bytes_differing(pair.target.buffer(), 65536, 0x5a) == 0);
    // The request found the connection open: no second connect.
    CHECK(pair.initiator_device->connects_started() == 1);
}

TEST_CASE("a remote device that does not exist: the connect at RTS fails quietly, and the first request completes with transport retry exceeded") {
    const LoopbackPort nowhere_port(LoopbackPort::Mode::refusing);
    auto device = soft::Device::open();
    EndpointOptions options;
    options.timeout = 10;  // 4 ms per try
    options.retry_cnt = 1;
    SoftEndpoint endpoint(device, options);
    Address nowhere = endpoint.address();
    nowhere.lid = nowhere_port.port();
    nowhere.qpn = 0x1234;
    endpoint.connect(nowhere);
    REQUIRE(eventually([&] { return device->connects_failed() == 1; }, std::chrono::seconds(5)));
    CHECK(device->connects_started() == 1);
    CHECK(device->answered_hellos() == 0);

    const mlx5::ScatterGatherElement source = endpoint.local(0, 8);
    const mlx5::Completion completion = run_signaled(endpoint, write_request(7, &source, nowhere.buffer_addr, nowhere.rkey));
    CHECK(completion.status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(completion.wr_id == 7);
    // The request connected again (bounded), and was refused again.
    CHECK(device->connects_started() == 2);
    CHECK(device->connects_failed() == 2);
}

TEST_CASE("QPs connected to their own device open no connection; a QP to another device opens one") {
    auto device = soft::Device::open();
    auto other = soft::Device::open();
    SoftEndpoint first(device);
    SoftEndpoint second(device);
    SoftEndpoint elsewhere(other);
    first.connect(second.address());
    second.connect(first.address());
    // RTS after the two above: the progress thread sees the paths to open in this order, so once
    // the last one settled, any connection the first two asked for was begun too.
    SoftEndpoint third(device);
    third.connect(elsewhere.address());
    REQUIRE(eventually([&] { return device->answered_hellos() == 1; }, std::chrono::seconds(5)));
    CHECK(device->connects_started() == 1);
    CHECK(device->connects_failed() == 0);
}

TEST_CASE("RDMACHAN_SOFT_POLL_US: a value that is not 0 to 100000 microseconds names the variable; with 0 and with a window every request goes through") {
    for (const char* bad : {"fast", "-1", "100001", "50us"}) {
        CAPTURE(bad);
        rdmachan::test::Environment poll("RDMACHAN_SOFT_POLL_US", bad);
        const std::string named = std::string("RDMACHAN_SOFT_POLL_US = '") + bad + "'";
        CHECK_THROWS_WITH_AS(soft::Device::open(), doctest::Contains(named.c_str()), soft::SoftDeviceError);
    }
    for (const char* window : {"0", "200"}) {
        CAPTURE(window);
        rdmachan::test::Environment poll("RDMACHAN_SOFT_POLL_US", window);
        rdmachan::test::DevicePairSettings settings;
        settings.transport = "tcp";  // every request through the progress threads
        DevicePair pair(settings);
        std::memset(pair.initiator.buffer(), window[0], 4096);
        const mlx5::ScatterGatherElement source = pair.initiator.local(0, 4096);
        for (std::uint64_t i = 0; i < 100; ++i) {
            REQUIRE(run_signaled(pair.initiator, write_request(i, &source, pair.remote.buffer_addr, pair.remote.rkey)).status ==
                    mlx5::CompletionStatus::success);
        }
        CHECK(bytes_differing(pair.target.buffer(), 4096, static_cast<std::uint8_t>(window[0])) == 0);
        CHECK(pair.initiator_device->zero_hop_writes() == 0);
    }
}
