// Two processes (fork), each with its own software device, moving bytes through the mlx5 data
// path: a long mixed run that wraps every ring many times, verified byte for byte, and a peer
// killed mid-transfer.
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstring>
#include <memory>

#include "tests/sanitizer_build.hpp"
#include "tests/soft/child_endpoint.hpp"

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

// The byte at position i of message `sequence`: both processes compute it independently.
std::uint8_t pattern(std::uint32_t sequence, std::uint32_t i) { return static_cast<std::uint8_t>(sequence * 131 + i * 7 + 3); }

// The child: a passive peer. It connects, then consumes `sends` messages, checking each one's
// bytes against the pattern (the immediate names the sequence), reposting receives as it goes.
// Its exit code is the number of bad messages (0 = all verified), 100+ for set-up failures.
// `allocated`: its buffer comes from its device's arena (the parent's sends then go zero-hop).
[[noreturn]] void run_child(int from_parent, int to_parent, std::uint32_t sends, bool allocated) {
    int bad = 0;
    {
        auto device = soft::Device::open();
        rdmachan::test::EndpointOptions options;
        options.allocated = allocated;
        SoftEndpoint endpoint(device, options);
        if (!connect_to_parent(endpoint, from_parent, to_parent)) ::_exit(100);
        constexpr std::uint32_t kSlots = 128;
        constexpr std::uint32_t kSlotSize = 4096;
        for (std::uint32_t slot = 0; slot < kSlots; ++slot) {
            if (endpoint.post_receive(slot, 512 * 1024 + slot * kSlotSize, kSlotSize) != mlx5::PostResult::ok) ::_exit(101);
        }
        if (!tell_parent_ready(to_parent)) ::_exit(102);
        for (std::uint32_t received = 0; received < sends; ++received) {
            const auto completion = endpoint.wait_receive(std::chrono::seconds(20));
            if (!completion.has_value() || completion->status != mlx5::CompletionStatus::success) ::_exit(103);
            const std::uint32_t slot = static_cast<std::uint32_t>(completion->wr_id);
            const std::uint8_t* bytes = endpoint.buffer() + 512 * 1024 + slot * kSlotSize;
            for (std::uint32_t i = 0; i < completion->byte_len; ++i) {
                if (bytes[i] != pattern(completion->immediate, i)) {
                    ++bad;
                    break;
                }
            }
            if (endpoint.post_receive(slot, 512 * 1024 + slot * kSlotSize, kSlotSize) != mlx5::PostResult::ok) ::_exit(104);
        }
        // Stay alive until the parent has read back what it wrote.
        char done = 0;
        read_all(from_parent, &done, 1, 60);
    }
    ::_exit(bad > 99 ? 99 : bad);
}

