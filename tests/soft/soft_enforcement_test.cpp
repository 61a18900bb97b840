// The checks hardware makes, made by the software device: keys, bounds, access rights, RNR,
// flushes after ERR, and a peer that disappears. Each test asserts the error completion and
// that the target's memory was not touched.
#include <doctest/doctest.h>

#include <cstring>
#include <thread>

#include "tests/soft/soft_endpoint.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::EndpointOptions;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

struct Pair {
    std::shared_ptr<soft::Device> first_device = soft::Device::open();
    std::shared_ptr<soft::Device> second_device = soft::Device::open();
    std::unique_ptr<SoftEndpoint> a;
    std::unique_ptr<SoftEndpoint> b;

    explicit Pair(const EndpointOptions& a_options = {}, const EndpointOptions& b_options = {}) {
        a = std::make_unique<SoftEndpoint>(first_device, a_options);
        b = std::make_unique<SoftEndpoint>(second_device, b_options);
        a->connect(b->address());
        b->connect(a->address());
    }
};

bool all_zero(const std::uint8_t* bytes, std::size_t length) {
    for (std::size_t i = 0; i < length; ++i) {
        if (bytes[i] != 0) return false;
    }
    return true;
}

// After an error, the QP is in ERR and whatever is posted next completes as flushed.
void check_flushed_after_error(SoftEndpoint& endpoint) {
    CHECK(endpoint.queue_pair().state() == soft::QueuePairState::error);
    const mlx5::ScatterGatherElement element = endpoint.local(0, 8);
    const mlx5::SendWorkRequest request = write_request(999, &element, 0, 0, 0);  // unsignaled: errors complete anyway
    REQUIRE(endpoint.post(&request, 1) == mlx5::PostResult::ok);
    const auto flushed = endpoint.wait_send();
    REQUIRE(flushed.has_value());
    CHECK(flushed->wr_id == 999);
    CHECK(flushed->status == mlx5::CompletionStatus::work_request_flushed);
}

}  // namespace

TEST_CASE("a bad rkey gives a remote access error and leaves the target untouched") {
    Pair pair;
    std::memset(pair.a->buffer(), 0xab, 4096);
    const mlx5::ScatterGatherElement element = pair.a->local(0, 4096);
    const mlx5::SendWorkRequest request = write_request(1, &element, pair.b->address().buffer_addr, pair.b->address().rkey ^ 0x100);
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = pair.a->wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->wr_id == 1);
    CHECK(completion->status == mlx5::CompletionStatus::remote_access_error);
    CHECK(completion->syndrome == mlx5::kSyndromeRemoteAccess);
    CHECK(all_zero(pair.b->buffer(), 1 << 20));
    check_flushed_after_error(*pair.a);
}

TEST_CASE("a write past the end of the remote region is refused") {
    Pair pair;
    std::memset(pair.a->buffer(), 0xcd, 4096);
    const mlx5::ScatterGatherElement element = pair.a->local(0, 4096);
    const rdmachan::test::Address remote = pair.b->address();
    const mlx5::SendWorkRequest request = write_request(2, &element, remote.buffer_addr + (1 << 20) - 100, remote.rkey);
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = pair.a->wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::remote_access_error);
    CHECK(all_zero(pair.b->buffer(), 1 << 20));
}

TEST_CASE("a region registered without remote write access cannot be written") {
    Pair pair;
    std::vector<std::uint8_t> local_only(4096, 0);
    auto region = pair.second_device->register_memory(pair.b->domain_pointer(), local_only.data(), local_only.size(),
                                                      soft::kLocalWrite | soft::kRemoteRead);
    std::memset(pair.a->buffer(), 0xef, 64);
    const mlx5::ScatterGatherElement element = pair.a->local(0, 64);
    const mlx5::SendWorkRequest request =
        write_request(3, &element, reinterpret_cast<std::uint64_t>(local_only.data()), region->rkey());
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = pair.a->wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::remote_access_error);
    CHECK(all_zero(local_only.data(), local_only.size()));
}

TEST_CASE("a QP without remote write access refuses writes") {
    EndpointOptions read_only;
    read_only.access = soft::kLocalWrite | soft::kRemoteRead;
    Pair pair({}, read_only);
    std::memset(pair.a->buffer(), 0x11, 64);
    const mlx5::ScatterGatherElement element = pair.a->local(0, 64);
    const mlx5::SendWorkRequest request = write_request(4, &element, pair.b->address().buffer_addr, pair.b->address().rkey);
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = pair.a->wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::remote_access_error);
    CHECK(all_zero(pair.b->buffer(), 64));
}

TEST_CASE("a bad lkey gives a local protection error before anything leaves") {
    Pair pair;
    mlx5::ScatterGatherElement element = pair.a->local(0, 64);
    element.lkey ^= 0x200;
    const mlx5::SendWorkRequest request = write_request(5, &element, pair.b->address().buffer_addr, pair.b->address().rkey);
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = pair.a->wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::local_protection_error);
    check_flushed_after_error(*pair.a);
}

