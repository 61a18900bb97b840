// The software device's wire protocol against a peer that is not a device. As the target over a
// plain TCP socket, the test accepts an initiator device's connection, answers its hello, reads
// its request frames and writes whatever answers the case needs; as an initiator, it connects to
// a target device, says hello with or without the flag that accepts coalesced ACKs, and reads
// the answers to its writes. Answers a target may give (one ACK for several writes) complete the requests they
// cover, in order; answers no target gives (an ACK that would complete a read without its
// data, an ACK for a PSN not in flight) complete nothing; a malformed frame closes the
// connection and fails what was in flight with transport retry exceeded, as a ConnectX reports
// a peer it can no longer reach; a target coalesces ACKs only for an initiator that said it
// accepts them (transport/soft/README.md, "Wire protocol" and "Coalesced acknowledgements").
#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <vector>

#include "tests/loopback_port.hpp"
#include "tests/soft/scoped_environment.hpp"
#include "tests/soft/soft_endpoint.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/wire.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
namespace wire = rdmachan::soft::wire;
using rdmachan::test::Address;
using rdmachan::test::EndpointOptions;
using rdmachan::test::Environment;
using rdmachan::test::expect_send_completions;
using rdmachan::test::LoopbackPort;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kDeadline = std::chrono::seconds(10);

bool wait_for(int descriptor, short events) {
    pollfd entry{descriptor, events, 0};
    const int milliseconds = static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(kDeadline).count());
    return ::poll(&entry, 1, milliseconds) == 1;
}

// How a device on 127.0.0.1 is named: GID ::ffff:127.0.0.1, LID its port.
Address loopback_address(std::uint16_t port, std::uint32_t qpn) {
    Address address{};
    address.gid[10] = 0xff;
    address.gid[11] = 0xff;
    address.gid[12] = 127;
    address.gid[15] = 1;
    address.lid = port;
    address.qpn = qpn;
    return address;
}

// One connection carrying frames; every wait is bounded by kDeadline.
class FrameSocket {
public:
    FrameSocket() = default;
    explicit FrameSocket(int descriptor) : descriptor_(descriptor) {}
    ~FrameSocket() {
        if (descriptor_ >= 0) ::close(descriptor_);
    }
    FrameSocket(const FrameSocket&) = delete;
    FrameSocket& operator=(const FrameSocket&) = delete;
    void adopt(int descriptor) { descriptor_ = descriptor; }

    struct Frame {
        wire::FrameHeader header{};
        std::vector<std::uint8_t> body;
        std::vector<std::uint8_t> payload;
        template <typename Body>
        Body as(wire::FrameType type) const {
            Body parsed{};
            REQUIRE(header.type == type);
            std::memcpy(&parsed, body.data(), sizeof parsed);
            return parsed;
        }
        wire::Request request() const { return as<wire::Request>(wire::FrameType::request); }
    };

    Frame read_frame() {
        Frame frame;
        read_exact(&frame.header, sizeof frame.header);
        REQUIRE(frame.header.magic == wire::kMagic);
        frame.body.resize(wire::body_size(frame.header.type));
        REQUIRE(!frame.body.empty());
        read_exact(frame.body.data(), frame.body.size());
        frame.payload.resize(frame.header.payload_length);
        read_exact(frame.payload.data(), frame.payload.size());
        return frame;
    }
    // True when nothing more arrives within `wait`.
    bool quiet_for(std::chrono::milliseconds wait) {
        pollfd entry{descriptor_, POLLIN, 0};
        return ::poll(&entry, 1, static_cast<int>(wait.count())) == 0;
    }
    void send_bytes(const std::vector<std::uint8_t>& bytes) {
        std::size_t sent = 0;
        while (sent < bytes.size()) {
            REQUIRE(wait_for(descriptor_, POLLOUT));
            const ssize_t written = ::send(descriptor_, bytes.data() + sent, bytes.size() - sent, MSG_NOSIGNAL);
            REQUIRE(written > 0);
            sent += static_cast<std::size_t>(written);
        }
    }

private:
    void read_exact(void* into, std::size_t length) {
        auto* bytes = static_cast<std::uint8_t*>(into);
        std::size_t got = 0;
        while (got < length) {
            REQUIRE(wait_for(descriptor_, POLLIN));
            const ssize_t received = ::recv(descriptor_, bytes + got, length - got, 0);
            REQUIRE(received > 0);
            got += static_cast<std::size_t>(received);
        }
    }
    int descriptor_ = -1;
};

// Stands where a target device would be: accepts the one connection an initiator device opens.
class FakeTarget : public FrameSocket {
public:
    Address address(std::uint32_t qpn) const { return loopback_address(listener_.port(), qpn); }

    // Accepts the initiator's connection and answers its hello as a device on another host.
    void accept_and_answer_hello() {
        REQUIRE(wait_for(listener_.descriptor(), POLLIN));
        const int connection = ::accept4(listener_.descriptor(), nullptr, nullptr, SOCK_CLOEXEC);
        REQUIRE(connection >= 0);
        adopt(connection);
        const Frame hello = read_frame();
        REQUIRE(hello.header.type == wire::FrameType::hello);
        wire::Hello reply{};
        const Address self = address(0);
        std::memcpy(reply.gid, self.gid, 16);
        reply.lid = listener_.port();
        reply.same_host_flags = wire::kHelloReply;  // no host identity: the TCP path
        reply.published_table = -1;
        send_bytes(wire::frame(wire::FrameType::hello, reply));
    }

