// The software device's same-host path: payloads of writes, sends and reads move between two
// processes by cross-memory attach, after the responder's checks; refusals leave memory
// untouched; a refused cross-memory attach (forced, or by a seccomp filter) falls back to
// payloads in the frames; RDMACHAN_SOFT_TRANSPORT=shm with a peer that is not same-host fails.
#include <doctest/doctest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "tests/soft/child_endpoint.hpp"
#include "tests/soft/scoped_environment.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::ChildProcess;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

using rdmachan::test::connect_to_child;
using rdmachan::test::connect_to_parent;
using rdmachan::test::read_all;
using rdmachan::test::tell_parent_ready;
using rdmachan::test::write_all;
using rdmachan::test::Environment;

std::uint8_t pattern(std::uint32_t sequence, std::uint32_t i) { return static_cast<std::uint8_t>(sequence * 131 + i * 7 + 3); }

// Where the parent's operations land in the target child's 1 MiB buffer.
constexpr std::uint32_t kWriteOffset = 0;             // 64 KiB written, pattern 1
constexpr std::uint32_t kWriteImmediateOffset = 65536;  // 16 KiB written with immediate, pattern 2
constexpr std::uint32_t kReceiveOffset = 262144;      // one 64 KiB receive for a 32 KiB send, pattern 3
constexpr std::uint32_t kReadOffset = 524288;         // 64 KiB the parent reads, pattern 9
constexpr std::uint32_t kCounterOffset = 786432;      // the atomics' word, 40 at the start
constexpr std::uint32_t kSpareOffset = 917504;        // the first, small write (not checked)

// A process restricted as a container's seccomp profile may restrict it: process_vm_readv and
// process_vm_writev fail with EPERM.
bool refuse_cross_memory_attach_by_seccomp() {
    sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_readv, 2, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_process_vm_writev, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA)),
    };
    sock_fprog program{static_cast<unsigned short>(sizeof filter / sizeof filter[0]), filter};
    return ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) == 0;
}

enum class ChildRestriction { none, seccomp, other_user };

// The target: serves the parent's operations, then checks every byte they left and reports how
// many requests its device moved by cross-memory attach. Exit code = mismatches (0 = all good),
// 100+ for set-up failures.
[[noreturn]] void run_target(int from_parent, int to_parent, ChildRestriction restriction) {
    if (restriction == ChildRestriction::seccomp && !refuse_cross_memory_attach_by_seccomp()) ::_exit(110);
    if (restriction == ChildRestriction::other_user && (::setgid(65534) != 0 || ::setuid(65534) != 0)) ::_exit(111);
    int bad = 0;
    {
        auto device = soft::Device::open();
        SoftEndpoint endpoint(device);
        // Before connecting: the QP's move to RTS (under the device mutex) then orders these
        // stores before everything the device's thread does for the parent, as ThreadSanitizer
        // sees it (the real order, through the pipe and the parent's socket, it cannot see).
        for (std::uint32_t b = 0; b < 65536; ++b) endpoint.buffer()[kReadOffset + b] = pattern(9, b);
        const std::uint64_t counter = 40;
        std::memcpy(endpoint.buffer() + kCounterOffset, &counter, 8);
        if (!connect_to_parent(endpoint, from_parent, to_parent)) ::_exit(100);
        if (endpoint.post_receive(0, kWriteImmediateOffset + 65536, 64) != mlx5::PostResult::ok) ::_exit(101);
        if (endpoint.post_receive(1, kReceiveOffset, 65536) != mlx5::PostResult::ok) ::_exit(101);
        if (!tell_parent_ready(to_parent)) ::_exit(102);
        const auto with_immediate = endpoint.wait_receive(std::chrono::seconds(20));
        if (!with_immediate.has_value() || with_immediate->status != mlx5::CompletionStatus::success) ::_exit(103);
        bad += with_immediate->opcode != mlx5::CompletionOpcode::receive_rdma_with_immediate;
        bad += with_immediate->immediate != 0x5a5a0002u || with_immediate->byte_len != 16384;
        const auto received = endpoint.wait_receive(std::chrono::seconds(20));
        if (!received.has_value() || received->status != mlx5::CompletionStatus::success) ::_exit(104);
        bad += received->opcode != mlx5::CompletionOpcode::receive || received->byte_len != 32768;
        char done = 0;
        if (!read_all(from_parent, &done, 1, 60)) ::_exit(105);
        soft::acquire_remote_writes();
        for (std::uint32_t b = 0; b < 65536; ++b) bad += endpoint.buffer()[kWriteOffset + b] != pattern(1, b);
        for (std::uint32_t b = 0; b < 16384; ++b) bad += endpoint.buffer()[kWriteImmediateOffset + b] != pattern(2, b);
        for (std::uint32_t b = 0; b < 32768; ++b) bad += endpoint.buffer()[kReceiveOffset + b] != pattern(3, b);
        const std::uint64_t swapped =
            __atomic_load_n(reinterpret_cast<const std::uint64_t*>(endpoint.buffer() + kCounterOffset), __ATOMIC_ACQUIRE);
        bad += swapped != 1234;  // fetch-and-add 40 + 2, then compare 42 → swap 1234
        const std::uint64_t moved = device->transfers_by_reference();
        if (!write_all(to_parent, &moved, sizeof moved)) ::_exit(106);
        if (!read_all(from_parent, &done, 1, 60)) ::_exit(107);  // stay until the parent has its answers
    }
    ::_exit(bad > 99 ? 99 : bad);
}

