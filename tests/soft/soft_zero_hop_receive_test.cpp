// Zero-hop receives on the software device's same-host path (zero_hop_receive.cpp):
// sends and RDMA writes with immediate whose receive WQE and CQE the initiator's thread takes
// and writes in the target's arena. Here: every kind lands with the completion the request path
// gives, field by field; the target's device moves nothing; whatever the zero-hop path may not
// do (no receive posted, a message longer than the receive, a bad key) goes the request path
// with its RNR, NAK and error CQEs, no receive consumed by the refusal; a long mixed stream in
// both directions at once, the target's own CQEs and its peer's sharing its CQs, keeps every
// completion in order; the receive lock is taken over from a holder that died.
#include <doctest/doctest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "tests/sanitizer_build.hpp"
#include "tests/soft/device_pair.hpp"
#include "transport/soft/peer_table.hpp"
#include "transport/soft/published_table.hpp"
#include "transport/soft/shared_arena.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::DevicePair;
using rdmachan::test::DevicePairSettings;
using rdmachan::test::run_signaled;
using rdmachan::test::send_request;
using rdmachan::test::settle_path;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

// Both endpoints' buffers from their devices' arenas, on the same-host path, settled; zero-hop
// on ("1") or off ("0", every request on the request path).
DevicePairSettings arena_pair(const char* zero_hop) {
    DevicePairSettings settings;
    settings.zero_hop = zero_hop;
    settings.target.allocated = true;
    settings.initiator.allocated = true;
    return settings;
}

class ReceivePair : public DevicePair {
public:
    explicit ReceivePair(const char* zero_hop = "1") : DevicePair(arena_pair(zero_hop)) {
        REQUIRE(settle_path(initiator, remote));
    }
};

// What the target sees of each kind, in one order: the completions and the bytes.
struct Seen {
    std::vector<mlx5::Completion> sender;
    std::vector<mlx5::Completion> receiver;
    std::vector<std::uint8_t> bytes;
    std::uint64_t zero_hop_receives = 0;
    std::uint64_t moved_by_target = 0;
    std::uint16_t sender_lid = 0;  // each run's devices have their own LIDs and QP numbers
    std::uint32_t sender_qpn = 0;
    std::uint32_t receiver_qpn = 0;
};

Seen run_every_kind(const char* zero_hop) {
    ReceivePair pair(zero_hop);
    for (std::uint32_t b = 0; b < 262144; ++b) pair.initiator.buffer()[b] = static_cast<std::uint8_t>(b * 11 + 3);
    std::memset(pair.target.buffer(), 0xee, 1 << 20);
    // Receives: one for each message.
    REQUIRE(pair.target.post_receive(10, 0, 64) == mlx5::PostResult::ok);
    REQUIRE(pair.target.post_receive(11, 4096, 8192) == mlx5::PostResult::ok);
    REQUIRE(pair.target.post_receive(12, 16384, 100) == mlx5::PostResult::ok);
    REQUIRE(pair.target.post_receive(13, 0, 0) == mlx5::PostResult::ok);  // for the write's immediate
    REQUIRE(pair.target.post_receive(14, 0, 0) == mlx5::PostResult::ok);  // for an empty send

    Seen seen;
    const mlx5::ScatterGatherElement inline_bytes = pair.initiator.local(0, 8);
    seen.sender.push_back(run_signaled(pair.initiator, send_request(1, &inline_bytes, 1, mlx5::SendOpcode::send, mlx5::kSendInline)));
    const mlx5::ScatterGatherElement gathered[2] = {pair.initiator.local(100, 3000), pair.initiator.local(8000, 5192)};
    mlx5::SendWorkRequest with_immediate = send_request(2, gathered, 2, mlx5::SendOpcode::send_with_immediate);
    with_immediate.immediate = 0x01020304;
    seen.sender.push_back(run_signaled(pair.initiator, with_immediate));
    const mlx5::ScatterGatherElement exact = pair.initiator.local(50000, 100);
    seen.sender.push_back(run_signaled(pair.initiator, send_request(3, &exact, 1, mlx5::SendOpcode::send)));
    const mlx5::ScatterGatherElement large = pair.initiator.local(65536, 65536);
    mlx5::SendWorkRequest write = write_request(4, &large, pair.remote.buffer_addr + 131072, pair.remote.rkey);
    write.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
    write.immediate = 0xa0b0c0d0;
    seen.sender.push_back(run_signaled(pair.initiator, write));
    seen.sender.push_back(run_signaled(pair.initiator, send_request(5, nullptr, 0, mlx5::SendOpcode::send)));

    for (int i = 0; i < 5; ++i) {
        const auto completion = pair.target.wait_receive();
        REQUIRE(completion.has_value());
        seen.receiver.push_back(*completion);
    }
    soft::acquire_remote_writes();
    seen.bytes.assign(pair.target.buffer(), pair.target.buffer() + 262144);
    seen.zero_hop_receives = pair.initiator_device->zero_hop_receives();
    seen.moved_by_target = pair.target_device->transfers_by_reference();
    seen.sender_lid = pair.initiator_device->lid();
    seen.sender_qpn = pair.initiator.queue_pair().qpn();
    seen.receiver_qpn = pair.target.queue_pair().qpn();
    return seen;
}

}  // namespace