// The child for the every-operation test: it expects, in order, a write with immediate, a send
// and a send with immediate, checks each one's bytes, and exits with the number of mismatches.
[[noreturn]] void run_every_operation_child(int from_parent, int to_parent) {
    int bad = 0;
    {
        auto device = soft::Device::open();
        SoftEndpoint endpoint(device);
        if (!connect_to_parent(endpoint, from_parent, to_parent)) ::_exit(100);
        std::memset(endpoint.buffer() + 4096, 0x3c, 4096);  // what the parent reads and swaps
        std::uint64_t counter = 40;
        std::memcpy(endpoint.buffer() + 8192, &counter, 8);
        for (std::uint64_t slot = 0; slot < 3; ++slot) {
            if (endpoint.post_receive(slot, 65536 + slot * 4096, 4096) != mlx5::PostResult::ok) ::_exit(101);
        }
        if (!tell_parent_ready(to_parent)) ::_exit(102);
        const mlx5::CompletionOpcode expected[3] = {mlx5::CompletionOpcode::receive_rdma_with_immediate,
                                                    mlx5::CompletionOpcode::receive, mlx5::CompletionOpcode::receive};
        for (int i = 0; i < 3; ++i) {
            const auto completion = endpoint.wait_receive(std::chrono::seconds(20));
            if (!completion.has_value() || completion->status != mlx5::CompletionStatus::success) ::_exit(103);
            bad += completion->opcode != expected[i];
            bad += completion->wr_id != static_cast<std::uint64_t>(i);
            if (i == 0) {
                bad += completion->immediate != 0xabcd0001u;
                for (std::uint32_t b = 0; b < 1000; ++b) bad += endpoint.buffer()[b] != pattern(1, b);
            } else {
                const std::uint8_t* bytes = endpoint.buffer() + 65536 + i * 4096;
                for (std::uint32_t b = 0; b < completion->byte_len; ++b) bad += bytes[b] != pattern(static_cast<std::uint32_t>(i + 1), b);
                if (i == 2) bad += completion->immediate != 0xabcd0003u || (completion->flags & mlx5::kCompletionWithImmediate) == 0;
            }
        }
        char done = 0;
        read_all(from_parent, &done, 1, 60);
        // The parent's "done" (through the pipe) says the atomics completed; that ordering crosses
        // processes, so read the word atomically, as the device wrote it.
        const std::uint64_t swapped =
            __atomic_load_n(reinterpret_cast<const std::uint64_t*>(endpoint.buffer() + 8192), __ATOMIC_ACQUIRE);
        bad += swapped != 1234;  // fetch-and-add 40 + 2, then compare 42 → swap 1234
    }
    ::_exit(bad > 99 ? 99 : bad);
}

std::unique_ptr<ChildProcess> start_passive_peer(std::uint32_t sends, bool allocated) {
    return ChildProcess::start("the passive peer",
                               [sends, allocated](int from_parent, int to_parent) { run_child(from_parent, to_parent, sends, allocated); });
}

}  // namespace