std::unique_ptr<ChildProcess> start_target(ChildRestriction restriction) {
    return ChildProcess::start("the target", [restriction](int from_parent, int to_parent) { run_target(from_parent, to_parent, restriction); });
}

struct Moved {
    std::uint64_t by_reference = 0;  // requests the child's device moved by cross-memory attach
    std::uint64_t zero_hop = 0;      // writes this process's device executed zero-hop, after the first
    std::uint64_t zero_hop_reads = 0;  // and reads
};

// Runs write, write with immediate, send, read, fetch-and-add and compare-and-swap against a
// target child; returns how the payloads moved.
Moved every_operation_against(ChildRestriction restriction) {
    auto child = start_target(restriction);
    auto device = soft::Device::open();
    SoftEndpoint endpoint(device);
    const Address remote = connect_to_child(*child, endpoint);

    for (std::uint32_t b = 0; b < 65536; ++b) endpoint.buffer()[b] = pattern(1, b);
    for (std::uint32_t b = 0; b < 16384; ++b) endpoint.buffer()[65536 + b] = pattern(2, b);
    for (std::uint32_t b = 0; b < 32768; ++b) endpoint.buffer()[131072 + b] = pattern(3, b);
    auto run = [&](mlx5::SendWorkRequest request) {
        request.flags |= mlx5::kSendSignaled;
        REQUIRE(endpoint.post(&request, 1) == mlx5::PostResult::ok);
        const auto completion = endpoint.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        return *completion;
    };
    // The first request to a device may go out before the answer to the device's hello says
    // which path the peer agreed to (the connection opens when the QP reaches RTS), and then
    // carries its payload in the frame; or go zero-hop: a small one, not counted below.
    const mlx5::ScatterGatherElement first = endpoint.local(0, 8);
    run(write_request(0, &first, remote.buffer_addr + kSpareOffset, remote.rkey));
    const std::uint64_t zero_hop_before = device->zero_hop_writes();
    // The write's source is two scatter/gather entries: the responder gathers both.
    const mlx5::ScatterGatherElement halves[2] = {endpoint.local(0, 32768), endpoint.local(32768, 32768)};
    mlx5::SendWorkRequest write = write_request(1, halves, remote.buffer_addr + kWriteOffset, remote.rkey);
    write.num_sge = 2;
    run(write);
    const mlx5::ScatterGatherElement immediate_source = endpoint.local(65536, 16384);
    mlx5::SendWorkRequest with_immediate = write_request(2, &immediate_source, remote.buffer_addr + kWriteImmediateOffset, remote.rkey);
    with_immediate.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
    with_immediate.immediate = 0x5a5a0002;
    run(with_immediate);
    const mlx5::ScatterGatherElement send_source = endpoint.local(131072, 32768);
    mlx5::SendWorkRequest send;
    send.wr_id = 3;
    send.opcode = mlx5::SendOpcode::send;
    send.sg_list = &send_source;
    send.num_sge = 1;
    run(send);
    const mlx5::ScatterGatherElement read_into = endpoint.local(262144, 65536);
    mlx5::SendWorkRequest read = write_request(4, &read_into, remote.buffer_addr + kReadOffset, remote.rkey, 0);
    read.opcode = mlx5::SendOpcode::rdma_read;
    CHECK(run(read).byte_len == 65536);
    int read_mismatches = 0;
    for (std::uint32_t b = 0; b < 65536; ++b) read_mismatches += endpoint.buffer()[262144 + b] != pattern(9, b);
    CHECK(read_mismatches == 0);
    const mlx5::ScatterGatherElement result = endpoint.local(393216, 8);
    mlx5::SendWorkRequest add = write_request(5, &result, remote.buffer_addr + kCounterOffset, remote.rkey, 0);
    add.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
    add.compare_add = 2;
    run(add);
    std::uint64_t value = 0;
    std::memcpy(&value, endpoint.buffer() + 393216, 8);
    CHECK(value == 40);
    mlx5::SendWorkRequest swap = add;
    swap.wr_id = 6;
    swap.opcode = mlx5::SendOpcode::atomic_compare_and_swap;
    swap.compare_add = 42;
    swap.swap = 1234;
    run(swap);
    std::memcpy(&value, endpoint.buffer() + 393216, 8);
    CHECK(value == 42);

    child->send('d', "'done'");
    const auto moved = child->receive<std::uint64_t>("the count of requests moved by reference", 30);
    child->send('d', "the second 'done'");
    child->expect_exit(0, 30);  // the child verified every byte
    return {moved, device->zero_hop_writes() - zero_hop_before, device->zero_hop_reads()};
}

}  // namespace