    void answer(const wire::Request& request, std::uint32_t psn, const void* payload = nullptr, std::uint32_t length = 0) {
        wire::Response response{};
        response.destination_qpn = request.source_qpn;
        response.psn = psn;
        response.kind = wire::ResponseKind::ack;
        send_bytes(wire::frame(wire::FrameType::response, response, payload, length));
    }

private:
    LoopbackPort listener_{LoopbackPort::Mode::listening};
};

// An initiator on a software device, connected over TCP to the fake target's QP 0x4242.
// Its ACK timeout is 69 s a try: within a case's waits (10 s) a request can only complete or
// fail through what the fake target sends, never through the timer.
EndpointOptions patient() {
    EndpointOptions options;
    options.timeout = 24;
    return options;
}

struct Initiator {
    Environment transport{"RDMACHAN_SOFT_TRANSPORT", "tcp"};
    std::shared_ptr<soft::Device> device = soft::Device::open();
    SoftEndpoint endpoint{device, patient()};

    explicit Initiator(FakeTarget& target) {
        endpoint.connect(target.address(0x4242));
        target.accept_and_answer_hello();
    }
};

constexpr std::uint64_t kRemoteBase = 0x10000;
constexpr std::uint32_t kRemoteKey = 0x77;

}  // namespace

TEST_CASE("hostile peer: an ACK that would complete a read without its data completes nothing") {
    FakeTarget target;
    Initiator initiator(target);
    SoftEndpoint& endpoint = initiator.endpoint;
    const mlx5::ScatterGatherElement eight = endpoint.local(0, 8);
    const mlx5::ScatterGatherElement into = endpoint.local(4096, 64);
    std::memset(endpoint.buffer() + 4096, 0, 64);
    mlx5::SendWorkRequest requests[3] = {
        write_request(1, &eight, kRemoteBase, kRemoteKey),
        write_request(2, &into, kRemoteBase + 64, kRemoteKey),
        write_request(3, &eight, kRemoteBase + 128, kRemoteKey),
    };
    requests[1].opcode = mlx5::SendOpcode::rdma_read;
    REQUIRE(endpoint.post(requests, 3) == mlx5::PostResult::ok);
    wire::Request sent[3];
    for (auto& request : sent) request = target.read_frame().request();
    CHECK(sent[1].psn == ((sent[0].psn + 1) & 0xffffff));
    CHECK(sent[2].psn == ((sent[0].psn + 2) & 0xffffff));

    // The third request's ACK first: it would cover the read, which needs its own answer.
    target.answer(sent[2], sent[2].psn);
    // Then the answers a target gives, in order: whatever the forged ACK had completed would
    // leave these stale, and the read would have completed with no data.
    std::uint8_t data[64];
    for (int b = 0; b < 64; ++b) data[b] = static_cast<std::uint8_t>(0xc0 + b);
    target.answer(sent[0], sent[0].psn);
    target.answer(sent[1], sent[1].psn, data, sizeof data);
    target.answer(sent[2], sent[2].psn);

    const mlx5::CompletionOpcode expected[3] = {mlx5::CompletionOpcode::rdma_write, mlx5::CompletionOpcode::rdma_read,
                                                mlx5::CompletionOpcode::rdma_write};
    expect_send_completions(endpoint, 1, expected);
    CHECK(std::memcmp(endpoint.buffer() + 4096, data, sizeof data) == 0);
}

TEST_CASE("hostile peer: one ACK for several writes completes each, in order; one for a PSN not in flight completes none") {
    FakeTarget target;
    Initiator initiator(target);
    SoftEndpoint& endpoint = initiator.endpoint;
    const mlx5::ScatterGatherElement eight = endpoint.local(0, 8);
    mlx5::SendWorkRequest writes[4];
    for (std::uint32_t i = 0; i < 4; ++i) writes[i] = write_request(10 + i, &eight, kRemoteBase + 64 * i, kRemoteKey);
    REQUIRE(endpoint.post(writes, 4) == mlx5::PostResult::ok);
    wire::Request sent[4];
    for (auto& request : sent) request = target.read_frame().request();

    // Beyond the last request in flight, and behind the first: neither is an ACK of these.
    target.answer(sent[0], (sent[3].psn + 1) & 0xffffff);
    target.answer(sent[0], (sent[0].psn - 1) & 0xffffff);
    // The third's ACK covers the first two; the fourth's is its own.
    target.answer(sent[2], sent[2].psn);
    const mlx5::CompletionOpcode three_writes[3] = {mlx5::CompletionOpcode::rdma_write, mlx5::CompletionOpcode::rdma_write,
                                                    mlx5::CompletionOpcode::rdma_write};
    expect_send_completions(endpoint, 10, three_writes);
    // The two foreign ACKs came before the covering one on the same stream: had either
    // completed anything, the fourth write would have completed by now too.
    CHECK_FALSE(endpoint.wait_send(std::chrono::milliseconds(0)).has_value());
    target.answer(sent[3], sent[3].psn);
    const auto last = endpoint.wait_send();
    REQUIRE(last.has_value());
    CHECK(last->status == mlx5::CompletionStatus::success);
    CHECK(last->wr_id == 13);
}

