// Allocated memory on the software device (transport/soft/shared_arena.hpp): the arena
// hands out zeroed pages and reuses freed ones; zero-hop writes into an arena region are a
// memcpy into the peer's mapping (no system call, any size), from a source that cannot fault
// (inline data or the initiator's own arena); a source from the heap takes the system call;
// zero-hop reads the same way round; a
// deregistered arena region is never written after dereg returns, and its memory is reused
// clean; the default allocate_memory of other devices registers whole pages of its own.
#include <doctest/doctest.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <thread>
#include <vector>

#include "rdmachan/error.hpp"
#include "tests/soft/device_pair.hpp"
#include "tests/soft/write_stream.hpp"
#include "transport/device_interface.hpp"
#include "transport/soft/shared_arena.hpp"

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using rdmachan::test::bytes_differing;
using rdmachan::test::DevicePair;
using rdmachan::test::allocated_pair_settings;
using rdmachan::test::run_signaled;
using rdmachan::test::settle_path;
using rdmachan::test::write_request;

namespace {

constexpr std::uint32_t kAll = soft::kLocalWrite | soft::kRemoteWrite | soft::kRemoteRead | soft::kRemoteAtomic;

class ArenaPair : public DevicePair {
public:
    ArenaPair() : DevicePair(allocated_pair_settings()) { REQUIRE(settle_path(initiator, remote)); }
};

}  // namespace

TEST_CASE("the arena: zeroed pages, freed ranges reused clean and merged, a full reservation refused") {
    soft::SharedArena arena;
    const auto first = arena.allocate(100);
    const auto second = arena.allocate(5000);
    const auto third = arena.allocate(4096);
    REQUIRE(first.has_value());
    REQUIRE(second.has_value());
    REQUIRE(third.has_value());
    CHECK(*first == 0);
    CHECK(*second == 4096);  // whole pages: 100 bytes take one
    CHECK(*third == 3 * 4096);
    CHECK(arena.file_size() == 4 * 4096);
    CHECK(bytes_differing(arena.base(), 4 * 4096, 0) == 0);
    std::memset(arena.base(), 0x5a, 4 * 4096);
    CHECK(arena.holds(arena.base() + *second, 8192));
    CHECK_FALSE(arena.holds(arena.base() + *third, 8192));  // past the file's end
    CHECK_FALSE(arena.holds(&arena, 1));

    arena.release(*second, 5000);
    const auto again = arena.allocate(8192);
    REQUIRE(again.has_value());
    CHECK(*again == *second);
    CHECK(bytes_differing(arena.base() + *again, 8192, 0) == 0);  // handed out again as zeros
    CHECK(bytes_differing(arena.base() + *first, 4096, 0x5a) == 0);  // its neighbours untouched
    CHECK(bytes_differing(arena.base() + *third, 4096, 0x5a) == 0);

    // Freed neighbours merge, so a larger allocation fits where they were.
    arena.release(*first, 100);
    arena.release(*again, 8192);
    arena.release(*third, 4096);
    const auto merged = arena.allocate(4 * 4096);
    REQUIRE(merged.has_value());
    CHECK(*merged == 0);
    CHECK(arena.file_size() == 4 * 4096);

    CHECK_FALSE(arena.allocate(soft::kArenaReserveBytes).has_value());  // past the reservation
    CHECK_FALSE(arena.allocate(0).has_value());
}

TEST_CASE("the arena is not inherited by a forked child (its writes would land in the parent's buffers)") {
    soft::SharedArena arena;
    const auto offset = arena.allocate(4096);
    REQUIRE(offset.has_value());
    std::memset(arena.base() + *offset, 0x5a, 4096);
    const pid_t child = ::fork();
    if (child == 0) {
        unsigned char resident = 0;
        // Unmapped in the child: mincore says ENOMEM (a plain load would fault).
        ::_exit(::mincore(arena.base() + *offset, 4096, &resident) != 0 && errno == ENOMEM ? 0 : 1);
    }
    REQUIRE(child > 0);
    int status = 0;
    REQUIRE(::waitpid(child, &status, 0) == child);
    CHECK(WIFEXITED(status));
    CHECK(WEXITSTATUS(status) == 0);
    CHECK(bytes_differing(arena.base() + *offset, 4096, 0x5a) == 0);
}