TEST_CASE("same host, two processes: write, write with immediate, send and read move by cross-memory attach; atomics run at the target") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "auto");
    SUBCASE("zero-hop writes off") {
        Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "0");
        // Write, write with immediate, send and read: four requests moved by reference; the
        // atomics are not (they execute in the target process).
        const Moved moved = every_operation_against(ChildRestriction::none);
        CHECK(moved.by_reference == 4);
        CHECK(moved.zero_hop == 0);
        CHECK(moved.zero_hop_reads == 0);
    }
    SUBCASE("zero-hop on (the default): the 64 KiB write and the read are zero-hop, the rest as with it off") {
        const Moved moved = every_operation_against(ChildRestriction::none);
        CHECK(moved.by_reference == 2);
        CHECK(moved.zero_hop == 1);
        CHECK(moved.zero_hop_reads == 1);
    }
}

TEST_CASE("same host, cross-memory attach refused by a seccomp filter at the target: every operation still succeeds over TCP") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "auto");
    const Moved moved = every_operation_against(ChildRestriction::seccomp);
    CHECK(moved.by_reference == 0);
    CHECK(moved.zero_hop == 0);
    CHECK(moved.zero_hop_reads == 0);
}

TEST_CASE("same host, cross-memory attach refused through RDMACHAN_SOFT_REFUSE_CMA: payloads travel in the frames") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "shm");
    Environment refuse("RDMACHAN_SOFT_REFUSE_CMA", "1");  // inherited by the child, whose probe refuses
    const Moved moved = every_operation_against(ChildRestriction::none);
    CHECK(moved.by_reference == 0);
    CHECK(moved.zero_hop == 0);
    CHECK(moved.zero_hop_reads == 0);
}

