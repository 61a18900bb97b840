// A CUDA kernel posts through the mlx5 data path (the header-only __host__ __device__ code of
// transport/mlx5) into rings that the software mlx5 device executes, as a GPU-side poster drives
// a ConnectX: it writes WQEs into the send queue, the doorbell record and the BlueFlame buffer,
// posts receives, and polls CQEs, all in host memory mapped into the GPU (cudaHostRegister on the
// device's own ring pages). A host thread plays the part of the NIC's doorbell: it watches the
// send doorbell record and calls QueuePair::ring_send_doorbell() when it moves, which is the
// moment the device would see the register write (transport/soft/README.md, "Doorbells").
//
// Every round (gpu_workload.hpp) is checked on the host, byte for byte:
//   - the send ring, BlueFlame buffer and send doorbell record the kernel wrote against a host
//     replay of the same posts through the same encoder into a shadow ring; the receive ring
//     and its doorbell record likewise;
//   - every completion the kernel decoded (wr_id, status, opcode, flags, length, immediate, QPN);
//   - the CQ doorbell records (the consumer index the kernel wrote);
//   - both 1 MiB buffers, whole, against the images the round's operations must leave.
//
// With --host-poster a host thread runs the same rounds through the host side of the nvcc
// build, in plain memory: the harness, the replay and the device's side, checked without a GPU.
//
// Exit status: 0 passed; 1 a check failed (each failure is printed); 77 no CUDA device here
// (CTest reports it as skipped).
//   gpu_soft_device_test [--host-poster] [auto|shm|tcp]
//     (the transport is RDMACHAN_SOFT_TRANSPORT for both devices; default auto)
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "tests/cuda/gpu_workload.hpp"
#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/receive_queue.hpp"
#include "transport/mlx5/send_queue.hpp"
#include "transport/soft/device.hpp"

namespace {

namespace mlx5 = rdmachan::mlx5;
namespace soft = rdmachan::soft;
using namespace gpu_workload;

constexpr int kSkipped = 77;
constexpr std::uint32_t kCompletionQueueEntries = 8;  // small, so the rounds wrap the CQs
constexpr std::uint32_t kMaxSendWr = 32;
constexpr std::uint32_t kMaxReceiveWr = kReceivesPerRound * 2;
constexpr std::uint32_t kMaxSge = 4;
constexpr std::uint32_t kMaxInlineData = 128;
constexpr std::uint64_t kKernelWaitNanoseconds = 20'000'000'000ull;
constexpr auto kHostWait = std::chrono::seconds(40);

int failures = 0;

template <typename... Arguments>
void fail(const char* format, Arguments... arguments) {
    ++failures;
    std::printf("FAILED: ");
    std::printf(format, arguments...);
    std::printf("\n");
}

bool cuda_ok(cudaError_t status, const char* call) {
    if (status == cudaSuccess) return true;
    fail("%s: %s (%s)", call, cudaGetErrorName(status), cudaGetErrorString(status));
    return false;
}

// Who posts and polls: a GPU kernel, or (--host-poster) a host thread running the same
// __host__ __device__ code as compiled by nvcc, which checks the harness and the soft device's
// side of the test on machines without a GPU.
bool host_poster = false;

// Memory both the poster and the device use, zeroed: pinned and mapped into the GPU's address
// space, or plain pages for a host poster.
template <typename T>
T* allocate_shared(std::size_t count) {
    const std::size_t bytes = (count * sizeof(T) + 4095) & ~std::size_t{4095};
    void* memory = nullptr;
    if (host_poster) {
        memory = std::aligned_alloc(4096, bytes);
        if (memory == nullptr) fail("cannot allocate %zu bytes", bytes);
    } else if (!cuda_ok(cudaHostAlloc(&memory, bytes, cudaHostAllocMapped | cudaHostAllocPortable), "cudaHostAlloc")) {
        memory = nullptr;
    }
    if (memory != nullptr) std::memset(memory, 0, bytes);
    return static_cast<T*>(memory);
}

void free_shared(void* memory) {
    if (memory == nullptr) return;
    if (host_poster) {
        std::free(memory);
    } else {
        cudaFreeHost(memory);
    }
}

// The device's ring pages (aligned_alloc or its shared arena, never ours to allocate), pinned
// and mapped for the GPU. Ranges are widened to whole pages and merged, since two rings may
// share a page. The test needs the GPU to use the host's addresses for them (the pointers inside
// the data path's ring descriptors are the device's): it checks that it can.
class RegisteredPages {
public:
    void add(const void* address, std::size_t length) {
        const auto start = reinterpret_cast<std::uintptr_t>(address) & ~std::uintptr_t{4095};
        const auto end = (reinterpret_cast<std::uintptr_t>(address) + length + 4095) & ~std::uintptr_t{4095};
        ranges_.push_back({start, end});
    }