TEST_CASE("zero-hop receive: sends and writes with immediate complete as on the request path, the target's device moving nothing") {
    const Seen zero_hop = run_every_kind("1");
    const Seen request_path = run_every_kind("0");
    CHECK(zero_hop.zero_hop_receives == 5);
    CHECK(zero_hop.moved_by_target == 0);
    CHECK(request_path.zero_hop_receives == 0);
    CHECK(request_path.moved_by_target > 0);  // the gathered send and the write went by reference

    REQUIRE(zero_hop.receiver.size() == request_path.receiver.size());
    for (std::size_t i = 0; i < zero_hop.receiver.size(); ++i) {
        CAPTURE(i);
        const mlx5::Completion& mine = zero_hop.receiver[i];
        const mlx5::Completion& theirs = request_path.receiver[i];
        CHECK(mine.status == mlx5::CompletionStatus::success);
        CHECK(mine.wr_id == theirs.wr_id);
        CHECK(mine.status == theirs.status);
        CHECK(mine.opcode == theirs.opcode);
        CHECK(mine.flags == theirs.flags);
        CHECK(mine.is_receive == theirs.is_receive);
        CHECK(mine.byte_len == theirs.byte_len);
        CHECK(mine.immediate == theirs.immediate);
        CHECK(mine.slid == zero_hop.sender_lid);
        CHECK(theirs.slid == request_path.sender_lid);
        CHECK(mine.sl == theirs.sl);
        CHECK(mine.pkey_index == theirs.pkey_index);
        CHECK(mine.dlid_path_bits == theirs.dlid_path_bits);
        CHECK(mine.qp_num == zero_hop.receiver_qpn);
        CHECK(theirs.qp_num == request_path.receiver_qpn);
        CHECK(mine.src_qp == zero_hop.sender_qpn);
        CHECK(theirs.src_qp == request_path.sender_qpn);
    }
    CHECK(zero_hop.receiver[0].wr_id == 10);
    CHECK(zero_hop.receiver[0].byte_len == 8);
    CHECK(zero_hop.receiver[1].byte_len == 8192);
    CHECK(zero_hop.receiver[1].immediate == 0x01020304);
    CHECK(zero_hop.receiver[3].byte_len == 65536);
    CHECK(zero_hop.receiver[3].immediate == 0xa0b0c0d0);
    CHECK(zero_hop.receiver[4].byte_len == 0);
    REQUIRE(zero_hop.sender.size() == request_path.sender.size());
    for (std::size_t i = 0; i < zero_hop.sender.size(); ++i) {
        CAPTURE(i);
        CHECK(zero_hop.sender[i].status == mlx5::CompletionStatus::success);
        CHECK(zero_hop.sender[i].wr_id == request_path.sender[i].wr_id);
        CHECK(zero_hop.sender[i].opcode == request_path.sender[i].opcode);
        CHECK(zero_hop.sender[i].byte_len == request_path.sender[i].byte_len);
    }
    // Every byte of the target's buffer the same, those no message names still 0xee.
    CHECK(zero_hop.bytes == request_path.bytes);
}