// Changing the child's user needs root: without it, the case is reported skipped.
TEST_CASE("a peer that runs as another user is not same-host: TCP under auto, an error under RDMACHAN_SOFT_TRANSPORT=shm" *
          doctest::skip(::getuid() != 0)) {
    SUBCASE("auto: every operation succeeds over TCP") {
        Environment transport("RDMACHAN_SOFT_TRANSPORT", "auto");
        const Moved moved = every_operation_against(ChildRestriction::other_user);
        CHECK(moved.by_reference == 0);
        CHECK(moved.zero_hop == 0);
    }
    SUBCASE("shm: the first request fails with transport retry exceeded, no hang") {
        Environment transport("RDMACHAN_SOFT_TRANSPORT", "shm");
        auto child = start_target(ChildRestriction::other_user);
        auto device = soft::Device::open();
        SoftEndpoint endpoint(device);
        const Address remote = connect_to_child(*child, endpoint);
        std::memset(endpoint.buffer(), 0x77, 4096);
        const mlx5::ScatterGatherElement source = endpoint.local(0, 4096);
        const mlx5::SendWorkRequest write = write_request(1, &source, remote.buffer_addr + kWriteOffset, remote.rkey);
        REQUIRE(endpoint.post(&write, 1) == mlx5::PostResult::ok);
        const auto completion = endpoint.wait_send(std::chrono::seconds(10));
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::transport_retry_exceeded);
        child->kill();
        child->wait(10);
    }
}

TEST_CASE("RDMACHAN_SOFT_TRANSPORT with another value: opening the device names the variable") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "infiniband");
    CHECK_THROWS_WITH_AS(soft::Device::open(), doctest::Contains("RDMACHAN_SOFT_TRANSPORT = 'infiniband'"), soft::SoftDeviceError);
}

TEST_CASE("same host: refused requests move no byte by reference and leave memory untouched") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "shm");
    // The responder's moves are under test here; zero-hop writes have soft_zero_hop_test.
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "0");
    auto target_device = soft::Device::open();
    auto initiator_device = soft::Device::open();
    SoftEndpoint target(target_device);
    SoftEndpoint initiator(initiator_device);
    initiator.connect(target.address());
    target.connect(initiator.address());
    const Address remote = target.address();
    std::memset(target.buffer(), 0xee, 1 << 20);
    std::memset(initiator.buffer(), 0x11, 1 << 20);
    // Working writes first: the first settles the path (its payload may travel in the frame, see
    // above), the second moves by reference.
    const mlx5::ScatterGatherElement source = initiator.local(0, 65536);
    std::optional<mlx5::Completion> completion;
    std::uint64_t moved = 0;
    for (std::uint64_t wr_id = 0; wr_id < 2; ++wr_id) {
        moved = target_device->transfers_by_reference();
        const mlx5::SendWorkRequest good = write_request(wr_id, &source, remote.buffer_addr, remote.rkey);
        REQUIRE(initiator.post(&good, 1) == mlx5::PostResult::ok);
        completion = initiator.wait_send();
        REQUIRE(completion.has_value());
        REQUIRE(completion->status == mlx5::CompletionStatus::success);
    }
    REQUIRE(target_device->transfers_by_reference() == moved + 1);
    moved = target_device->transfers_by_reference();
    std::memset(target.buffer(), 0xee, 65536);

    SUBCASE("write with a wrong rkey") {
        const mlx5::SendWorkRequest bad = write_request(2, &source, remote.buffer_addr, remote.rkey ^ 0x55);
        REQUIRE(initiator.post(&bad, 1) == mlx5::PostResult::ok);
    }
    SUBCASE("write past the end of the region") {
        const mlx5::SendWorkRequest bad = write_request(2, &source, remote.buffer_addr + (1 << 20) - 4096, remote.rkey);
        REQUIRE(initiator.post(&bad, 1) == mlx5::PostResult::ok);
    }
    SUBCASE("read past the end of the region: the initiator's memory is untouched too") {
        const mlx5::ScatterGatherElement into = initiator.local(131072, 65536);
        mlx5::SendWorkRequest bad = write_request(2, &into, remote.buffer_addr + (1 << 20) - 4096, remote.rkey);
        bad.opcode = mlx5::SendOpcode::rdma_read;
        REQUIRE(initiator.post(&bad, 1) == mlx5::PostResult::ok);
    }
    completion = initiator.wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::remote_access_error);
    CHECK(target_device->transfers_by_reference() == moved);
    std::size_t touched = 0;
    for (std::size_t b = 0; b < (1u << 20); ++b) touched += target.buffer()[b] != 0xee;
    CHECK(touched == 0);
    std::size_t initiator_touched = 0;
    for (std::size_t b = 0; b < (1u << 20); ++b) initiator_touched += initiator.buffer()[b] != 0x11;
    CHECK(initiator_touched == 0);
}

