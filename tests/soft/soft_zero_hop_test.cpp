// Zero-hop RDMA writes on the software device's same-host path: the initiator's
// doorbell thread checks the write against the table the target published and moves the bytes
// with process_vm_writev. Here: the bytes land and the target's thread moves none of them; every
// refusal gives the CQE the request path gives and leaves memory untouched; a write behind a read
// in flight keeps its order; a deregistered key is never written after dereg returned; a killed
// target gives error completions, not a hang.
#include <doctest/doctest.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>
#include <thread>

#include "tests/soft/child_endpoint.hpp"
#include "tests/soft/device_pair.hpp"
#include "tests/soft/write_stream.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::Address;
using rdmachan::test::bytes_differing;
using rdmachan::test::ChildProcess;
using rdmachan::test::DevicePair;
using rdmachan::test::DevicePairSettings;
using rdmachan::test::EndpointOptions;
using rdmachan::test::run_signaled;
using rdmachan::test::ScopedPartition;
using rdmachan::test::settle_path;
using rdmachan::test::SoftEndpoint;
using rdmachan::test::write_request;

namespace {

// Two devices in this process, an endpoint on each, connected on the same-host path and settled
// (RDMACHAN_SOFT_TRANSPORT=auto): what every in-process case starts from.
class ZeroHopPair : public DevicePair {
public:
    explicit ZeroHopPair(const DevicePairSettings& settings = {}) : DevicePair(settings) {
        REQUIRE(settle_path(initiator, remote));
    }
};

}  // namespace

TEST_CASE_FIXTURE(ZeroHopPair, "zero-hop write: inline and gathered writes land, the target's device moves none of them") {
    std::memset(target.buffer(), 0xee, 1 << 20);
    for (std::uint32_t b = 0; b < 524288; ++b) initiator.buffer()[b] = static_cast<std::uint8_t>(b * 7 + 1);

    const mlx5::ScatterGatherElement small = initiator.local(0, 8);
    CHECK(run_signaled(initiator, write_request(1, &small, remote.buffer_addr, remote.rkey, mlx5::kSendInline)).status ==
          mlx5::CompletionStatus::success);
    const mlx5::ScatterGatherElement halves[2] = {initiator.local(0, 32768), initiator.local(32768, 32768)};
    mlx5::SendWorkRequest gathered = write_request(2, halves, remote.buffer_addr + 65536, remote.rkey);
    gathered.num_sge = 2;
    CHECK(run_signaled(initiator, gathered).status == mlx5::CompletionStatus::success);
    const mlx5::ScatterGatherElement largest = initiator.local(0, 262144);  // the largest that goes zero-hop
    CHECK(run_signaled(initiator, write_request(3, &largest, remote.buffer_addr + 524288, remote.rkey)).status ==
          mlx5::CompletionStatus::success);

    CHECK(std::memcmp(target.buffer(), initiator.buffer(), 8) == 0);
    CHECK(bytes_differing(target.buffer() + 8, 65536 - 8, 0xee) == 0);
    CHECK(std::memcmp(target.buffer() + 65536, initiator.buffer(), 65536) == 0);
    CHECK(bytes_differing(target.buffer() + 131072, 524288 - 131072, 0xee) == 0);
    CHECK(std::memcmp(target.buffer() + 524288, initiator.buffer(), 262144) == 0);
    CHECK(bytes_differing(target.buffer() + 786432, 262144, 0xee) == 0);
    CHECK(initiator_device->zero_hop_writes() == 3);
    CHECK(target_device->transfers_by_reference() == 0);

    // Larger writes take the request path: the target's device moves them by reference.
    const mlx5::ScatterGatherElement large = initiator.local(0, 524288);
    CHECK(run_signaled(initiator, write_request(4, &large, remote.buffer_addr + 524288, remote.rkey)).status ==
          mlx5::CompletionStatus::success);
    soft::acquire_remote_writes();
    CHECK(std::memcmp(target.buffer() + 524288, initiator.buffer(), 524288) == 0);
    CHECK(initiator_device->zero_hop_writes() == 3);
    CHECK(target_device->transfers_by_reference() == 1);

    // An unsignaled write completes nothing; the signaled one after it completes in order.
    const mlx5::SendWorkRequest quiet = write_request(6, &small, remote.buffer_addr + 16, remote.rkey, mlx5::kSendInline);
    REQUIRE(initiator.post(&quiet, 1) == mlx5::PostResult::ok);
    const mlx5::Completion loud = run_signaled(initiator, write_request(7, &small, remote.buffer_addr + 24, remote.rkey, mlx5::kSendInline));
    CHECK(loud.wr_id == 7);
    CHECK(initiator_device->zero_hop_writes() == 5);
}