TEST_CASE_FIXTURE(ArenaPair, "allocated memory: zero-hop writes are a memcpy into the peer's mapping, of any size") {
    CHECK(reinterpret_cast<std::uintptr_t>(target.buffer()) % 4096 == 0);
    CHECK(bytes_differing(target.buffer(), 1 << 20, 0) == 0);  // the arena's memory comes zeroed
    std::memset(target.buffer(), 0xee, 1 << 20);
    for (std::uint32_t b = 0; b < (1 << 20); ++b) initiator.buffer()[b] = static_cast<std::uint8_t>(b * 7 + 1);
    const std::uint64_t arena_before = initiator_device->zero_hop_arena_writes();
    const std::uint64_t zero_hop_before = initiator_device->zero_hop_writes();

    const mlx5::ScatterGatherElement small = initiator.local(0, 8);
    CHECK(run_signaled(initiator, write_request(1, &small, remote.buffer_addr, remote.rkey, mlx5::kSendInline)).status ==
          mlx5::CompletionStatus::success);
    const mlx5::ScatterGatherElement halves[2] = {initiator.local(0, 32768), initiator.local(32768, 32768)};
    mlx5::SendWorkRequest gathered = write_request(2, halves, remote.buffer_addr + 65536, remote.rkey);
    gathered.num_sge = 2;
    CHECK(run_signaled(initiator, gathered).status == mlx5::CompletionStatus::success);
    // Past the 256 KiB that heap memory takes zero-hop: a memcpy has no reason to stop there.
    const mlx5::ScatterGatherElement large = initiator.local(0, 524288);
    CHECK(run_signaled(initiator, write_request(3, &large, remote.buffer_addr + 524288, remote.rkey)).status ==
          mlx5::CompletionStatus::success);

    CHECK(std::memcmp(target.buffer(), initiator.buffer(), 8) == 0);
    CHECK(bytes_differing(target.buffer() + 8, 65536 - 8, 0xee) == 0);
    CHECK(std::memcmp(target.buffer() + 65536, initiator.buffer(), 65536) == 0);
    CHECK(bytes_differing(target.buffer() + 131072, 524288 - 131072, 0xee) == 0);
    CHECK(std::memcmp(target.buffer() + 524288, initiator.buffer(), 524288) == 0);
    CHECK(initiator_device->zero_hop_arena_writes() - arena_before == 3);
    CHECK(initiator_device->zero_hop_writes() - zero_hop_before == 3);
    CHECK(target_device->transfers_by_reference() == 0);

    // A source the user registered from the heap could be unmapped under a plain load: that
    // write takes process_vm_writev (zero-hop still, not a memcpy).
    std::vector<std::uint8_t> heap(4096, 0x3c);
    const auto heap_region = initiator_device->register_memory(initiator.domain_pointer(), heap.data(), heap.size(), kAll);
    const mlx5::ScatterGatherElement from_heap{reinterpret_cast<std::uint64_t>(heap.data()), 4096, heap_region->lkey()};
    CHECK(run_signaled(initiator, write_request(4, &from_heap, remote.buffer_addr + 8192, remote.rkey)).status ==
          mlx5::CompletionStatus::success);
    CHECK(bytes_differing(target.buffer() + 8192, 4096, 0x3c) == 0);
    CHECK(initiator_device->zero_hop_arena_writes() - arena_before == 3);
    CHECK(initiator_device->zero_hop_writes() - zero_hop_before == 4);
}