TEST_CASE("same host: a send longer than the receive is refused before a byte moves") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "shm");
    auto target_device = soft::Device::open();
    auto initiator_device = soft::Device::open();
    SoftEndpoint target(target_device);
    SoftEndpoint initiator(initiator_device);
    initiator.connect(target.address());
    target.connect(initiator.address());
    const mlx5::ScatterGatherElement first = initiator.local(0, 8);
    const mlx5::SendWorkRequest settle = write_request(0, &first, target.address().buffer_addr, target.address().rkey);
    REQUIRE(initiator.post(&settle, 1) == mlx5::PostResult::ok);
    REQUIRE(initiator.wait_send().has_value());
    const std::uint64_t moved = target_device->transfers_by_reference();  // the settling write's, if any
    std::memset(target.buffer(), 0xee, 1 << 20);
    REQUIRE(target.post_receive(7, 0, 4096) == mlx5::PostResult::ok);
    const mlx5::ScatterGatherElement source = initiator.local(0, 8192);
    mlx5::SendWorkRequest send;
    send.wr_id = 1;
    send.opcode = mlx5::SendOpcode::send;
    send.flags = mlx5::kSendSignaled;
    send.sg_list = &source;
    send.num_sge = 1;
    REQUIRE(initiator.post(&send, 1) == mlx5::PostResult::ok);
    const auto completion = initiator.wait_send();
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::remote_invalid_request);
    const auto receive = target.wait_receive();
    REQUIRE(receive.has_value());
    CHECK(receive->status == mlx5::CompletionStatus::local_length_error);
    CHECK(target_device->transfers_by_reference() == moved);
    std::size_t touched = 0;
    for (std::size_t b = 0; b < (1u << 20); ++b) touched += target.buffer()[b] != 0xee;
    CHECK(touched == 0);
}