TEST_CASE_FIXTURE(ZeroHopPair, "zero-hop write: executed on the doorbell thread, its CQE there when post returns") {
    // The first write teaches the QP that its remote is zero-hop (found by the progress thread).
    const mlx5::ScatterGatherElement small = initiator.local(0, 8);
    REQUIRE(run_signaled(initiator, write_request(0, &small, remote.buffer_addr, remote.rkey, mlx5::kSendInline)).status ==
            mlx5::CompletionStatus::success);
    int completed_in_post = 0;
    const std::uint64_t left_before = initiator_device->doorbells_left_to_progress();
    for (std::uint64_t i = 1; i <= 100; ++i) {
        const mlx5::SendWorkRequest write = write_request(i, &small, remote.buffer_addr, remote.rkey, mlx5::kSendInline | mlx5::kSendSignaled);
        REQUIRE(initiator.post(&write, 1) == mlx5::PostResult::ok);
        mlx5::Completion completion;
        if (initiator.poll_send(&completion, 1) == 1) {
            ++completed_in_post;
            CHECK(completion.status == mlx5::CompletionStatus::success);
            continue;
        }
        const auto late = initiator.wait_send();
        REQUIRE(late.has_value());
        CHECK(late->status == mlx5::CompletionStatus::success);
    }
    // The doorbell thread leaves a write to the progress thread only when that thread holds the
    // device mutex at that moment (the device counts each); every other write completes in post.
    const auto left = static_cast<int>(initiator_device->doorbells_left_to_progress() - left_before);
    MESSAGE(completed_in_post << " of 100 writes complete when post returned, " << left << " left to the progress thread");
    CHECK(completed_in_post + left == 100);
    CHECK(completed_in_post >= 50);  // the progress thread is mostly idle here
    CHECK(initiator_device->zero_hop_writes() == 101);
}