TEST_CASE("a misaligned atomic is a remote invalid request") {
    Pair pair;
    const mlx5::ScatterGatherElement element = pair.a->local(0, 8);
    mlx5::SendWorkRequest request = write_request(6, &element, pair.b->address().buffer_addr + 4, pair.b->address().rkey);
    request.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
    request.compare_add = 1;
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = pair.a->wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::remote_invalid_request);
    CHECK(all_zero(pair.b->buffer(), 64));
}

TEST_CASE("a send longer than the receive: remote invalid request and a local length error") {
    Pair pair;
    REQUIRE(pair.b->post_receive(70, 0, 100) == mlx5::PostResult::ok);
    const mlx5::ScatterGatherElement element = pair.a->local(0, 200);
    mlx5::SendWorkRequest request;
    request.wr_id = 7;
    request.opcode = mlx5::SendOpcode::send;
    request.flags = mlx5::kSendSignaled;
    request.sg_list = &element;
    request.num_sge = 1;
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto sent = pair.a->wait_send();
    REQUIRE(sent.has_value());
    CHECK(sent->status == mlx5::CompletionStatus::remote_invalid_request);
    const auto received = pair.b->wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->wr_id == 70);
    CHECK(received->status == mlx5::CompletionStatus::local_length_error);
}

TEST_CASE("receiver not ready: retried until a receive is posted") {
    EndpointOptions options;
    options.rnr_retry = 7;  // forever
    options.min_rnr_timer = 1;
    Pair pair(options, options);
    std::memset(pair.a->buffer(), 0x5a, 32);
    const mlx5::ScatterGatherElement element = pair.a->local(0, 32);
    mlx5::SendWorkRequest request;
    request.wr_id = 8;
    request.opcode = mlx5::SendOpcode::send;
    request.flags = mlx5::kSendSignaled;
    request.sg_list = &element;
    request.num_sge = 1;
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    CHECK_FALSE(pair.a->wait_send(std::chrono::milliseconds(50)).has_value());
    REQUIRE(pair.b->post_receive(80, 4096, 64) == mlx5::PostResult::ok);
    const auto sent = pair.a->wait_send();
    REQUIRE(sent.has_value());
    CHECK(sent->status == mlx5::CompletionStatus::success);
    const auto received = pair.b->wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->wr_id == 80);
    CHECK(pair.b->buffer()[4096] == 0x5a);
}

TEST_CASE("receiver not ready: RNR retry exceeded") {
    EndpointOptions options;
    options.rnr_retry = 2;
    options.min_rnr_timer = 1;
    Pair pair(options, options);
    const mlx5::ScatterGatherElement element = pair.a->local(0, 32);
    mlx5::SendWorkRequest request;
    request.wr_id = 9;
    request.opcode = mlx5::SendOpcode::send;
    request.flags = mlx5::kSendSignaled;
    request.sg_list = &element;
    request.num_sge = 1;
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto sent = pair.a->wait_send();
    REQUIRE(sent.has_value());
    CHECK(sent->status == mlx5::CompletionStatus::rnr_retry_exceeded);
    check_flushed_after_error(*pair.a);
}

TEST_CASE("requests sent before the responder reaches RTR are sent again each ACK timeout and executed once") {
    // 4.096 us * 2^14 = 67 ms per try, 7 retries: about 537 ms before the requester gives up,
    // room for a loaded machine between the wait below and the responder's RTR.
    EndpointOptions options;
    options.timeout = 14;
    options.retry_cnt = 7;
    std::shared_ptr<soft::Device> first_device = soft::Device::open();
    std::shared_ptr<soft::Device> second_device = soft::Device::open();
    SoftEndpoint a(first_device, options);
    SoftEndpoint b(second_device, options);
    a.connect(b.address());  // b stays in INIT: it drops what arrives
    std::memset(a.buffer(), 0x77, 64);
    const mlx5::ScatterGatherElement payload = a.local(0, 64);
    const mlx5::ScatterGatherElement result = a.local(64, 8);
    mlx5::SendWorkRequest requests[2];
    requests[0] = write_request(1, &payload, b.address().buffer_addr + 128, b.address().rkey);
    requests[0].flags = 0;
    requests[1] = write_request(2, &result, b.address().buffer_addr, b.address().rkey);
    requests[1].opcode = mlx5::SendOpcode::atomic_fetch_and_add;
    requests[1].compare_add = 5;
    REQUIRE(a.post(requests, 2) == mlx5::PostResult::ok);
    CHECK_FALSE(a.wait_send(std::chrono::milliseconds(150)).has_value());  // two tries and more, dropped
    b.connect(a.address());
    const auto completion = a.wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->wr_id == 2);
    CHECK(completion->status == mlx5::CompletionStatus::success);
    std::uint64_t word = 0;
    std::memcpy(&word, b.buffer(), 8);
    CHECK(word == 5);  // added once, however many copies were sent
    std::uint64_t old = 1;
    std::memcpy(&old, a.buffer() + 64, 8);
    CHECK(old == 0);
    CHECK(b.buffer()[128] == 0x77);
    CHECK(b.buffer()[191] == 0x77);
}

