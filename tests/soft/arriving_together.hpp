// Requests that arrive at the target together, so that its progress thread handles them in one
// read turn (coalesced acknowledgements, compressed CQE sessions): the test holds the target
// device's mutex (its progress thread reads its sockets only under it) while the initiator
// sends them all, and lets go once every one is in the target's socket.
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <mutex>
#include <vector>

#include "tests/soft/device_pair.hpp"
#include "tests/soft/eventually.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::test {

// A TcpDevicePair whose target's own connection to the initiator (opened when its QP reached
// RTS) settled too: nothing of its set-up is left for the target's thread while a test holds it.
struct SettledTcpPair : TcpDevicePair {
    explicit SettledTcpPair(const EndpointOptions& options = {}) : TcpDevicePair(options) {
        REQUIRE(eventually([&] { return target_device->answered_hellos() >= 1; }));
    }
};

inline std::size_t requests_in_flight(soft::Device& device) {
    soft::DeviceCore& core = device.core();
    std::lock_guard lock(core.mutex);
    std::size_t count = 0;
    for (const auto& [qpn, queue_pair] : core.queue_pairs) count += queue_pair->in_flight.size();
    return count;
}

// The bytes of a request frame carrying `payload` bytes.
constexpr std::size_t frame_bytes(std::size_t payload) {
    return sizeof(soft::wire::FrameHeader) + sizeof(soft::wire::Request) + payload;
}
// The bytes of an answer (an ACK, a read's response) carrying `payload` bytes.
constexpr std::size_t answer_bytes(std::size_t payload) {
    return sizeof(soft::wire::FrameHeader) + sizeof(soft::wire::Response) + payload;
}

// Posts `requests` with one doorbell while the target's progress thread cannot read, waits
// until their `bytes` frames are all in the target's socket (waiting until they are in flight is
// not enough: the sender's kernel holds back what a fresh connection's receive window, 64 KiB,
// does not admit before the receiver reads), then lets the target read them, in one turn.
// With `answers` (bytes), the initiator's progress thread is held in turn until the target's
// answers, that many bytes, are all in its socket, so that it too reads them in one turn.
inline void post_arriving_together(DevicePair& pair, const mlx5::SendWorkRequest* requests, std::uint32_t count,
                                   std::size_t bytes, std::size_t answers = 0) {
    soft::DeviceCore& target = pair.target_device->core();
    std::unique_lock held(target.mutex);
    REQUIRE(pair.initiator.post(requests, count) == mlx5::PostResult::ok);
    REQUIRE(eventually([&] { return requests_in_flight(*pair.initiator_device) == count; }));
    const bool arrived = eventually([&] { return target.unread_request_bytes() == bytes; });
    INFO("bytes in the target's sockets: " << target.unread_request_bytes() << " of " << bytes);
    REQUIRE(arrived);
    if (answers == 0) return;
    soft::DeviceCore& initiator = pair.initiator_device->core();
    const std::unique_lock initiator_held(initiator.mutex);
    held.unlock();
    const bool answered = eventually([&] { return initiator.unread_response_bytes() == answers; });
    INFO("bytes in the initiator's sockets: " << initiator.unread_response_bytes() << " of " << answers);
    REQUIRE(answered);
}

// kWrites RDMA writes of kBytes each, write w (wr_id 100 + w) from the initiator's buffer at
// w * kBytes, filled with w + 1, to the same place in the target's, cleared. Sixteen frames well
// inside the 64 KiB a fresh connection's receive window admits before the receiver reads: all
// arrive while the target's thread is held (4 KiB writes did not).
struct WriteBurst {
    static constexpr std::uint32_t kWrites = 16;
    static constexpr std::uint32_t kBytes = 2048;
    static constexpr std::uint64_t kFirstWrId = 100;
    mlx5::ScatterGatherElement sources[kWrites];
    mlx5::SendWorkRequest writes[kWrites];

    explicit WriteBurst(DevicePair& pair) {
        std::memset(pair.target.buffer(), 0, kWrites * kBytes);
        for (std::uint32_t w = 0; w < kWrites; ++w) {
            std::memset(pair.initiator.buffer() + w * kBytes, static_cast<int>(w + 1), kBytes);
            sources[w] = pair.initiator.local(w * kBytes, kBytes);
            writes[w] = write_request(kFirstWrId + w, &sources[w], pair.remote.buffer_addr + w * kBytes, pair.remote.rkey);
        }
    }
    // Posts them to arrive together, then waits for their completions: successful, in order.
    void post_and_complete(DevicePair& pair) {
        post_arriving_together(pair, writes, kWrites, kWrites * frame_bytes(kBytes));
        const std::vector<mlx5::CompletionOpcode> all_writes(kWrites, mlx5::CompletionOpcode::rdma_write);
        expect_send_completions(pair.initiator, kFirstWrId, all_writes);
        soft::acquire_remote_writes();
    }
};

}  // namespace rdmachan::test