namespace {

enum class Refusal { bad_key, out_of_bounds, region_without_remote_write, queue_pair_without_remote_write, deregistered_key,
                     target_not_ready };

struct Outcome {
    mlx5::CompletionStatus status = mlx5::CompletionStatus::success;
    std::uint64_t wr_id = 0;
    std::size_t target_bytes_touched = 0;
    std::uint64_t zero_hop_writes = 0;
    soft::QueuePairState initiator_state = soft::QueuePairState::reset;
};

// One refused 4 KiB write, with zero-hop writes on or off at the initiator; with `allocated`,
// both buffers and the extra region come from the devices' arenas (the memcpy path).
Outcome refused_write(Refusal refusal, bool zero_hop, bool allocated) {
    // The fixture's ACK timeout (0.54 s per try, 3 retries): a dropped request ends in about 2 s.
    // Shorter ones made the settling read fail under ASan on this loaded machine, where a device
    // thread went unscheduled for 260 ms (flight record: the request sat unread until the retries
    // had given up).
    DevicePairSettings settings;
    settings.zero_hop = zero_hop ? "1" : "0";
    settings.target.allocated = allocated;
    settings.initiator.allocated = allocated;
    if (refusal == Refusal::queue_pair_without_remote_write) settings.target.access = soft::kLocalWrite | soft::kRemoteRead;
    ZeroHopPair pair(settings);
    SoftEndpoint& target = pair.target;
    SoftEndpoint& initiator = pair.initiator;
    const Address& remote = pair.remote;
    const std::shared_ptr<soft::Device>& target_device = pair.target_device;

    std::uint64_t address = remote.buffer_addr + 8192;
    std::uint32_t rkey = remote.rkey;
    std::shared_ptr<soft::MemoryRegion> extra;
    switch (refusal) {
        case Refusal::bad_key: rkey ^= 0x55; break;
        case Refusal::out_of_bounds: address = remote.buffer_addr + (1 << 20) - 2048; break;
        case Refusal::region_without_remote_write:
            extra = allocated ? target_device->allocate_memory(target.domain_pointer(), 65536, soft::kLocalWrite | soft::kRemoteRead)
                              : target_device->register_memory(target.domain_pointer(), target.buffer() + 524288, 65536,
                                                               soft::kLocalWrite | soft::kRemoteRead);
            address = extra->addr();
            rkey = extra->rkey();
            break;
        case Refusal::queue_pair_without_remote_write: break;
        case Refusal::deregistered_key:
            extra = allocated ? target_device->allocate_memory(target.domain_pointer(), 65536, soft::kLocalWrite | soft::kRemoteWrite)
                              : target_device->register_memory(target.domain_pointer(), target.buffer() + 524288, 65536,
                                                               soft::kLocalWrite | soft::kRemoteWrite);
            address = extra->addr();
            rkey = extra->rkey();
            extra.reset();
            break;
        case Refusal::target_not_ready: target.queue_pair().modify_to_error(); break;
    }
    std::memset(target.buffer(), 0xee, 1 << 20);
    std::memset(initiator.buffer(), 0x11, 4096);
    const mlx5::ScatterGatherElement source = initiator.local(0, 4096);
    const mlx5::Completion completion = run_signaled(initiator, write_request(7, &source, address, rkey));
    Outcome outcome;
    outcome.status = completion.status;
    outcome.wr_id = completion.wr_id;
    outcome.target_bytes_touched = bytes_differing(target.buffer(), 1 << 20, 0xee);
    // An allocated extra region lies outside the buffer: it must be untouched too (still zeros;
    // a deregistered one went back to the arena, where nothing may write either).
    if (allocated && extra != nullptr) outcome.target_bytes_touched += bytes_differing(reinterpret_cast<std::uint8_t*>(extra->addr()), 65536, 0);
    outcome.zero_hop_writes = pair.initiator_device->zero_hop_writes();
    outcome.initiator_state = initiator.queue_pair().state();
    return outcome;
}

}  // namespace

TEST_CASE("zero-hop write refused: the same CQE as on the request path, and target memory untouched") {
    struct Case {
        Refusal refusal;
        std::string name;
        mlx5::CompletionStatus expected;
    };
    const Case cases[] = {
        {Refusal::bad_key, "unknown rkey", mlx5::CompletionStatus::remote_access_error},
        {Refusal::out_of_bounds, "past the region's end", mlx5::CompletionStatus::remote_access_error},
        {Refusal::region_without_remote_write, "region without remote write", mlx5::CompletionStatus::remote_access_error},
        {Refusal::queue_pair_without_remote_write, "target QP without remote write", mlx5::CompletionStatus::remote_access_error},
        {Refusal::deregistered_key, "deregistered rkey", mlx5::CompletionStatus::remote_access_error},
        {Refusal::target_not_ready, "target QP in ERR (dropped, the initiator times out)",
         mlx5::CompletionStatus::transport_retry_exceeded},
    };
    for (const bool allocated : {false, true})
    for (const Case& refused : cases) {
        // Refusals of the target QP do not depend on the memory: once is enough.
        if (allocated && refused.refusal == Refusal::target_not_ready) continue;
        CAPTURE(refused.name);
        CAPTURE(allocated);
        const Outcome request_path = refused_write(refused.refusal, false, allocated);
        const Outcome zero_hop = refused_write(refused.refusal, true, allocated);
        CHECK(request_path.status == refused.expected);
        CHECK(zero_hop.status == request_path.status);
        CHECK(zero_hop.wr_id == request_path.wr_id);
        CHECK(zero_hop.initiator_state == soft::QueuePairState::error);
        CHECK(request_path.initiator_state == soft::QueuePairState::error);
        CHECK(request_path.target_bytes_touched == 0);
        CHECK(zero_hop.target_bytes_touched == 0);
        CHECK(zero_hop.zero_hop_writes == 0);
    }
}