TEST_CASE("a responder that never reaches RTR: transport retry exceeded after retry_cnt resends") {
    EndpointOptions options;
    options.timeout = 12;
    options.retry_cnt = 2;  // three tries of 16.8 ms
    std::shared_ptr<soft::Device> first_device = soft::Device::open();
    std::shared_ptr<soft::Device> second_device = soft::Device::open();
    SoftEndpoint a(first_device, options);
    SoftEndpoint b(second_device, options);
    a.connect(b.address());
    const mlx5::ScatterGatherElement payload = a.local(0, 64);
    mlx5::SendWorkRequest request = write_request(3, &payload, b.address().buffer_addr, b.address().rkey);
    const auto started = std::chrono::steady_clock::now();
    REQUIRE(a.post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = a.wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(std::chrono::steady_clock::now() - started >= std::chrono::milliseconds(50));
    CHECK(all_zero(b.buffer(), 64));
}

TEST_CASE("moving a QP to ERR flushes its posted receives and later sends") {
    Pair pair;
    REQUIRE(pair.a->post_receive(90, 0, 64) == mlx5::PostResult::ok);
    REQUIRE(pair.a->post_receive(91, 64, 64) == mlx5::PostResult::ok);
    pair.a->queue_pair().modify_to_error();
    const auto first = pair.a->wait_receive();
    const auto second = pair.a->wait_receive();
    REQUIRE(first.has_value());
    REQUIRE(second.has_value());
    CHECK(first->wr_id == 90);
    CHECK(second->wr_id == 91);
    CHECK(first->status == mlx5::CompletionStatus::work_request_flushed);
    CHECK(second->status == mlx5::CompletionStatus::work_request_flushed);
    // A receive posted while in ERR is flushed too.
    REQUIRE(pair.a->post_receive(92, 0, 64) == mlx5::PostResult::ok);
    const auto late = pair.a->wait_receive();
    REQUIRE(late.has_value());
    CHECK(late->wr_id == 92);
    CHECK(late->status == mlx5::CompletionStatus::work_request_flushed);
    check_flushed_after_error(*pair.a);
}

TEST_CASE("a peer device that disappears fails outstanding work within the transport timeout") {
    EndpointOptions options;
    options.timeout = 10;   // 4.2 ms per try
    options.retry_cnt = 2;
    Pair pair(options, options);
    pair.b.reset();
    pair.second_device.reset();  // closes its sockets: as if the process died
    const mlx5::ScatterGatherElement element = pair.a->local(0, 64);
    const mlx5::SendWorkRequest request = write_request(10, &element, 0x1000, 0x1234);
    const auto start = std::chrono::steady_clock::now();
    REQUIRE(pair.a->post(&request, 1) == mlx5::PostResult::ok);
    const auto completion = pair.a->wait_send(std::chrono::seconds(5));
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(3));
}

TEST_CASE("control-plane errors name the call and the value") {
    auto device = soft::Device::open();
    auto domain = device->allocate_protection_domain();
    std::vector<std::uint8_t> memory(64);
    CHECK_THROWS_WITH_AS(device->register_memory(domain, memory.data(), 64, soft::kRemoteWrite),
                         doctest::Contains("requires local write"), soft::SoftDeviceError);
    CHECK_THROWS_WITH_AS(device->register_memory(domain, memory.data(), 0, soft::kLocalWrite),
                         doctest::Contains("length is 0"), soft::SoftDeviceError);
    CHECK_THROWS_WITH_AS(device->create_completion_queue(16, 96), doctest::Contains("cqe_size = 96"), soft::SoftDeviceError);
    auto cq = device->create_completion_queue(16);
    soft::QueuePairInit init;
    init.send_cq = cq;
    init.recv_cq = cq;
    init.capabilities.max_send_sge = 64;
    CHECK_THROWS_WITH_AS(device->create_queue_pair(domain, init), doctest::Contains("max_send_sge = 64"), soft::SoftDeviceError);
    init.capabilities.max_send_sge = 1;
    auto queue_pair = device->create_queue_pair(domain, init);
    soft::ReadyToSendAttributes send;
    CHECK_THROWS_WITH_AS(queue_pair->modify_to_ready_to_send(send), doctest::Contains("RESET -> RTS"), soft::SoftDeviceError);
    queue_pair->modify_to_init(1, soft::kLocalWrite);
    soft::ReadyToReceiveAttributes receive;
    receive.remote.qpn = 5;
    receive.path_mtu_bytes = 1500;
    CHECK_THROWS_WITH_AS(queue_pair->modify_to_ready_to_receive(receive), doctest::Contains("path_mtu = 1500"),
                         soft::SoftDeviceError);
    CHECK_THROWS_WITH_AS(soft::Device::open({"not-an-address", 0}), doctest::Contains("not-an-address"), soft::SoftDeviceError);
}