TEST_CASE("hostile peer: a malformed frame closes the connection and fails the requests in flight") {
    FakeTarget target;
    Initiator initiator(target);
    SoftEndpoint& endpoint = initiator.endpoint;
    const mlx5::ScatterGatherElement eight = endpoint.local(0, 8);
    const mlx5::SendWorkRequest write = write_request(20, &eight, kRemoteBase, kRemoteKey);
    REQUIRE(endpoint.post(&write, 1) == mlx5::PostResult::ok);
    (void)target.read_frame();
    const std::vector<std::uint8_t> garbage(sizeof(wire::FrameHeader) + sizeof(wire::Response), 0x5a);  // no magic
    target.send_bytes(garbage);
    const auto completion = endpoint.wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->wr_id == 20);
    CHECK(completion->status == mlx5::CompletionStatus::transport_retry_exceeded);
}

namespace {

// Three 8-byte writes from a fake initiator (QP 0x5151 at the listener's LID) to a target device's
// QP, sent after its hello in one system call, so that the device reads them in one turn; returns
// the ACKs' PSNs in the order they came, once `expected` have come.
std::vector<std::uint32_t> acknowledged_writes(bool accepts_coalesced, std::size_t expected) {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "tcp");
    const LoopbackPort initiator_port(LoopbackPort::Mode::listening);  // where the target's own connection to the initiator goes; never answered
    auto device = soft::Device::open();
    SoftEndpoint target(device);
    std::memset(target.buffer(), 0, 256);
    constexpr std::uint32_t kInitiatorQp = 0x5151;
    target.connect(loopback_address(initiator_port.port(), kInitiatorQp));

    const int descriptor = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    REQUIRE(descriptor >= 0);
    FrameSocket connection(descriptor);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    address.sin_port = htons(device->lid());
    REQUIRE(::connect(descriptor, reinterpret_cast<sockaddr*>(&address), sizeof address) == 0);

    wire::Hello hello{};
    const Address self = loopback_address(initiator_port.port(), kInitiatorQp);
    std::memcpy(hello.gid, self.gid, 16);
    hello.lid = initiator_port.port();
    hello.same_host_flags = accepts_coalesced ? wire::kAcceptsCoalescedAcks : 0;
    hello.published_table = -1;
    std::vector<std::uint8_t> bytes = wire::frame(wire::FrameType::hello, hello);
    const Address where = target.address();
    for (std::uint32_t i = 0; i < 3; ++i) {
        wire::Request write{};
        write.source_qpn = kInitiatorQp;
        write.destination_qpn = where.qpn;
        write.psn = 0x1000 + i;  // the target's rq_psn (SoftEndpoint::connect)
        write.opcode = mlx5::kOpcodeRdmaWrite;
        write.remote_addr = where.buffer_addr + 64 * i;
        write.rkey = where.rkey;
        write.length = 8;
        const std::uint8_t payload[8] = {static_cast<std::uint8_t>(0xa1 + i), 2, 3, 4, 5, 6, 7, 8};
        const std::vector<std::uint8_t> frame = wire::frame(wire::FrameType::request, write, payload, sizeof payload);
        bytes.insert(bytes.end(), frame.begin(), frame.end());
    }
    connection.send_bytes(bytes);

    const FrameSocket::Frame reply = connection.read_frame();
    CHECK((reply.as<wire::Hello>(wire::FrameType::hello).same_host_flags & wire::kHelloReply) != 0);
    std::vector<std::uint32_t> psns;
    while (psns.size() < expected) {
        const wire::Response response = connection.read_frame().as<wire::Response>(wire::FrameType::response);
        CHECK(response.kind == wire::ResponseKind::ack);
        CHECK(response.destination_qpn == kInitiatorQp);
        psns.push_back(response.psn);
    }
    // Nothing after: the ACKs counted are all the target sends for these writes.
    CHECK(connection.quiet_for(std::chrono::milliseconds(100)));
    soft::acquire_remote_writes();
    for (std::uint32_t i = 0; i < 3; ++i) CHECK(target.buffer()[64 * i] == 0xa1 + i);
    return psns;
}

}  // namespace

TEST_CASE("hostile peer: a target coalesces the ACKs of an initiator that accepts them, and only of one") {
    SUBCASE("the initiator's hello says it accepts coalesced ACKs: one ACK, the last write's") {
        CHECK(acknowledged_writes(true, 1) == std::vector<std::uint32_t>{0x1002});
    }
    SUBCASE("a hello without the flag, as from an earlier device: one ACK per write, in order") {
        CHECK(acknowledged_writes(false, 3) == std::vector<std::uint32_t>{0x1000, 0x1001, 0x1002});
    }
}