TEST_CASE_FIXTURE(ZeroHopPair, "zero-hop write behind a read in flight: the read sees the bytes from before the write") {
    const mlx5::ScatterGatherElement small = initiator.local(0, 8);
    REQUIRE(run_signaled(initiator, write_request(0, &small, remote.buffer_addr + 900000, remote.rkey, mlx5::kSendInline)).status ==
            mlx5::CompletionStatus::success);
    REQUIRE(initiator_device->zero_hop_writes() == 1);  // the QP goes zero-hop from here

    // Larger than a read by system call goes zero-hop (256 KiB): this read is on the request path,
    // in flight, when the write behind it is executed.
    constexpr std::uint32_t kReadBytes = 262144 + 4096;
    for (int round = 0; round < 20; ++round) {
        CAPTURE(round);
        const std::uint8_t before = static_cast<std::uint8_t>(0x20 + round);
        const std::uint8_t after = static_cast<std::uint8_t>(0xa0 + round);
        std::memset(target.buffer(), before, kReadBytes);
        std::memset(initiator.buffer() + 262144, after, 262144);
        std::memset(initiator.buffer() + 524288, 0, kReadBytes);
        const mlx5::ScatterGatherElement into = initiator.local(524288, kReadBytes);
        mlx5::SendWorkRequest requests[2] = {write_request(1, &into, remote.buffer_addr, remote.rkey),
                                             write_request(2, nullptr, remote.buffer_addr, remote.rkey)};
        const mlx5::ScatterGatherElement source = initiator.local(262144, 262144);
        requests[0].opcode = mlx5::SendOpcode::rdma_read;
        requests[1].sg_list = &source;
        const std::uint64_t zero_hop_before = initiator_device->zero_hop_writes();
        if (round % 2 == 0) {
            REQUIRE(initiator.post(requests, 2) == mlx5::PostResult::ok);  // one doorbell for both
        } else {
            REQUIRE(initiator.post(&requests[0], 1) == mlx5::PostResult::ok);  // the read goes out first
            REQUIRE(initiator.post(&requests[1], 1) == mlx5::PostResult::ok);
        }
        const auto first = initiator.wait_send();
        const auto second = initiator.wait_send();
        REQUIRE(first.has_value());
        REQUIRE(second.has_value());
        CHECK(first->wr_id == 1);
        CHECK(second->wr_id == 2);
        CHECK(first->status == mlx5::CompletionStatus::success);
        CHECK(second->status == mlx5::CompletionStatus::success);
        CHECK(bytes_differing(initiator.buffer() + 524288, kReadBytes, before) == 0);  // read before the write
        CHECK(bytes_differing(target.buffer(), 262144, after) == 0);
        // Behind the read (rung together) the write takes the request path. Rung apart, it may
        // be zero-hop if the read was answered in between.
        if (round % 2 == 0) CHECK(initiator_device->zero_hop_writes() == zero_hop_before);
    }
}