TEST_CASE_FIXTURE(ArenaPair, "zero-hop reads: memcpys from the peer's arena into ours, process_vm_readv into the heap") {
    for (std::uint32_t b = 0; b < (1 << 20); ++b) target.buffer()[b] = static_cast<std::uint8_t>(b * 5 + 3);
    const std::uint64_t reads_before = initiator_device->zero_hop_reads();
    const std::uint64_t arena_reads_before = initiator_device->zero_hop_arena_reads();  // the settling read's, if any

    const mlx5::ScatterGatherElement small = initiator.local(0, 8);
    mlx5::SendWorkRequest read = write_request(1, &small, remote.buffer_addr + 100, remote.rkey, 0);
    read.opcode = mlx5::SendOpcode::rdma_read;
    mlx5::Completion done = run_signaled(initiator, read);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.byte_len == 8);  // a read's CQE carries the bytes read
    CHECK(std::memcmp(initiator.buffer(), target.buffer() + 100, 8) == 0);

    // Scattered over two local pieces, and past the 256 KiB a read by system call may take.
    const mlx5::ScatterGatherElement halves[2] = {initiator.local(65536, 262144), initiator.local(524288, 262144)};
    read = write_request(2, halves, remote.buffer_addr + 4096, remote.rkey, 0);
    read.opcode = mlx5::SendOpcode::rdma_read;
    read.num_sge = 2;
    done = run_signaled(initiator, read);
    CHECK(done.status == mlx5::CompletionStatus::success);
    CHECK(done.byte_len == 524288);
    CHECK(std::memcmp(initiator.buffer() + 65536, target.buffer() + 4096, 262144) == 0);
    CHECK(std::memcmp(initiator.buffer() + 524288, target.buffer() + 4096 + 262144, 262144) == 0);
    CHECK(initiator_device->zero_hop_arena_reads() - arena_reads_before == 2);
    CHECK(initiator_device->zero_hop_reads() - reads_before == 2);
    CHECK(target_device->transfers_by_reference() == 0);

    // Into memory the user registered from the heap: by system call (it could be unmapped).
    std::vector<std::uint8_t> heap(4096, 0);
    const auto heap_region = initiator_device->register_memory(initiator.domain_pointer(), heap.data(), heap.size(), kAll);
    const mlx5::ScatterGatherElement into_heap{reinterpret_cast<std::uint64_t>(heap.data()), 4096, heap_region->lkey()};
    read = write_request(3, &into_heap, remote.buffer_addr + 8192, remote.rkey, 0);
    read.opcode = mlx5::SendOpcode::rdma_read;
    CHECK(run_signaled(initiator, read).status == mlx5::CompletionStatus::success);
    CHECK(std::memcmp(heap.data(), target.buffer() + 8192, 4096) == 0);
    CHECK(initiator_device->zero_hop_arena_reads() - arena_reads_before == 2);
    CHECK(initiator_device->zero_hop_reads() - reads_before == 3);
}