namespace {

// Mixed operations against a passive child; both buffers from the heap, or both from
// the devices' arenas (same host: writes, reads and sends then go zero-hop, and the sends'
// receives are consumed and completed by this process's thread in the child's queues).
void mixed_operations(bool allocated) {
    // 25,000 under ThreadSanitizer, whose three runs of this suite (default, shm, tcp) took 75 s
    // of CI's time at 100,000: the 64-entry ring still wraps hundreds of times.
    constexpr std::uint32_t kOperations = rdmachan::test::kThreadSanitizerBuild ? 25000 : 100000;
    constexpr std::uint32_t kSendEvery = 10;  // every 10th operation is a send the child checks
    constexpr std::uint32_t kSends = kOperations / kSendEvery;
    auto child = start_passive_peer(kSends, allocated);

    auto device = soft::Device::open();
    rdmachan::test::EndpointOptions options;
    options.max_send_wr = 64;  // a small ring: 100,000 operations wrap it hundreds of times
    options.buffer_size = 4 << 20;
    options.allocated = allocated;
    SoftEndpoint endpoint(device, options);
    const Address remote = connect_to_child(*child, endpoint);
    REQUIRE(endpoint.queue_pair().send_ring().wqe_count <= 256);  // see the source-slot rule below

    // The child has 128 receives posted and reposts as it consumes; never run further ahead.
    std::uint32_t sends_posted = 0;
    std::uint32_t sends_completed = 0;
    std::uint32_t signaled = 0;
    std::uint32_t completed = 0;
    std::uint32_t errors = 0;
    std::uint32_t verified_reads = 0;
    std::uint32_t bad_reads = 0;
    mlx5::Completion completions[32];
    constexpr std::uint32_t kSourceArea = 0;
    constexpr std::uint32_t kReadArea = 3 << 20;
    constexpr std::uint32_t kTargetSpan = 512 * 1024 - 8192;

    auto drain = [&](bool wait_for_one) {
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        do {
            const std::uint32_t got = endpoint.poll_send(completions, 32);
            for (std::uint32_t i = 0; i < got; ++i) {
                ++completed;
                if (completions[i].status != mlx5::CompletionStatus::success) ++errors;
                if (completions[i].opcode == mlx5::CompletionOpcode::send) ++sends_completed;
                if (completions[i].opcode == mlx5::CompletionOpcode::rdma_read && completions[i].status == mlx5::CompletionStatus::success) {
                    // wr_id carries the sequence whose bytes were written and read back.
                    const std::uint32_t sequence = static_cast<std::uint32_t>(completions[i].wr_id);
                    const std::uint32_t size = 1 + (sequence * 7919u) % 4096;
                    bool same = true;
                    for (std::uint32_t b = 0; b < size; ++b) same &= endpoint.buffer()[kReadArea + b] == pattern(sequence, b);
                    ++(same ? verified_reads : bad_reads);
                }
            }
            if (got != 0 || !wait_for_one) return got != 0;
            std::this_thread::yield();
        } while (std::chrono::steady_clock::now() < until);
        return false;
    };

    for (std::uint32_t sequence = 0; sequence < kOperations; ++sequence) {
        const std::uint32_t size = 1 + (sequence * 7919u) % 4096;
        // A source buffer is reused only after its WQE must have retired: the ring holds at most
        // wqe_count WQEs, so 512 slots (twice the ring) are never still in the NIC's hands.
        const std::uint32_t source = kSourceArea + (sequence % 512) * 4096;
        for (std::uint32_t b = 0; b < size; ++b) endpoint.buffer()[source + b] = pattern(sequence, b);
        const mlx5::ScatterGatherElement element = endpoint.local(source, size);
        mlx5::SendWorkRequest request;
        request.wr_id = sequence;
        request.sg_list = &element;
        request.num_sge = 1;
        const bool is_send = sequence % kSendEvery == 0;
        const bool signal = sequence % 16 == 0 || is_send;
        request.flags = signal ? std::uint32_t{mlx5::kSendSignaled} : 0u;
        if (size <= 64 && !is_send) request.flags |= mlx5::kSendInline;
        if (is_send) {
            request.opcode = mlx5::SendOpcode::send_with_immediate;
            request.immediate = sequence;
            ++sends_posted;
        } else {
            request.opcode = mlx5::SendOpcode::rdma_write;
            request.remote_addr = remote.buffer_addr + (sequence * 4096u) % kTargetSpan;
            request.rkey = remote.rkey;
        }
        // Backpressure: never more sends than the child has receives, never a full ring.
        while (is_send && sends_posted - sends_completed >= 100) REQUIRE(drain(true));
        mlx5::PostResult result;
        while ((result = endpoint.post(&request, 1)) == mlx5::PostResult::queue_full) {
            REQUIRE(drain(true));
        }
        REQUIRE(result == mlx5::PostResult::ok);
        signaled += signal;
        // Every 1000th write is read back and compared byte for byte.
        if (!is_send && sequence % 1000 == 1) {
            const mlx5::ScatterGatherElement read_into = endpoint.local(kReadArea, size);
            mlx5::SendWorkRequest read = request;
            read.opcode = mlx5::SendOpcode::rdma_read;
            read.flags = mlx5::kSendSignaled;
            read.sg_list = &read_into;
            while ((result = endpoint.post(&read, 1)) == mlx5::PostResult::queue_full) REQUIRE(drain(true));
            REQUIRE(result == mlx5::PostResult::ok);
            ++signaled;
            while (completed < signaled) REQUIRE(drain(true));
        }
    }
    while (completed < signaled) REQUIRE(drain(true));
    child->send('d', "'done'");
    const int child_result = child->wait(30);
    CHECK(errors == 0);
    CHECK(bad_reads == 0);
    CHECK(verified_reads >= kOperations / 1000 - 10);  // every 1000th write is read back
    CHECK(completed == signaled);
    CHECK_MESSAGE(child_result == 0, child->name << " " << ChildProcess::describe(child_result));  // it verified every send's bytes
    MESSAGE("operations: " << kOperations << ", signaled completions: " << completed << ", reads verified: " << verified_reads
                           << ", send ring WQEBBs: " << endpoint.queue_pair().send_ring().wqe_count
                           << ", writes executed zero-hop: " << device->zero_hop_writes()
                           << ", sends executed zero-hop: " << device->zero_hop_receives());
    // On the same-host path with arena memory the sends go zero-hop, but for those that meet a
    // request in flight or a busy receive lock; with heap memory none can.
    if (allocated && device->zero_hop_writes() > 0) CHECK(device->zero_hop_receives() > 0);
    if (!allocated) CHECK(device->zero_hop_receives() == 0);
}

}  // namespace