TEST_CASE("zero-hop receive: no receive posted takes the request path (RNR, then the retry delivers it)") {
    ReceivePair pair;
    const mlx5::ScatterGatherElement bytes = pair.initiator.local(0, 16);
    std::memset(pair.initiator.buffer(), 0x42, 16);
    REQUIRE(pair.initiator.post(std::vector{send_request(1, &bytes, 1, mlx5::SendOpcode::send)}.data(), 1) ==
            mlx5::PostResult::ok);
    // Nothing posted: no receive completes, and the send waits out RNR NAKs.
    CHECK_FALSE(pair.target.wait_receive(std::chrono::milliseconds(50)).has_value());
    REQUIRE(pair.target.post_receive(7, 512, 16) == mlx5::PostResult::ok);
    const auto received = pair.target.wait_receive();
    REQUIRE(received.has_value());
    CHECK(received->wr_id == 7);
    CHECK(received->byte_len == 16);
    const auto sent = pair.initiator.wait_send();
    REQUIRE(sent.has_value());
    CHECK(sent->status == mlx5::CompletionStatus::success);
    CHECK(pair.initiator_device->zero_hop_receives() == 0);  // the retry was in flight: the request path's
    soft::acquire_remote_writes();
    CHECK(pair.target.buffer()[512] == 0x42);
}

TEST_CASE("zero-hop receive: the sends after one refused for want of a receive wait for its answer, then go zero-hop") {
    ReceivePair pair;
    constexpr std::uint32_t kSends = 11;
    for (std::uint32_t i = 0; i < kSends; ++i) std::memset(pair.initiator.buffer() + i * 64, static_cast<int>(0x10 + i), 64);
    // No receive posted: the first send takes the request path and waits out RNR NAKs; the ten
    // after it are posted at once behind it.
    for (std::uint32_t i = 0; i < kSends; ++i) {
        const mlx5::ScatterGatherElement bytes = pair.initiator.local(i * 64, 64);
        REQUIRE(pair.initiator.post(std::vector{send_request(100 + i, &bytes, 1, mlx5::SendOpcode::send)}.data(), 1) ==
                mlx5::PostResult::ok);
    }
    CHECK_FALSE(pair.target.wait_receive(std::chrono::milliseconds(50)).has_value());
    REQUIRE(pair.target.post_receives(1, kSends, 4096, 64, 64) == mlx5::PostResult::ok);
    for (std::uint32_t i = 0; i < kSends; ++i) {
        const auto received = pair.target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->status == mlx5::CompletionStatus::success);
        CHECK(received->wr_id == 1 + i);
        CHECK(received->byte_len == 64);
    }
    for (std::uint32_t i = 0; i < kSends; ++i) {
        const auto sent = pair.initiator.wait_send();
        REQUIRE(sent.has_value());
        CHECK(sent->status == mlx5::CompletionStatus::success);
        CHECK(sent->wr_id == 100 + i);
    }
    soft::acquire_remote_writes();
    for (std::uint32_t i = 0; i < kSends; ++i) {
        CAPTURE(i);
        CHECK(std::memcmp(pair.target.buffer() + 4096 + i * 64, pair.initiator.buffer() + i * 64, 64) == 0);
    }
    // The first went the request path; the rest waited for its answer instead of following it
    // there, and went zero-hop (one more may meet the target's receive lock busy and go the
    // request path too). Sent on at once, every one of them took the request path.
    const std::uint64_t zero_hop = pair.initiator_device->zero_hop_receives();
    MESSAGE(zero_hop << " of the " << kSends - 1 << " sends after the refused one went zero-hop");
    CHECK(zero_hop >= kSends - 3);
}

TEST_CASE("zero-hop receive refused: a message longer than the receive and a bad key get the request path's errors") {
    SUBCASE("longer than the receive: local length error at the target, the QP to ERR") {
        ReceivePair pair;
        REQUIRE(pair.target.post_receive(20, 0, 8) == mlx5::PostResult::ok);
        const mlx5::ScatterGatherElement bytes = pair.initiator.local(0, 64);
        const mlx5::Completion sent = run_signaled(pair.initiator, send_request(1, &bytes, 1, mlx5::SendOpcode::send));
        CHECK(sent.status == mlx5::CompletionStatus::remote_invalid_request);
        const auto received = pair.target.wait_receive();
        REQUIRE(received.has_value());
        CHECK(received->wr_id == 20);
        CHECK(received->status == mlx5::CompletionStatus::local_length_error);
        CHECK(pair.initiator_device->zero_hop_receives() == 0);
    }
    SUBCASE("a write with immediate through a bad key: remote access error, the receive left for the next message") {
        ReceivePair pair;
        std::memset(pair.target.buffer(), 0xee, 8192);
        REQUIRE(pair.target.post_receive(30, 0, 0) == mlx5::PostResult::ok);
        const mlx5::ScatterGatherElement bytes = pair.initiator.local(0, 4096);
        mlx5::SendWorkRequest write = write_request(1, &bytes, pair.remote.buffer_addr, pair.remote.rkey ^ 0x100);
        write.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
        const mlx5::Completion refused = run_signaled(pair.initiator, write);
        CHECK(refused.status == mlx5::CompletionStatus::remote_access_error);
        CHECK_FALSE(pair.target.wait_receive(std::chrono::milliseconds(20)).has_value());
        CHECK(rdmachan::test::bytes_differing(pair.target.buffer(), 8192, 0xee) == 0);
        CHECK(pair.initiator_device->zero_hop_receives() == 0);
    }
}

