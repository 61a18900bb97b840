// Requests sent from the doorbell thread: the thread that rings an RC QP's doorbell executes
// the new WQEs itself (the device's decoder, execute_one, on the same WQE bytes) and writes
// their request frames to the peer device's socket, instead of waking the progress thread
// through the eventfd to do the same. The progress thread keeps everything else: reading
// responses and requests, timers, retransmissions, RNR waits, errors, connecting.
//
// Why it keeps the device's behaviour:
//   - It runs only while the progress thread sleeps, under the device mutex taken by try-lock
//     (the doorbell thread never waits for the progress thread; when that thread is awake or
//     holds the lock it executes the WQEs itself, at the top of its loop).
//     Both threads advance the same cursor (`executed`) and append to the same connection output,
//     so requests leave in WQE order and a frame the progress thread queued is never overtaken.
//   - The socket is non-blocking: what the kernel does not take stays in the connection's output
//     and the progress thread writes it when the socket is writable (write_connection).
//   - Only what needs nothing else executes here: an RC QP in RTS, not waiting out an RNR NAK or
//     holding a UMR, whose peer device has an open connection (connecting may block; the
//     progress thread opens it), a WQE that decodes without a local error. A malformed WQE, an
//     error, a UMR or a loopback QP stays in the ring for the progress thread, untouched.
//   - The ACK timer: a request sent here may be the first in flight while the progress thread
//     sleeps with no deadline. A timerfd in its epoll set, armed here only when no earlier expiry
//     is armed, wakes it at that deadline (one timerfd_settime per ACK timeout at most; no wake
//     while answers come in time, which restart the timer).
#include <sys/epoll.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <mutex>

#include "transport/mlx5/barriers.hpp"
#include "transport/mlx5/byte_order.hpp"
#include "transport/mlx5/wqe_layout.hpp"
#include "transport/soft/device_core.hpp"

namespace rdmachan::soft {

using namespace rdmachan::mlx5;

bool Requester::send_from_doorbell(QueuePairContext& queue_pair) {
    if (!settings.doorbell_requests_enabled || queue_pair.transport != Transport::reliable_connected) return false;
    // An awake progress thread takes the doorbell at the top of its loop, for the price of a
    // flag; executing here instead would make it block on the mutex there (a futex wait and wake
    // per request: 26,023 futex calls in 11,000 ping-pong writes, against 47 without this test).
    if (!loop.sleeping()) return false;
    // Never wait for the progress thread: if it holds the mutex, it executes the WQEs.
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    if (queue_pair.state != QueuePairState::ready_to_send || queue_pair.waiting_rnr || queue_pair.umr_waits_for_answers ||
        queue_pair.zero_hop_waits_for_answers) {
        return false;
    }
    const RemoteQueuePair& remote = queue_pair.receive_attributes.remote;
    if (same_gid(remote.gid, gid) && remote.lid == lid) return false;  // loopback: the progress thread's queue
    Connection* connection = links.open_connection_to(remote.gid, remote.lid);
    if (connection == nullptr) return false;  // not connected yet: connecting is the progress thread's

    const bool had_in_flight = !queue_pair.in_flight.empty();
    const std::uint32_t producer = big_to_host32(load_acquire32(queue_pair.send_ring.doorbell_record + kSendDoorbell)) & 0xffff;
    // The same bound per turn as the progress thread: a long batch is left to it.
    constexpr int kWqesPerTurn = 64;
    bool all_executed = true;
    doorbell_sends_requests_ = true;
    for (int executed = 0; ((producer - queue_pair.executed) & 0xffff) != 0; ++executed) {
        // A send that failed closed the connection and failed the QP: the progress thread takes it from there.
        if (executed == kWqesPerTurn || connection->socket < 0) {
            all_executed = false;
            break;
        }
        bool left_for_progress = false;
        if (!execute_one(queue_pair, queue_pair.executed, &left_for_progress)) {
            all_executed = false;
            break;
        }
        count_one(statistics.doorbell_requests);
    }
    doorbell_sends_requests_ = false;
    // ACKs a caller's progress() left held go after this thread's answer, as they would have
    // gone before it had the caller not been the one to read the request.
    answers.send_deferred();
    if (!had_in_flight && !queue_pair.in_flight.empty() && queue_pair.state == QueuePairState::ready_to_send &&
        queue_pair.send_attributes.timeout != 0) {
        events.arm_wake_timer(queue_pair.progress_deadline);
    }
    return all_executed;
}

std::uint64_t Device::requests_from_doorbell() const { return core_->statistics.doorbell_requests.load(std::memory_order_relaxed); }

}  // namespace rdmachan::soft