TEST_CASE("two processes: 100,000 mixed operations wrap the rings and every byte arrives") {
    SUBCASE("heap memory") { mixed_operations(false); }
    // The arena variant adds only the zero-hop paths, across processes, where the sanitizers see
    // nothing the in-process cases (soft_zero_hop_receive_test) do not: the main build runs it,
    // keeping the sanitizer builds within CI's time.
    if (!rdmachan::test::kSanitizerBuild) {
        SUBCASE("allocated memory (sends zero-hop into the child's queues)") { mixed_operations(true); }
    }
}

TEST_CASE("two processes: a peer killed mid-transfer gives error completions within the deadline") {
    auto child = start_passive_peer(1000000, false);
    auto device = soft::Device::open();
    rdmachan::test::EndpointOptions options;
    options.timeout = 18;  // 1.07 s per try, 4 tries: the peer's death is noticed by its closed connection first
    options.retry_cnt = 3;
    SoftEndpoint endpoint(device, options);
    const Address remote = connect_to_child(*child, endpoint);

    const mlx5::ScatterGatherElement element = endpoint.local(0, 65536);
    std::uint32_t posted = 0;
    std::uint32_t completed = 0;
    std::uint32_t failed = 0;
    mlx5::Completion completions[16];
    bool killed = false;
    std::uint32_t failed_before_kill = 0;
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::chrono::steady_clock::time_point killed_at;
    while (std::chrono::steady_clock::now() < until) {
        // Kill it mid-stream: once some writes have completed and more are in flight.
        if (!killed && completed - failed >= 100) {
            child->kill();
            killed = true;
            killed_at = std::chrono::steady_clock::now();
        }
        const mlx5::SendWorkRequest request =
            write_request(posted, &element, remote.buffer_addr + (posted % 4) * 65536, remote.rkey);
        if (endpoint.post(&request, 1) == mlx5::PostResult::ok) ++posted;
        const std::uint32_t got = endpoint.poll_send(completions, 16);
        for (std::uint32_t i = 0; i < got; ++i) {
            ++completed;
            if (completions[i].status != mlx5::CompletionStatus::success && !killed) ++failed_before_kill;
            if (completions[i].status != mlx5::CompletionStatus::success && failed++ == 0) {
                MESSAGE("first failure: " << std::string(mlx5::to_string(completions[i].status)) << " (wr_id "
                                          << completions[i].wr_id << ")");
            }
        }
        // Go on until the death is seen: a zero-hop write (same host) completes when it is posted,
        // so right after the kill nothing may be in flight, and writes into the dying process
        // still land and succeed, as they would through a NIC until the peer's QP is gone.
        if (killed && completed == posted && failed > 0) break;
    }
    CHECK(killed);
    CHECK(completed == posted);  // nothing is left hanging
    CHECK(failed > 0);
    CHECK(failed_before_kill == 0);
    CHECK(std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(5));
    CHECK(endpoint.queue_pair().state() == soft::QueuePairState::error);
    MESSAGE("posted " << posted << ", succeeded " << completed - failed << ", failed " << failed << " after the kill");
    child->expect_exit(ChildProcess::ended_by(SIGKILL), 10);  // by the kill above, not before it
}