    bool register_all() {
        std::sort(ranges_.begin(), ranges_.end());
        std::vector<Range> merged;
        for (const Range& range : ranges_) {
            if (!merged.empty() && range.start <= merged.back().end) {
                merged.back().end = std::max(merged.back().end, range.end);
            } else {
                merged.push_back(range);
            }
        }
        int pageable = 0;
        cudaDeviceGetAttribute(&pageable, cudaDevAttrPageableMemoryAccess, 0);
        for (const Range& range : merged) {
            void* host = reinterpret_cast<void*>(range.start);
            const cudaError_t status = cudaHostRegister(host, range.end - range.start, cudaHostRegisterMapped | cudaHostRegisterPortable);
            if (status != cudaSuccess && pageable != 0) {
                // The GPU reaches pageable host memory by itself (HMM or ATS): no pinning needed.
                cudaGetLastError();
                std::printf("cudaHostRegister of %zu bytes at %p: %s; the GPU accesses pageable memory, so the rings are used unpinned\n",
                            static_cast<std::size_t>(range.end - range.start), host, cudaGetErrorString(status));
                continue;
            }
            if (!cuda_ok(status, "cudaHostRegister of a ring page range")) return false;
            registered_.push_back(host);
            void* device = nullptr;
            if (!cuda_ok(cudaHostGetDevicePointer(&device, host, 0), "cudaHostGetDevicePointer")) return false;
            if (device != host) {
                fail("the GPU maps ring pages at %p, not at the host address %p: this test needs the same address", device, host);
                return false;
            }
        }
        std::printf("registered %zu of %zu page ranges of the device's rings with CUDA (pageable memory access: %d)\n", registered_.size(),
                    merged.size(), pageable);
        return true;
    }

    ~RegisteredPages() {
        for (void* host : registered_) cudaHostUnregister(host);
    }

private:
    struct Range {
        std::uintptr_t start;
        std::uintptr_t end;
        bool operator<(const Range& other) const { return start < other.start; }
    };
    std::vector<Range> ranges_;
    std::vector<void*> registered_;
};

// One per CQ: QPNs are numbered per device, so the two devices' queue pairs may share one.
struct Resolver {
    std::uint32_t qpn = 0;
    mlx5::CompletionTarget* target = nullptr;
    RDMACHAN_HOST_DEVICE mlx5::CompletionTarget* operator()(std::uint32_t cqe_qpn, std::uint32_t) const {
        return cqe_qpn == qpn ? target : nullptr;
    }
};

enum GpuFailure : std::uint32_t {
    kNoFailure = 0,
    kReceivePostRefused = 1,
    kSendPostRefused = 2,
    kCompletionsMissing = 3,
};

// Everything the kernel reads and writes besides the rings and buffers: in mapped memory, so
// the host sets it up and reads the results without copies.
struct GpuState {
    mlx5::SendQueue send;
    mlx5::ReceiveQueue receive;
    mlx5::CompletionQueue send_completions;
    mlx5::CompletionQueue receive_completions;
    mlx5::CompletionTarget initiator_target;
    mlx5::CompletionTarget target_target;
    Resolver initiator_resolver;
    Resolver target_resolver;
    Buffers buffers;
    mlx5::Completion sent[kSignaledPerRound];
    mlx5::Completion received[kReceivesPerRound];
    std::uint32_t sent_count;
    std::uint32_t received_count;
    std::uint32_t failure;
    std::uint32_t failure_detail;
};

RDMACHAN_HOST_DEVICE std::uint64_t now_nanoseconds() {
#if defined(__CUDA_ARCH__)
    std::uint64_t time;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(time));
    return time;
#else
    return static_cast<std::uint64_t>(
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count());
#endif
}

__global__ void fill_source(std::uint8_t* initiator, std::uint32_t bytes) {
    for (std::uint32_t i = blockIdx.x * blockDim.x + threadIdx.x; i < bytes; i += gridDim.x * blockDim.x) {
        initiator[i] = source_byte(i);
    }
}