namespace {

enum class ReadRefusal { bad_key, out_of_bounds, region_without_remote_read };

struct ReadOutcome {
    mlx5::CompletionStatus status = mlx5::CompletionStatus::success;
    std::size_t local_bytes_touched = 0;
    std::uint64_t zero_hop_reads = 0;
};

ReadOutcome refused_read(ReadRefusal refusal, bool zero_hop) {
    DevicePair pair(allocated_pair_settings(zero_hop ? "1" : "0"));
    REQUIRE(settle_path(pair.initiator, pair.remote));
    // The settling read itself may go zero-hop (the connection opens at RTS, so its hello may be
    // answered first): only the refused read is counted.
    const std::uint64_t zero_hop_reads_before = pair.initiator_device->zero_hop_reads();
    std::uint64_t address = pair.remote.buffer_addr;
    std::uint32_t rkey = pair.remote.rkey;
    std::shared_ptr<soft::MemoryRegion> extra;
    switch (refusal) {
        case ReadRefusal::bad_key: rkey ^= 0x55; break;
        case ReadRefusal::out_of_bounds: address += (1 << 20) - 2048; break;
        case ReadRefusal::region_without_remote_read:
            extra = pair.target_device->allocate_memory(pair.target.domain_pointer(), 65536, soft::kLocalWrite | soft::kRemoteWrite);
            address = extra->addr();
            rkey = extra->rkey();
            break;
    }
    std::memset(pair.target.buffer(), 0x42, 1 << 20);
    std::memset(pair.initiator.buffer(), 0xee, 1 << 20);
    const mlx5::ScatterGatherElement into = pair.initiator.local(0, 4096);
    mlx5::SendWorkRequest read = write_request(1, &into, address, rkey, 0);
    read.opcode = mlx5::SendOpcode::rdma_read;
    ReadOutcome outcome;
    outcome.status = run_signaled(pair.initiator, read).status;
    outcome.local_bytes_touched = bytes_differing(pair.initiator.buffer(), 1 << 20, 0xee);
    outcome.zero_hop_reads = pair.initiator_device->zero_hop_reads() - zero_hop_reads_before;
    return outcome;
}

}  // namespace

TEST_CASE("zero-hop read refused: the request path's CQE, and the local memory untouched") {
    for (const ReadRefusal refusal : {ReadRefusal::bad_key, ReadRefusal::out_of_bounds, ReadRefusal::region_without_remote_read}) {
        CAPTURE(static_cast<int>(refusal));
        const ReadOutcome request_path = refused_read(refusal, false);
        const ReadOutcome zero_hop = refused_read(refusal, true);
        CHECK(request_path.status == mlx5::CompletionStatus::remote_access_error);
        CHECK(zero_hop.status == request_path.status);
        CHECK(request_path.local_bytes_touched == 0);
        CHECK(zero_hop.local_bytes_touched == 0);
        CHECK(zero_hop.zero_hop_reads == 0);
    }
}

TEST_CASE("allocated memory with zero-hop writes off: the request path moves them, byte for byte") {
    DevicePair pair(allocated_pair_settings("0"));
    REQUIRE(settle_path(pair.initiator, pair.remote));
    for (std::uint32_t b = 0; b < 65536; ++b) pair.initiator.buffer()[b] = static_cast<std::uint8_t>(b * 3 + 2);
    const mlx5::ScatterGatherElement source = pair.initiator.local(0, 65536);
    CHECK(run_signaled(pair.initiator, write_request(1, &source, pair.remote.buffer_addr + 4096, pair.remote.rkey)).status ==
          mlx5::CompletionStatus::success);
    soft::acquire_remote_writes();
    CHECK(std::memcmp(pair.target.buffer() + 4096, pair.initiator.buffer(), 65536) == 0);
    CHECK(pair.initiator_device->zero_hop_writes() == 0);
    CHECK(pair.target_device->transfers_by_reference() > 0);
}

TEST_CASE_FIXTURE(ArenaPair, "an allocated region deregistered under a stream of memcpy writes: none lands after, its memory comes back clean") {
    auto region = target_device->allocate_memory(target.domain_pointer(), 65536, soft::kLocalWrite | soft::kRemoteWrite);
    REQUIRE(region != nullptr);
    auto* window = reinterpret_cast<std::uint8_t*>(region->addr());
    const std::uint64_t address = region->addr();
    const std::uint32_t rkey = region->rkey();

    rdmachan::test::WriteStream writer(initiator, address, rkey);
    writer.wait_started();
    // Each write now waits 20 ms between its checks and its copy; the deregistration starts
    // while one holds the key.
    soft::delay_zero_hop_writes(std::chrono::milliseconds(20));
    const std::uint32_t holder = rdmachan::test::wait_for_holder(*target_device, rkey);
    // The memory goes back to the arena with the region: keep a view of it to watch (the
    // arena's pages stay mapped in this process, freed ranges read as zeros).
    region.reset();
    CHECK(holder == static_cast<std::uint32_t>(::getpid()));  // the race was met: a write held the key
    std::vector<std::uint8_t> snapshot(window, window + 65536);
    writer.join();
    soft::delay_zero_hop_writes(std::chrono::microseconds(0));
    CHECK(writer.started.load());
    CHECK(writer.refused.load() == 1);
    CHECK(writer.other.load() == 0);
    CHECK(bytes_differing(snapshot.data(), 65536, 0) == 0);  // given back: zeros
    CHECK(std::memcmp(snapshot.data(), window, 65536) == 0);   // and nothing landed after
    CHECK(initiator_device->zero_hop_arena_writes() > 0);

    // The next allocation of that size reuses the range, clean.
    auto reused = target_device->allocate_memory(target.domain_pointer(), 65536, soft::kLocalWrite | soft::kRemoteWrite);
    REQUIRE(reused != nullptr);
    CHECK(reused->addr() == address);
    CHECK(reused->rkey() != rkey);
    CHECK(bytes_differing(window, 65536, 0) == 0);
}