TEST_CASE("zero-hop receives both ways at once: 10,000 messages each (2,000 in sanitizer builds), every completion in order and every byte right") {
    ReceivePair pair;
    // Both devices send and receive: each writes its own CQEs (requester and responder) while the
    // other's thread writes into its CQs, under its receive lock.
    static const int kMessages = rdmachan::test::kSanitizerBuild ? 2000 : 10000;
    constexpr int kWindow = 8;
    constexpr std::uint64_t kLanding = 65536;
    for (SoftEndpoint* at : {&pair.initiator, &pair.target}) {
        for (int i = 0; i < kWindow; ++i) REQUIRE(at->post_receive(static_cast<std::uint64_t>(i), kLanding + 64 * i, 64) == mlx5::PostResult::ok);
    }
    auto send_all = [](SoftEndpoint& from, std::uint8_t seed, int& failures) {
        for (int i = 0; i < kMessages && failures == 0; ++i) {
            const std::uint64_t offset = 128 * static_cast<std::uint64_t>(i % kWindow);
            std::memset(from.buffer() + offset, static_cast<std::uint8_t>(seed + i), 64);
            const mlx5::ScatterGatherElement bytes = from.local(offset, 64);
            mlx5::SendWorkRequest request = send_request(static_cast<std::uint64_t>(i), &bytes, 1, mlx5::SendOpcode::send_with_immediate);
            request.immediate = static_cast<std::uint32_t>(i);
            if (from.post(&request, 1) != mlx5::PostResult::ok) ++failures;
            const auto completion = from.wait_send();
            if (!completion || completion->status != mlx5::CompletionStatus::success || completion->wr_id != static_cast<std::uint64_t>(i)) {
                ++failures;
            }
        }
    };
    auto receive_all = [](SoftEndpoint& at, std::uint8_t seed, int& failures) {
        for (int i = 0; i < kMessages && failures == 0; ++i) {
            const auto completion = at.wait_receive();
            const std::uint64_t offset = kLanding + 64 * static_cast<std::uint64_t>(i % kWindow);
            if (!completion || completion->status != mlx5::CompletionStatus::success ||
                completion->wr_id != static_cast<std::uint64_t>(i) || completion->immediate != static_cast<std::uint32_t>(i) ||
                completion->byte_len != 64) {
                ++failures;
                break;
            }
            soft::acquire_remote_writes();
            if (rdmachan::test::bytes_differing(at.buffer() + offset, 64, static_cast<std::uint8_t>(seed + i)) != 0) ++failures;
            if (i + kWindow < kMessages && at.post_receive(static_cast<std::uint64_t>(i + kWindow), offset, 64) != mlx5::PostResult::ok) {
                ++failures;
            }
        }
    };
    int failures[4] = {};
    {
        std::jthread initiator_sends(send_all, std::ref(pair.initiator), std::uint8_t{1}, std::ref(failures[0]));
        std::jthread target_sends(send_all, std::ref(pair.target), std::uint8_t{101}, std::ref(failures[1]));
        std::jthread target_receives(receive_all, std::ref(pair.target), std::uint8_t{1}, std::ref(failures[2]));
        std::jthread initiator_receives(receive_all, std::ref(pair.initiator), std::uint8_t{101}, std::ref(failures[3]));
    }
    CHECK(failures[0] == 0);
    CHECK(failures[1] == 0);
    CHECK(failures[2] == 0);
    CHECK(failures[3] == 0);
    const std::uint64_t zero_hop = pair.initiator_device->zero_hop_receives() + pair.target_device->zero_hop_receives();
    MESSAGE(zero_hop << " of " << 2 * kMessages << " messages went zero-hop");
    CHECK(zero_hop > 0);
}