TEST_CASE("two processes: every operation type crosses between processes") {
    auto child = ChildProcess::start("the every-operation peer", run_every_operation_child);
    auto device = soft::Device::open();
    SoftEndpoint endpoint(device);
    const Address remote = connect_to_child(*child, endpoint);

    auto run = [&](mlx5::SendWorkRequest request) {
        request.flags |= mlx5::kSendSignaled;
        REQUIRE(endpoint.post(&request, 1) == mlx5::PostResult::ok);
        const auto completion = endpoint.wait_send();
        REQUIRE(completion.has_value());
        CHECK(completion->status == mlx5::CompletionStatus::success);
        return *completion;
    };
    // Write with immediate (sequence 1), send (2), send with immediate (3): the child checks them.
    for (std::uint32_t b = 0; b < 4096; ++b) {
        endpoint.buffer()[b] = pattern(1, b);
        endpoint.buffer()[4096 + b] = pattern(2, b);
        endpoint.buffer()[8192 + b] = pattern(3, b);
    }
    const mlx5::ScatterGatherElement first = endpoint.local(0, 1000);
    mlx5::SendWorkRequest write_with_immediate = write_request(1, &first, remote.buffer_addr, remote.rkey);
    write_with_immediate.opcode = mlx5::SendOpcode::rdma_write_with_immediate;
    write_with_immediate.immediate = 0xabcd0001;
    CHECK(run(write_with_immediate).opcode == mlx5::CompletionOpcode::rdma_write);
    const mlx5::ScatterGatherElement second = endpoint.local(4096, 3000);
    mlx5::SendWorkRequest send;
    send.wr_id = 2;
    send.opcode = mlx5::SendOpcode::send;
    send.sg_list = &second;
    send.num_sge = 1;
    CHECK(run(send).opcode == mlx5::CompletionOpcode::send);
    const mlx5::ScatterGatherElement third = endpoint.local(8192, 50);
    mlx5::SendWorkRequest send_with_immediate = send;
    send_with_immediate.wr_id = 3;
    send_with_immediate.opcode = mlx5::SendOpcode::send_with_immediate;
    send_with_immediate.immediate = 0xabcd0003;
    send_with_immediate.sg_list = &third;
    send_with_immediate.flags = mlx5::kSendInline;
    run(send_with_immediate);

    // Read what the child prepared, then the two atomics on its counter (40).
    const mlx5::ScatterGatherElement read_into = endpoint.local(65536, 4096);
    mlx5::SendWorkRequest read = write_request(4, &read_into, remote.buffer_addr + 4096, remote.rkey, 0);
    read.opcode = mlx5::SendOpcode::rdma_read;
    CHECK(run(read).byte_len == 4096);
    for (std::uint32_t b = 0; b < 4096; ++b) REQUIRE(endpoint.buffer()[65536 + b] == 0x3c);
    const mlx5::ScatterGatherElement result = endpoint.local(131072, 8);
    mlx5::SendWorkRequest add = write_request(5, &result, remote.buffer_addr + 8192, remote.rkey, 0);
    add.opcode = mlx5::SendOpcode::atomic_fetch_and_add;
    add.compare_add = 2;
    run(add);
    std::uint64_t value = 0;
    std::memcpy(&value, endpoint.buffer() + 131072, 8);
    CHECK(value == 40);
    mlx5::SendWorkRequest swap = add;
    swap.wr_id = 6;
    swap.opcode = mlx5::SendOpcode::atomic_compare_and_swap;
    swap.compare_add = 42;
    swap.swap = 1234;
    run(swap);
    std::memcpy(&value, endpoint.buffer() + 131072, 8);
    CHECK(value == 42);

    child->send('d', "'done'");
    child->expect_exit(0, 30);  // the child verified every byte it received
}