TEST_CASE_FIXTURE(ZeroHopPair, "zero-hop writes and deregistration: no byte lands after dereg returns; later writes are refused") {
    std::uint8_t* window = target.buffer() + 524288;
    std::memset(window, 0, 65536);
    auto region = target_device->register_memory(target.domain_pointer(), window, 65536, soft::kLocalWrite | soft::kRemoteWrite);
    const std::uint64_t address = region->addr();
    const std::uint32_t rkey = region->rkey();

    rdmachan::test::WriteStream writer(initiator, address, rkey);
    writer.wait_started();
    // From now on each write waits 20 ms between its checks and its move; the deregistration
    // below starts while one holds the key it checked.
    soft::delay_zero_hop_writes(std::chrono::milliseconds(20));
    const std::uint32_t holder = rdmachan::test::wait_for_holder(*target_device, rkey);
    const auto deregistration = std::chrono::steady_clock::now();
    region.reset();  // deregistration: returns only when no zero-hop write holds the key
    CHECK(holder == static_cast<std::uint32_t>(::getpid()));  // the race was met: a write held the key
    const auto deregistered = std::chrono::steady_clock::now();
    std::uint8_t snapshot[65536];
    std::memcpy(snapshot, window, sizeof snapshot);
    writer.join();
    soft::delay_zero_hop_writes(std::chrono::microseconds(0));
    MESSAGE("deregistration took " << std::chrono::duration<double, std::milli>(deregistered - deregistration).count() << " ms");
    CHECK(writer.started.load());
    CHECK(writer.refused.load() == 1);
    CHECK(writer.other.load() == 0);
    CHECK(std::memcmp(snapshot, window, sizeof snapshot) == 0);
    CHECK(initiator_device->zero_hop_writes() > 0);
    MESSAGE(writer.succeeded.load() << " writes before the deregistration, " << initiator_device->zero_hop_writes() << " of all zero-hop");
}

namespace {

// With `allocated`, both buffers come from the devices' arenas: the writes are memcpys into a
// mapping of the target's memory, which outlives the target, so only the lost connection can
// end them.
void write_until_the_target_is_killed(bool allocated) {
    rdmachan::test::Environment transport("RDMACHAN_SOFT_TRANSPORT", "auto");
    EndpointOptions options;
    options.allocated = allocated;
    // The target: connects, says so, and serves until it is killed.
    auto child = ChildProcess::start("the target", [options](int from_parent, int to_parent) {
        auto device = soft::Device::open();
        SoftEndpoint endpoint(device, options);
        if (!rdmachan::test::connect_to_parent(endpoint, from_parent, to_parent)) ::_exit(100);
        if (!rdmachan::test::tell_parent_ready(to_parent)) ::_exit(101);
        char never = 0;
        rdmachan::test::read_all(from_parent, &never, 1, 120);
        ::_exit(0);
    });
    auto device = soft::Device::open();
    options.timeout = 18;  // 1.07 s per try: the lost connection must be what ends it, not the retries
    options.retry_cnt = 3;
    SoftEndpoint endpoint(device, options);
    const Address remote = rdmachan::test::connect_to_child(*child, endpoint);
    REQUIRE(settle_path(endpoint, remote));

    const mlx5::ScatterGatherElement source = endpoint.local(0, 4096);
    std::uint32_t posted = 0;
    std::uint32_t completed = 0;
    std::uint32_t failed = 0;
    std::uint32_t failed_before_kill = 0;
    bool killed = false;
    std::chrono::steady_clock::time_point killed_at;
    mlx5::Completion completions[16];
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
        if (!killed && completed - failed >= 200) {
            child->kill();
            killed = true;
            killed_at = std::chrono::steady_clock::now();
        }
        if (posted - completed < 8) {
            const mlx5::SendWorkRequest write = write_request(posted, &source, remote.buffer_addr, remote.rkey);
            if (endpoint.post(&write, 1) == mlx5::PostResult::ok) ++posted;
        }
        const std::uint32_t got = endpoint.poll_send(completions, 16);
        for (std::uint32_t i = 0; i < got; ++i) {
            ++completed;
            if (completions[i].status != mlx5::CompletionStatus::success) {
                ++failed;
                if (!killed) ++failed_before_kill;
            }
        }
        if (killed && completed == posted && failed > 0) break;
        if (got == 0) std::this_thread::yield();
    }
    CHECK(killed);
    CHECK(completed == posted);
    CHECK(failed > 0);
    CHECK(failed_before_kill == 0);
    CHECK(std::chrono::steady_clock::now() - killed_at < std::chrono::seconds(5));
    CHECK(endpoint.queue_pair().state() == soft::QueuePairState::error);
    CHECK(device->zero_hop_writes() >= 100);
    if (allocated) CHECK(device->zero_hop_arena_writes() >= 100);
    MESSAGE("posted " << posted << ", zero-hop " << device->zero_hop_writes() << ", failed " << failed << " after the kill");
    child->expect_exit(ChildProcess::ended_by(SIGKILL), 10);  // by the kill above, not before it
}

}  // namespace