// One round: post the receives, the ten single posts and the batch, then poll both CQs until
// every completion of the round is in (or the deadline passes). Run by one GPU thread, or by a
// host thread in --host-poster mode.
RDMACHAN_HOST_DEVICE void post_and_poll_round(GpuState* state, std::uint32_t round) {
    state->sent_count = 0;
    state->received_count = 0;
    state->failure = kNoFailure;

    mlx5::ReceiveWorkRequest receives[kReceivesPerRound];
    mlx5::ScatterGatherElement receive_elements[kReceivesPerRound + 1];
    round_receives(state->buffers, round, receives, receive_elements);
    std::uint32_t posted = 0;
    if (state->receive.post(receives, kReceivesPerRound, &posted) != mlx5::PostResult::ok) {
        state->failure = kReceivePostRefused;
        state->failure_detail = posted;
        return;
    }

    mlx5::SendWorkRequest requests[kRequestsPerRound];
    mlx5::ScatterGatherElement elements[kElementsPerRound];
    round_requests(state->buffers, round, requests, elements);
    for (std::uint32_t i = 0; i < kSinglePosts; ++i) {
        const mlx5::PostResult result = state->send.post(&requests[i], 1, nullptr);
        if (result != mlx5::PostResult::ok) {
            state->failure = kSendPostRefused;
            state->failure_detail = i | static_cast<std::uint32_t>(result) << 16;  // which request, and why
            return;
        }
    }
    if (state->send.post(&requests[kSinglePosts], kBatchPosts, &posted) != mlx5::PostResult::ok) {
        state->failure = kSendPostRefused;
        state->failure_detail = kSinglePosts + posted;
        return;
    }

    const Resolver initiator_resolver = state->initiator_resolver;
    const Resolver target_resolver = state->target_resolver;
    std::uint32_t sent = 0;
    std::uint32_t received = 0;
    const std::uint64_t deadline = now_nanoseconds() + kKernelWaitNanoseconds;
    while (sent < kSignaledPerRound || received < kReceivesPerRound) {
        if (sent < kSignaledPerRound) {
            sent += state->send_completions.poll(&state->sent[sent], kSignaledPerRound - sent, initiator_resolver);
        }
        if (received < kReceivesPerRound) {
            received += state->receive_completions.poll(&state->received[received], kReceivesPerRound - received, target_resolver);
        }
        if (now_nanoseconds() > deadline) {
            state->failure = kCompletionsMissing;
            break;
        }
    }
    state->sent_count = sent;
    state->received_count = received;
}

__global__ void run_round(GpuState* state, std::uint32_t round) {
    if (blockIdx.x == 0 && threadIdx.x == 0) post_and_poll_round(state, round);
}

// The NIC's side of the doorbell: the device learns of new WQEs when this thread sees the send
// doorbell record move.
class DoorbellWatcher {
public:
    // The record is read here, before any post, so that a post made before the thread first
    // runs is still seen as a change.
    explicit DoorbellWatcher(soft::QueuePair& queue_pair)
        : queue_pair_(queue_pair),
          record_(queue_pair.send_ring().doorbell_record + mlx5::kSendDoorbell),
          seen_(__atomic_load_n(record_, __ATOMIC_ACQUIRE)),
          thread_([this] { watch(); }) {}
    ~DoorbellWatcher() {
        stop_.store(true, std::memory_order_relaxed);
        thread_.join();
    }
    std::uint64_t doorbells() const { return doorbells_.load(std::memory_order_relaxed); }

private:
    void watch() {
        while (!stop_.load(std::memory_order_relaxed)) {
            const std::uint32_t now = __atomic_load_n(record_, __ATOMIC_ACQUIRE);
            if (now != seen_) {
                seen_ = now;
                queue_pair_.ring_send_doorbell();
                doorbells_.fetch_add(1, std::memory_order_relaxed);
            } else {
                std::this_thread::yield();
            }
        }
    }

    soft::QueuePair& queue_pair_;
    const std::uint32_t* record_;
    std::uint32_t seen_;
    std::atomic<bool> stop_{false};
    std::atomic<std::uint64_t> doorbells_{0};
    std::thread thread_;
};