TEST_CASE("zero-hop on one device: a QP connected to another QP of its own device, no loopback frame") {
    rdmachan::test::Environment transport("RDMACHAN_SOFT_TRANSPORT", "auto");
    const std::shared_ptr<soft::Device> device = soft::Device::open();
    rdmachan::test::EndpointOptions options;
    options.allocated = true;
    SoftEndpoint first(device, options);
    SoftEndpoint second(device, options);
    first.connect(second.address());
    second.connect(first.address());
    const rdmachan::test::Address remote = second.address();
    for (std::uint32_t b = 0; b < 65536; ++b) first.buffer()[b] = static_cast<std::uint8_t>(b * 5 + 9);
    std::memset(second.buffer(), 0xee, 1 << 20);

    REQUIRE(second.post_receive(1, 0, 4096) == mlx5::PostResult::ok);
    REQUIRE(second.post_receive(2, 0, 0) == mlx5::PostResult::ok);
    const mlx5::ScatterGatherElement message = first.local(0, 4096);
    CHECK(run_signaled(first, send_request(10, &message, 1, mlx5::SendOpcode::send)).status == mlx5::CompletionStatus::success);
    const mlx5::ScatterGatherElement slice = first.local(0, 65536);
    mlx5::SendWorkRequest write = write_request(11, &slice, remote.buffer_addr + 65536, remote.rkey);
    write.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
    write.immediate = 77;
    CHECK(run_signaled(first, write).status == mlx5::CompletionStatus::success);
    const mlx5::ScatterGatherElement into = first.local(131072, 65536);
    mlx5::SendWorkRequest read = write_request(12, &into, remote.buffer_addr + 65536, remote.rkey);
    read.opcode = mlx5::SendOpcode::rdma_read;
    CHECK(run_signaled(first, read).status == mlx5::CompletionStatus::success);

    const auto sent = second.wait_receive();
    REQUIRE(sent.has_value());
    CHECK(sent->wr_id == 1);
    CHECK(sent->byte_len == 4096);
    const auto written = second.wait_receive();
    REQUIRE(written.has_value());
    CHECK(written->wr_id == 2);
    CHECK(written->immediate == 77);
    CHECK(written->byte_len == 65536);
    soft::acquire_remote_writes();
    CHECK(std::memcmp(second.buffer(), first.buffer(), 4096) == 0);
    CHECK(std::memcmp(second.buffer() + 65536, first.buffer(), 65536) == 0);
    CHECK(std::memcmp(first.buffer() + 131072, first.buffer(), 65536) == 0);
    // Each went zero-hop (the first on the progress thread, which learnt there that the target
    // is zero-hop; the others on this thread), none as a loopback frame.
    CHECK(device->zero_hop_receives() == 2);
    CHECK(device->zero_hop_reads() == 1);
    CHECK(device->zero_hop_arena_reads() == 1);
}

TEST_CASE("the receive lock: the device takes it over from a process that died holding it, and a busy lock refuses a peer's try") {
    soft::PublishedTable table;
    REQUIRE(table.valid());
    soft::SharedArena arena;
    {
        // This process's own view, as a peer's: its try-lock fails while the device holds it.
        soft::PeerTable view(table, arena);
        REQUIRE(view.valid());
        {
            const soft::PublishedTable::ReceiveGuard held(table);
            std::thread other([&] { CHECK_FALSE(view.receive_lock().try_lock()); });
            other.join();
        }
        REQUIRE(view.receive_lock().try_lock());
        view.receive_lock().unlock();
    }
    // A child (it shares the table's mapping) takes the lock and exits without releasing it.
    const pid_t child = ::fork();
    REQUIRE(child >= 0);
    if (child == 0) {
        soft::PeerTable view(table, arena);
        ::_exit(view.valid() && view.receive_lock().try_lock() ? 0 : 1);
    }
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
    // The device takes it at once (not after the 2 s report), and again afterwards.
    const auto before = std::chrono::steady_clock::now();
    { const soft::PublishedTable::ReceiveGuard taken(table); }
    { const soft::PublishedTable::ReceiveGuard again(table); }
    CHECK(std::chrono::steady_clock::now() - before < std::chrono::seconds(1));
    soft::PeerTable view(table, arena);
    CHECK(view.receive_lock().try_lock());
    view.receive_lock().unlock();
}