TEST_CASE("zero-hop writes to a target killed mid-stream: error completions within the deadline, no hang") {
    SUBCASE("memory registered from the heap (process_vm_writev)") { write_until_the_target_is_killed(false); }
    SUBCASE("allocated memory (memcpy into the target's arena)") { write_until_the_target_is_killed(true); }
}

TEST_CASE_FIXTURE(ZeroHopPair, "zero-hop writes during a simulated partition are lost like frames: transport retry exceeded, memory untouched") {
    const mlx5::ScatterGatherElement source = initiator.local(0, 4096);
    REQUIRE(run_signaled(initiator, write_request(1, &source, remote.buffer_addr, remote.rkey)).status == mlx5::CompletionStatus::success);
    REQUIRE(initiator_device->zero_hop_writes() == 1);
    std::memset(target.buffer(), 0xee, 1 << 20);
    std::memset(initiator.buffer(), 0x11, 4096);
    const mlx5::Completion lost = [&] {
        const ScopedPartition partition;
        return run_signaled(initiator, write_request(2, &source, remote.buffer_addr, remote.rkey));
    }();
    CHECK(lost.status == mlx5::CompletionStatus::transport_retry_exceeded);
    CHECK(initiator_device->zero_hop_writes() == 1);
    CHECK(bytes_differing(target.buffer(), 1 << 20, 0xee) == 0);
}

// Two QPs of one device with memory from the heap: writes and reads up to the zero-hop bound move
// by cross-memory attach within the process on the doorbell thread, as a peer's do; refused
// (RDMACHAN_SOFT_REFUSE_CMA=1, as a seccomp profile would), they take the loopback path, and the
// bytes land the same.
TEST_CASE("zero-hop on one device with heap memory: by cross-memory attach within the process, else the loopback path") {
    for (const bool refused : {false, true}) {
        CAPTURE(refused);
        rdmachan::test::Environment transport("RDMACHAN_SOFT_TRANSPORT", "auto");
        rdmachan::test::Environment refuse("RDMACHAN_SOFT_REFUSE_CMA", refused ? "1" : "0");
        const std::shared_ptr<soft::Device> device = soft::Device::open();
        SoftEndpoint first(device);  // heap buffers (EndpointOptions::allocated is false)
        SoftEndpoint second(device);
        first.connect(second.address());
        second.connect(first.address());
        const Address remote = second.address();
        for (std::uint32_t b = 0; b < 65536; ++b) first.buffer()[b] = static_cast<std::uint8_t>(b * 11 + 3);
        std::memset(second.buffer(), 0xee, 1 << 20);
        const std::uint32_t sizes[] = {8, 4096, 65536};
        std::uint64_t offset = 0;
        for (const std::uint32_t size : sizes) {
            CAPTURE(size);
            const mlx5::ScatterGatherElement source = first.local(0, size);
            CHECK(run_signaled(first, write_request(size, &source, remote.buffer_addr + offset, remote.rkey)).status ==
                  mlx5::CompletionStatus::success);
            const mlx5::ScatterGatherElement into = first.local(131072 + offset, size);
            mlx5::SendWorkRequest read = write_request(size + 1, &into, remote.buffer_addr + offset, remote.rkey);
            read.opcode = mlx5::SendOpcode::rdma_read;
            CHECK(run_signaled(first, read).status == mlx5::CompletionStatus::success);
            soft::acquire_remote_writes();
            CHECK(std::memcmp(second.buffer() + offset, first.buffer(), size) == 0);
            CHECK(std::memcmp(first.buffer() + 131072 + offset, first.buffer(), size) == 0);
            offset += size;
        }
        // Nothing else was written: the byte after the last write is as it was.
        CHECK(second.buffer()[offset] == 0xee);
        const std::uint64_t expected = refused ? 0 : std::size(sizes);
        CHECK(device->zero_hop_writes() == expected);
        CHECK(device->zero_hop_reads() == expected);
        CHECK(device->zero_hop_arena_writes() == 0);
    }
}