namespace {

// A protection domain that only registers: records what it was given and checks, when the
// registration goes, that the memory is still mapped (deregistration comes before unmapping).
class RecordingDomain final : public rdmachan::transport::ProtectionDomain {
public:
    struct Record {
        void* data = nullptr;
        std::size_t length = 0;
        std::uint32_t access = 0;
        bool mapped_at_deregistration = false;
    };
    std::shared_ptr<Record> last = std::make_shared<Record>();
    bool refuse = false;

    rdmachan::transport::Registration register_memory(void* data, std::size_t length, std::uint32_t access) override {
        if (refuse) throw rdmachan::Error("refused on purpose");
        *last = {data, length, access, false};
        rdmachan::transport::Registration registration;
        registration.lkey = 0x1200;
        registration.rkey = 0x3400;
        auto record = last;
        registration.owner = std::shared_ptr<void>(data, [record](void* memory) {
            unsigned char resident = 0;
            record->mapped_at_deregistration = ::mincore(memory, 4096, &resident) == 0;
        });
        return registration;
    }
    std::shared_ptr<rdmachan::transport::CompletionQueue> create_completion_queue(std::uint32_t) override {
        throw std::logic_error("not used");
    }
    std::shared_ptr<rdmachan::transport::QueuePair> create_queue_pair(const rdmachan::transport::QueuePairSettings&,
                                                                      std::shared_ptr<rdmachan::transport::CompletionQueue>,
                                                                      std::shared_ptr<rdmachan::transport::CompletionQueue>) override {
        throw std::logic_error("not used");
    }
};

}  // namespace

TEST_CASE("the default allocate_memory: whole zeroed pages of its own, registered, deregistered before they are unmapped") {
    RecordingDomain domain;
    rdmachan::transport::Registration registration = domain.allocate_memory(10000, 7);
    REQUIRE(registration.data != nullptr);
    CHECK(reinterpret_cast<std::uintptr_t>(registration.data) % 4096 == 0);
    CHECK(domain.last->data == registration.data);
    CHECK(domain.last->length == 10000);
    CHECK(domain.last->access == 7);
    CHECK(registration.lkey == 0x1200);
    CHECK(registration.rkey == 0x3400);
    CHECK(bytes_differing(registration.data, 12288, 0) == 0);
    std::memset(registration.data, 0x77, 12288);  // all three pages are ours
    unsigned char resident = 0;
    void* const memory = registration.data;
    registration = {};
    CHECK(domain.last->mapped_at_deregistration);
    CHECK(::mincore(memory, 4096, &resident) != 0);  // unmapped after

    CHECK_THROWS_WITH_AS(domain.allocate_memory(0, 7), "allocate_memory: length is 0", rdmachan::Error);
    domain.refuse = true;
    CHECK_THROWS_WITH_AS(domain.allocate_memory(4096, 7), "refused on purpose", rdmachan::Error);
}