TEST_CASE("same host: a target killed while reads by reference are in flight gives error completions within the deadline") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "shm");
    auto child = start_target(ChildRestriction::none);
    auto device = soft::Device::open();
    rdmachan::test::EndpointOptions options;
    options.timeout = 18;  // 1.07 s per try: the closed connection must be what ends it, not the retries
    options.retry_cnt = 3;
    SoftEndpoint endpoint(device, options);
    const Address remote = connect_to_child(*child, endpoint);

    const mlx5::ScatterGatherElement into = endpoint.local(0, 65536);
    std::uint32_t posted = 0;
    std::uint32_t completed = 0;
    std::uint32_t failed = 0;
    std::uint32_t failed_before_kill = 0;
    bool killed = false;
    std::chrono::steady_clock::time_point killed_at;
    mlx5::Completion completions[16];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
        if (!killed && completed - failed >= 100) {
            child->kill();
            killed = true;
            killed_at = std::chrono::steady_clock::now();
        }
        // Posting stops at the first failure: a QP in ERR flushes each new read on the device's
        // thread, and a poster that kept going would stay ahead of that thread, so the moment
        // with nothing outstanding might never come (this case once ran into its deadline so).
        if (failed == 0) {
            mlx5::SendWorkRequest read = write_request(posted, &into, remote.buffer_addr + kReadOffset, remote.rkey);
            read.opcode = mlx5::SendOpcode::rdma_read;
            if (endpoint.post(&read, 1) == mlx5::PostResult::ok) ++posted;
        }
        const std::uint32_t got = endpoint.poll_send(completions, 16);
        for (std::uint32_t i = 0; i < got; ++i) {
            ++completed;
            if (completions[i].status != mlx5::CompletionStatus::success) {
                ++failed;
                if (!killed) ++failed_before_kill;
            }
        }
        // Not done at the first quiet moment after the kill: SIGKILL is delivered when the target
        // next runs, so its device may still answer the reads in flight; the case is done once
        // one failed and nothing is outstanding (the deadline above bounds the wait).
        if (killed && completed == posted && failed > 0) break;
    }
    CHECK(killed);
    CHECK(completed == posted);  // nothing left hanging
    CHECK(failed > 0);
    CHECK(failed_before_kill == 0);
    CHECK(std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(5));
    CHECK(endpoint.queue_pair().state() == soft::QueuePairState::error);
    // The reads that succeeded brought the target's bytes, moved by reference into this process.
    int mismatches = 0;
    for (std::uint32_t b = 0; b < 65536; ++b) mismatches += endpoint.buffer()[b] != pattern(9, b);
    CHECK(mismatches == 0);
    MESSAGE("posted " << posted << ", succeeded " << completed - failed << ", failed " << failed << " after the kill");
    child->expect_exit(ChildProcess::ended_by(SIGKILL), 10);  // by the kill above, not before it
}

TEST_CASE("a connection opened during a partition settles its path, and requests resent after the partition get through") {
    Environment transport("RDMACHAN_SOFT_TRANSPORT", "auto");
    Environment zero_hop("RDMACHAN_SOFT_ZERO_HOP", "0");  // the responder's move is what is counted
    auto target_device = soft::Device::open();
    auto initiator_device = soft::Device::open();
    rdmachan::test::EndpointOptions options;
    options.timeout = 14;  // 67 ms per try, 7 retries: about half a second in all
    options.retry_cnt = 7;
    SoftEndpoint target(target_device, options);
    SoftEndpoint initiator(initiator_device, options);
    // The connection opens when the QP reaches RTS: during the partition here.
    soft::simulate_partition(true);
    initiator.connect(target.address());
    target.connect(initiator.address());
    std::memset(initiator.buffer(), 0x42, 65536);
    const mlx5::ScatterGatherElement source = initiator.local(0, 65536);
    const mlx5::SendWorkRequest write = write_request(1, &source, target.address().buffer_addr, target.address().rkey);
    REQUIRE(initiator.post(&write, 1) == mlx5::PostResult::ok);
    std::this_thread::sleep_for(std::chrono::milliseconds(150));  // two ACK timeouts: resent, lost again
    soft::simulate_partition(false);
    const auto completion = initiator.wait_send(std::chrono::seconds(5));
    REQUIRE(completion.has_value());
    CHECK(completion->status == mlx5::CompletionStatus::success);
    soft::acquire_remote_writes();
    std::size_t written = 0;
    for (std::size_t b = 0; b < 65536; ++b) written += target.buffer()[b] == 0x42;
    CHECK(written == 65536);
    // Its frame may have been made before the reply settled the path (its copies then carried
    // the payload) or after; the next one moves by reference: the path settled.
    const std::uint64_t moved = target_device->transfers_by_reference();
    CHECK(moved <= 1);
    const mlx5::SendWorkRequest again = write_request(2, &source, target.address().buffer_addr, target.address().rkey);
    REQUIRE(initiator.post(&again, 1) == mlx5::PostResult::ok);
    const auto second = initiator.wait_send(std::chrono::seconds(5));
    REQUIRE(second.has_value());
    CHECK(second->status == mlx5::CompletionStatus::success);
    CHECK(target_device->transfers_by_reference() == moved + 1);
}