// Launches one round's kernel and waits for it, with a deadline: a kernel cannot be stopped,
// so one that outlives the deadline ends the process (and with it the kernel).
bool wait_for_kernel(GpuState* state, std::uint32_t round, const DoorbellWatcher& watcher) {
    run_round<<<1, 1>>>(state, round);
    if (!cuda_ok(cudaGetLastError(), "run_round launch")) return false;
    const auto until = std::chrono::steady_clock::now() + kHostWait;
    cudaError_t done;
    while ((done = cudaStreamQuery(nullptr)) == cudaErrorNotReady && std::chrono::steady_clock::now() < until) {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
    if (done == cudaErrorNotReady) {
        fail("round %u: the kernel did not finish within %lld s (doorbells seen %llu)", round, static_cast<long long>(kHostWait.count()),
             static_cast<unsigned long long>(watcher.doorbells()));
        std::fflush(stdout);
        std::_Exit(1);
    }
    return cuda_ok(done, "run_round");
}

// One queue pair's side: its device objects.
struct Side {
    std::shared_ptr<soft::Device> device;
    std::shared_ptr<soft::ProtectionDomain> domain;
    std::shared_ptr<soft::MemoryRegion> region;
    std::shared_ptr<soft::CompletionQueue> send_cq;
    std::shared_ptr<soft::CompletionQueue> receive_cq;
    std::shared_ptr<soft::QueuePair> queue_pair;
    std::uint8_t* buffer = nullptr;
};

Side open_side(std::uint8_t* buffer) {
    constexpr std::uint32_t kAll = soft::kLocalWrite | soft::kRemoteWrite | soft::kRemoteRead | soft::kRemoteAtomic;
    Side side;
    side.device = soft::Device::open();
    side.domain = side.device->allocate_protection_domain();
    side.buffer = buffer;
    side.region = side.device->register_memory(side.domain, buffer, kBufferBytes, kAll);
    side.send_cq = side.device->create_completion_queue(kCompletionQueueEntries);
    side.receive_cq = side.device->create_completion_queue(kCompletionQueueEntries);
    soft::QueuePairInit init;
    init.send_cq = side.send_cq;
    init.recv_cq = side.receive_cq;
    init.capabilities = {kMaxSendWr, kMaxReceiveWr, kMaxSge, kMaxSge, kMaxInlineData};
    side.queue_pair = side.device->create_queue_pair(side.domain, init);
    side.queue_pair->modify_to_init(1, kAll);
    return side;
}

void connect(Side& side, const Side& peer) {
    soft::ReadyToReceiveAttributes receive;
    receive.remote.gid = peer.device->gid();
    receive.remote.lid = peer.device->lid();
    receive.remote.qpn = peer.queue_pair->qpn();
    receive.rq_psn = 0x2000;
    receive.min_rnr_timer = 1;
    side.queue_pair->modify_to_ready_to_receive(receive);
    soft::ReadyToSendAttributes send;
    send.sq_psn = 0x2000;
    send.timeout = 17;
    send.retry_cnt = 3;
    side.queue_pair->modify_to_ready_to_send(send);
}

// The host's replay of the kernel's posts, through the same encoder, into rings of its own.
struct Shadow {
    std::vector<std::uint8_t> send_ring;
    std::vector<std::uint8_t> blueflame;
    std::vector<std::uint8_t> receive_ring;
    std::uint32_t send_doorbell_record[2] = {};
    std::uint32_t receive_doorbell_record[2] = {};
    std::vector<std::uint64_t> send_wr_ids;
    std::vector<std::uint32_t> send_wqe_ends;
    std::vector<std::uint64_t> receive_wr_ids;
    std::vector<std::uint8_t> umr_opcodes;
    mlx5::SendQueue send;
    mlx5::ReceiveQueue receive;

    Shadow(const mlx5::SendQueueRing& real_send, const mlx5::ReceiveQueueRing& real_receive, const mlx5::SendQueueConfig& config)
        : send_ring(std::size_t{real_send.wqe_count} * mlx5::kSendWqeBasicBlockSize),
          blueflame(std::size_t{2} * real_send.blueflame_size),
          receive_ring(std::size_t{real_receive.wqe_count} * real_receive.stride),
          send_wr_ids(real_send.wqe_count),
          send_wqe_ends(real_send.wqe_count),
          receive_wr_ids(real_receive.wqe_count),
          umr_opcodes(real_send.wqe_count) {
        mlx5::SendQueueRing ring = real_send;
        ring.buffer = send_ring.data();
        ring.doorbell_record = send_doorbell_record;
        ring.blueflame_register = blueflame.data();
        send = mlx5::SendQueue(ring, {send_wr_ids.data(), send_wqe_ends.data(), 0, 0, umr_opcodes.data()}, config);
        mlx5::ReceiveQueueRing receive_ring_descriptor = real_receive;
        receive_ring_descriptor.buffer = receive_ring.data();
        receive_ring_descriptor.doorbell_record = receive_doorbell_record;
        receive = mlx5::ReceiveQueue(receive_ring_descriptor, receive_wr_ids.data(), {});
    }

    void replay(const Buffers& buffers, std::uint32_t round) {
        mlx5::ReceiveWorkRequest receives[kReceivesPerRound];
        mlx5::ScatterGatherElement receive_elements[kReceivesPerRound + 1];
        round_receives(buffers, round, receives, receive_elements);
        if (receive.post(receives, kReceivesPerRound, nullptr) != mlx5::PostResult::ok) fail("round %u: the host replay refused a receive", round);
        mlx5::SendWorkRequest requests[kRequestsPerRound];
        mlx5::ScatterGatherElement elements[kElementsPerRound];
        round_requests(buffers, round, requests, elements);
        for (std::uint32_t i = 0; i < kSinglePosts; ++i) {
            if (send.post(&requests[i], 1, nullptr) != mlx5::PostResult::ok) fail("round %u: the host replay refused request %u", round, i);
        }
        if (send.post(&requests[kSinglePosts], kBatchPosts, nullptr) != mlx5::PostResult::ok) fail("round %u: the host replay refused the batch", round);
        // The kernel retired the whole round by polling; the shadow has no CQ to do it.
        send.tracking().consumer_index = send.tracking().producer_index;
        receive.set_counters(receive.head(), receive.head());
    }
};

void compare_bytes(const char* what, std::uint32_t round, const std::uint8_t* actual, const std::uint8_t* expected, std::size_t length) {
    if (std::memcmp(actual, expected, length) == 0) return;
    std::size_t first = 0;
    while (actual[first] == expected[first]) ++first;
    std::size_t differing = 0;
    for (std::size_t i = first; i < length; ++i) differing += actual[i] != expected[i];
    fail("round %u: %s: %zu of %zu bytes differ, the first at offset %zu (0x%02x, expected 0x%02x)", round, what, differing, length,
         first, actual[first], expected[first]);
}

struct ExpectedCompletion {
    std::uint64_t wr_id;
    mlx5::CompletionOpcode opcode;
    std::uint32_t byte_len;  // checked where verbs defines it: reads, atomics, receives
    bool check_length;
    std::uint8_t flags;
    std::uint32_t immediate;  // checked on receive completions; a requester CQE carries none
};

void check_completion(const char* side, std::uint32_t round, std::uint32_t index, const mlx5::Completion& actual,
                      const ExpectedCompletion& expected, bool is_receive, std::uint32_t qpn) {
    if (actual.status != mlx5::CompletionStatus::success) {
        fail("round %u: %s completion %u (wr_id %llx): %s (syndrome 0x%02x)", round, side, index,
             static_cast<unsigned long long>(actual.wr_id), mlx5::to_string(actual.status), actual.syndrome);
        return;
    }
    if (actual.wr_id != expected.wr_id) {
        fail("round %u: %s completion %u: wr_id %llx, expected %llx", round, side, index,
             static_cast<unsigned long long>(actual.wr_id), static_cast<unsigned long long>(expected.wr_id));
    }
    if (actual.opcode != expected.opcode) {
        fail("round %u: %s completion %u: opcode %d, expected %d", round, side, index, static_cast<int>(actual.opcode),
             static_cast<int>(expected.opcode));
    }
    if (actual.is_receive != is_receive) fail("round %u: %s completion %u: is_receive %d", round, side, index, actual.is_receive);
    if (actual.qp_num != qpn) fail("round %u: %s completion %u: QPN 0x%x, expected 0x%x", round, side, index, actual.qp_num, qpn);
    if (expected.check_length && actual.byte_len != expected.byte_len) {
        fail("round %u: %s completion %u: byte_len %u, expected %u", round, side, index, actual.byte_len, expected.byte_len);
    }
    const std::uint8_t immediate_flag = actual.flags & mlx5::kCompletionWithImmediate;
    if (immediate_flag != (expected.flags & mlx5::kCompletionWithImmediate)) {
        fail("round %u: %s completion %u: flags 0x%x, expected 0x%x", round, side, index, actual.flags, expected.flags);
    } else if (is_receive && immediate_flag != 0 && actual.immediate != expected.immediate) {
        fail("round %u: %s completion %u: immediate 0x%x, expected 0x%x", round, side, index, actual.immediate, expected.immediate);
    }
}

void check_completions(const GpuState& state, std::uint32_t round, std::uint32_t initiator_qpn, std::uint32_t target_qpn) {
    using Opcode = mlx5::CompletionOpcode;
    const ExpectedCompletion sent[kSignaledPerRound] = {
        {wr_id(round, 0), Opcode::rdma_write, 0, false, 0, 0},
        {wr_id(round, 1), Opcode::rdma_write, 0, false, 0, 0},
        {wr_id(round, 2), Opcode::rdma_write, 0, false, 0, 0},
        // libmlx5 flags a requester's completion of a ..._with_immediate opcode too.
        {wr_id(round, 3), Opcode::rdma_write, 0, false, mlx5::kCompletionWithImmediate, 0},
        {wr_id(round, 4), Opcode::send, 0, false, 0, 0},
        {wr_id(round, 5), Opcode::send, 0, false, 0, 0},
        {wr_id(round, 6), Opcode::send, 0, false, mlx5::kCompletionWithImmediate, 0},
        {wr_id(round, 7), Opcode::rdma_read, kReadBytes, true, 0, 0},
        {wr_id(round, 8), Opcode::atomic_fetch_and_add, 8, true, 0, 0},
        {wr_id(round, 9), Opcode::atomic_compare_and_swap, 8, true, 0, 0},
        {wr_id(round, kRequestsPerRound - 1), Opcode::rdma_write, 0, false, 0, 0},
    };
    const ExpectedCompletion received[kReceivesPerRound] = {
        {receive_wr_id(round, 0), Opcode::receive_rdma_with_immediate, Lengths::immediate_write, true, mlx5::kCompletionWithImmediate,
         write_immediate(round)},
        {receive_wr_id(round, 1), Opcode::receive, Lengths::send, true, 0, 0},
        {receive_wr_id(round, 2), Opcode::receive, Lengths::inline_send, true, 0, 0},
        {receive_wr_id(round, 3), Opcode::receive, Lengths::immediate_send_first + Lengths::immediate_send_second, true,
         mlx5::kCompletionWithImmediate, send_immediate(round)},
    };
    for (std::uint32_t i = 0; i < state.sent_count; ++i) check_completion("send CQ", round, i, state.sent[i], sent[i], false, initiator_qpn);
    for (std::uint32_t i = 0; i < state.received_count; ++i) {
        check_completion("receive CQ", round, i, state.received[i], received[i], true, target_qpn);
    }
}

// What the round's operations leave in both buffers.
void apply_round(std::uint32_t round, std::vector<std::uint8_t>& initiator, std::vector<std::uint8_t>& target) {
    const std::uint32_t source = round * kSourceBytesPerRound;
    const std::uint32_t slice = round * kTargetBytesPerRound;
    auto copy = [&](std::uint32_t to, std::uint32_t from, std::uint32_t length) {
        std::memcpy(&target[slice + to], &initiator[source + from], length);
    };
    copy(TargetOffsets::write, SourceOffsets::write, Lengths::write);
    std::uint32_t at = TargetOffsets::gathered_write;
    copy(at, SourceOffsets::gathered_first, Lengths::gathered_first);
    at += Lengths::gathered_first;
    copy(at, SourceOffsets::gathered_second, Lengths::gathered_second);
    at += Lengths::gathered_second;
    copy(at, SourceOffsets::gathered_third, Lengths::gathered_third);
    copy(TargetOffsets::inline_write, SourceOffsets::inline_write, Lengths::inline_write);
    copy(TargetOffsets::immediate_write, SourceOffsets::immediate_write, Lengths::immediate_write);
    copy(TargetOffsets::send_receive, SourceOffsets::send, Lengths::send);
    copy(TargetOffsets::inline_send_receive, SourceOffsets::inline_send, Lengths::inline_send);
    // 300 + 700 bytes gathered, scattered into two receive SGEs of 512.
    std::vector<std::uint8_t> message(Lengths::immediate_send_first + Lengths::immediate_send_second);
    std::memcpy(message.data(), &initiator[source + SourceOffsets::immediate_send_first], Lengths::immediate_send_first);
    std::memcpy(message.data() + Lengths::immediate_send_first, &initiator[source + SourceOffsets::immediate_send_second],
                Lengths::immediate_send_second);
    std::memcpy(&target[slice + TargetOffsets::scattered_receive_first], message.data(), Lengths::scattered_receive);
    std::memcpy(&target[slice + TargetOffsets::scattered_receive_second], message.data() + Lengths::scattered_receive,
                message.size() - Lengths::scattered_receive);
    for (std::uint32_t i = 0; i < kBatchPosts; ++i) {
        copy(TargetOffsets::batch + i * Lengths::batch, SourceOffsets::batch + i * Lengths::batch, Lengths::batch);
    }
    std::memcpy(&initiator[kReadDestination + round * kReadBytes], &target[kReadSource + round * kReadBytes], kReadBytes);

    std::uint64_t fetch_add;
    std::memcpy(&fetch_add, &target[kFetchAddWord], 8);
    std::memcpy(&initiator[kAtomicResults + round * 16], &fetch_add, 8);
    fetch_add += round + 1;
    std::memcpy(&target[kFetchAddWord], &fetch_add, 8);
    std::uint64_t compare_swap;
    std::memcpy(&compare_swap, &target[kCompareSwapWord], 8);
    std::memcpy(&initiator[kAtomicResults + round * 16 + 8], &compare_swap, 8);
    if (compare_swap == round) compare_swap = round + 1;
    std::memcpy(&target[kCompareSwapWord], &compare_swap, 8);
}

std::uint32_t consumer_index(const mlx5::CompletionQueueRing& ring) {
    return mlx5::big_to_host32(__atomic_load_n(ring.doorbell_record, __ATOMIC_ACQUIRE)) & 0xffffff;
}

// The GPU and its ability to use the host's addresses for registered memory.
int check_gpu() {
    int devices = 0;
    const cudaError_t counted = cudaGetDeviceCount(&devices);
    if (counted != cudaSuccess || devices == 0) {
        std::printf("skipped: no CUDA device (%s)\n", counted != cudaSuccess ? cudaGetErrorString(counted) : "none found");
        return kSkipped;
    }
    cudaDeviceProp properties{};
    if (!cuda_ok(cudaGetDeviceProperties(&properties, 0), "cudaGetDeviceProperties")) return 1;
    int host_pointers = 0;
    if (!cuda_ok(cudaDeviceGetAttribute(&host_pointers, cudaDevAttrCanUseHostPointerForRegisteredMem, 0), "cudaDeviceGetAttribute")) return 1;
    std::printf("GPU: %s (compute capability %d.%d); registered host memory at host addresses: %s\n", properties.name,
                properties.major, properties.minor, host_pointers != 0 ? "yes" : "no");
    if (host_pointers == 0) {
        fail("this GPU cannot use host pointers for registered memory, which the test relies on");
        return 1;
    }
    return 0;
}

int run() {
    if (host_poster) {
        std::printf("poster: a host thread (--host-poster), running the nvcc build's host side of the data path\n");
    } else if (const int status = check_gpu(); status != 0) {
        return status;
    }

    auto* initiator_buffer = allocate_shared<std::uint8_t>(kBufferBytes);
    auto* target_buffer = allocate_shared<std::uint8_t>(kBufferBytes);
    auto* state = allocate_shared<GpuState>(1);
    if (initiator_buffer == nullptr || target_buffer == nullptr || state == nullptr) return 1;

    int status = 0;
    {
        Side initiator = open_side(initiator_buffer);
        Side target = open_side(target_buffer);
        connect(initiator, target);
        connect(target, initiator);

        const mlx5::SendQueueRing& send_ring = initiator.queue_pair->send_ring();
        const mlx5::ReceiveQueueRing& receive_ring = target.queue_pair->receive_ring();
        const mlx5::CompletionQueueRing& send_cq_ring = initiator.send_cq->ring();
        const mlx5::CompletionQueueRing& receive_cq_ring = target.receive_cq->ring();
        std::printf("send ring %u WQEBBs, BlueFlame %u B; receive ring %u x %u B; CQs %u x %u B; transport %s\n", send_ring.wqe_count,
                    send_ring.blueflame_size, receive_ring.wqe_count, receive_ring.stride, send_cq_ring.cqe_count,
                    send_cq_ring.cqe_size, std::getenv("RDMACHAN_SOFT_TRANSPORT"));

        RegisteredPages pages;
        pages.add(send_ring.buffer, std::size_t{send_ring.wqe_count} * mlx5::kSendWqeBasicBlockSize);
        pages.add(send_ring.doorbell_record, 8);
        pages.add(send_ring.blueflame_register, std::size_t{2} * send_ring.blueflame_size);
        pages.add(receive_ring.buffer, std::size_t{receive_ring.wqe_count} * receive_ring.stride);
        pages.add(receive_ring.doorbell_record, 8);
        pages.add(send_cq_ring.buffer, std::size_t{send_cq_ring.cqe_count} * send_cq_ring.cqe_size);
        pages.add(send_cq_ring.doorbell_record, 8);
        pages.add(receive_cq_ring.buffer, std::size_t{receive_cq_ring.cqe_count} * receive_cq_ring.cqe_size);
        pages.add(receive_cq_ring.doorbell_record, 8);
        if (!host_poster && !pages.register_all()) return 1;

        // The kernel's queues, built on the host in mapped memory over the device's rings.
        auto* send_wr_ids = allocate_shared<std::uint64_t>(send_ring.wqe_count);
        auto* send_wqe_ends = allocate_shared<std::uint32_t>(send_ring.wqe_count);
        auto* umr_opcodes = allocate_shared<std::uint8_t>(send_ring.wqe_count);
        auto* receive_wr_ids = allocate_shared<std::uint64_t>(receive_ring.wqe_count);
        if (send_wr_ids == nullptr || send_wqe_ends == nullptr || umr_opcodes == nullptr || receive_wr_ids == nullptr) return 1;
        mlx5::SendQueueConfig config;
        config.max_sge = kMaxSge;
        config.max_inline_data = kMaxInlineData;
        new (state) GpuState{};
        state->send = mlx5::SendQueue(send_ring, {send_wr_ids, send_wqe_ends, 0, 0, umr_opcodes}, config);
        state->receive = mlx5::ReceiveQueue(receive_ring, receive_wr_ids, {});
        state->send_completions = mlx5::CompletionQueue(send_cq_ring);
        state->receive_completions = mlx5::CompletionQueue(receive_cq_ring);
        state->initiator_target.send = &state->send.tracking();
        state->initiator_target.send_wqe_count = send_ring.wqe_count;
        state->target_target.receive = &state->receive;
        state->initiator_resolver = {initiator.queue_pair->qpn(), &state->initiator_target};
        state->target_resolver = {target.queue_pair->qpn(), &state->target_target};
        state->buffers = {reinterpret_cast<std::uint64_t>(initiator_buffer), initiator.region->lkey(),
                          reinterpret_cast<std::uint64_t>(target_buffer), target.region->lkey(), target.region->rkey()};

        Shadow shadow(send_ring, receive_ring, config);

        // The source is the GPU's own data; the read source and atomic words are the host's.
        if (host_poster) {
            for (std::uint32_t i = 0; i < kReadDestination; ++i) initiator_buffer[i] = source_byte(i);
        } else {
            fill_source<<<64, 256>>>(initiator_buffer, kReadDestination);
            if (!cuda_ok(cudaDeviceSynchronize(), "fill_source")) return 1;
        }
        std::vector<std::uint8_t> expected_initiator(kBufferBytes, 0);
        std::vector<std::uint8_t> expected_target(kBufferBytes, 0);
        for (std::uint32_t i = 0; i < kReadDestination; ++i) expected_initiator[i] = source_byte(i);
        for (std::uint32_t i = 0; i < kRounds * kReadBytes; ++i) expected_target[kReadSource + i] = read_source_byte(i);
        std::memcpy(&expected_target[kFetchAddWord], &kFetchAddStart, 8);
        std::memcpy(target_buffer, expected_target.data(), kBufferBytes);
        compare_bytes("the source the GPU filled", 0, initiator_buffer, expected_initiator.data(), kBufferBytes);

        DoorbellWatcher watcher(*initiator.queue_pair);
        std::uint32_t send_consumed = 0;
        std::uint32_t receive_consumed = 0;
        for (std::uint32_t round = 0; round < kRounds && failures == 0; ++round) {
            if (host_poster) {
                post_and_poll_round(state, round);
            } else if (!wait_for_kernel(state, round, watcher)) {
                break;
            }
            if (state->failure != kNoFailure) {
                fail("round %u: the kernel stopped with failure %u (detail %u): %u of %u send and %u of %u receive completions", round,
                     state->failure, state->failure_detail, state->sent_count, kSignaledPerRound, state->received_count,
                     kReceivesPerRound);
            }
            check_completions(*state, round, initiator.queue_pair->qpn(), target.queue_pair->qpn());

            shadow.replay(state->buffers, round);
            compare_bytes("send ring", round, send_ring.buffer, shadow.send_ring.data(), shadow.send_ring.size());
            compare_bytes("BlueFlame buffer", round, send_ring.blueflame_register, shadow.blueflame.data(), shadow.blueflame.size());
            compare_bytes("send doorbell record", round, reinterpret_cast<const std::uint8_t*>(send_ring.doorbell_record + mlx5::kSendDoorbell),
                          reinterpret_cast<const std::uint8_t*>(shadow.send_doorbell_record + mlx5::kSendDoorbell), 4);
            compare_bytes("receive ring", round, receive_ring.buffer, shadow.receive_ring.data(), shadow.receive_ring.size());
            compare_bytes("receive doorbell record", round,
                          reinterpret_cast<const std::uint8_t*>(receive_ring.doorbell_record + mlx5::kReceiveDoorbell),
                          reinterpret_cast<const std::uint8_t*>(shadow.receive_doorbell_record + mlx5::kReceiveDoorbell), 4);
            if (state->send.tracking().producer_index != shadow.send.tracking().producer_index) {
                fail("round %u: producer index %u, the replay's %u", round, state->send.tracking().producer_index,
                     shadow.send.tracking().producer_index);
            }

            send_consumed += state->sent_count;
            receive_consumed += state->received_count;
            if (consumer_index(send_cq_ring) != (send_consumed & 0xffffff)) {
                fail("round %u: send CQ doorbell record says %u consumed, the kernel polled %u", round, consumer_index(send_cq_ring), send_consumed);
            }
            if (consumer_index(receive_cq_ring) != (receive_consumed & 0xffffff)) {
                fail("round %u: receive CQ doorbell record says %u consumed, the kernel polled %u", round, consumer_index(receive_cq_ring),
                     receive_consumed);
            }

            apply_round(round, expected_initiator, expected_target);
            compare_bytes("initiator buffer", round, initiator_buffer, expected_initiator.data(), kBufferBytes);
            compare_bytes("target buffer", round, target_buffer, expected_target.data(), kBufferBytes);
        }
        const std::uint32_t producer = state->send.tracking().producer_index;
        std::printf("%u rounds: %u WQEs in %u WQEBBs (%.1f passes of the send ring), %u receives (%.1f passes), %u + %u CQEs "
                    "(%.1f and %.1f passes of the CQs), %llu doorbells seen, 2 x %u bytes compared each round\n",
                    kRounds, kRounds * kRequestsPerRound, producer, double(producer) / send_ring.wqe_count,
                    state->receive.head(), double(state->receive.head()) / receive_ring.wqe_count, send_consumed, receive_consumed,
                    double(send_consumed) / send_cq_ring.cqe_count, double(receive_consumed) / receive_cq_ring.cqe_count,
                    static_cast<unsigned long long>(watcher.doorbells()), kBufferBytes);
        status = failures == 0 ? 0 : 1;
        state->~GpuState();
        free_shared(send_wr_ids);
        free_shared(send_wqe_ends);
        free_shared(umr_opcodes);
        free_shared(receive_wr_ids);
    }
    free_shared(state);
    free_shared(initiator_buffer);
    free_shared(target_buffer);
    return status;
}

}  // namespace

int main(int argc, char** argv) {
    for (int i = 1; i < argc; ++i) {
        if (std::strcmp(argv[i], "--host-poster") == 0) {
            host_poster = true;
        } else if (argv[i][0] != '-') {
            setenv("RDMACHAN_SOFT_TRANSPORT", argv[i], 1);
        } else {
            std::printf("usage: %s [--host-poster] [auto|shm|tcp]\n", argv[0]);
            return 2;
        }
    }
    if (std::getenv("RDMACHAN_SOFT_TRANSPORT") == nullptr) setenv("RDMACHAN_SOFT_TRANSPORT", "auto", 1);
    int status;
    try {
        status = run();
    } catch (const std::exception& error) {
        std::printf("FAILED: %s\n", error.what());
        return 1;
    }
    if (status == kSkipped) return status;
    std::printf("%s (%d failures)\n", status == 0 && failures == 0 ? "PASSED" : "FAILED", failures);
    return status == 0 && failures == 0 ? 0 : 1;
}
