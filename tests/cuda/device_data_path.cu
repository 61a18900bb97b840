// Compiles the header-only mlx5 data path as CUDA device code: kernels that post a WQE, ring
// the doorbell, poll a CQ and arm it, as a GPU-side poster would (RDMaxcel-style). There is no
// GPU on the build machines, so these kernels are compiled and never launched.
#include "transport/mlx5/completion_queue.hpp"
#include "transport/mlx5/receive_queue.hpp"
#include "transport/mlx5/send_queue.hpp"
#include "transport/mlx5/shared_receive_queue.hpp"

namespace mlx5 = rdmachan::mlx5;

__global__ void post_from_device(mlx5::SendQueue* queue, const mlx5::SendWorkRequest* requests, std::uint32_t count,
                                 std::uint32_t* posted) {
    queue->post(requests, count, posted);
}

__global__ void post_receives_from_device(mlx5::ReceiveQueue* queue, const mlx5::ReceiveWorkRequest* requests,
                                          std::uint32_t count, std::uint32_t* posted) {
    queue->post(requests, count, posted);
}

__global__ void post_shared_receives_from_device(mlx5::SharedReceiveQueue* queue,
                                                 const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                                 std::uint32_t* posted) {
    queue->post(requests, count, posted);
}

struct SingleQueueResolver {
    mlx5::CompletionTarget* target;
    __device__ mlx5::CompletionTarget* operator()(std::uint32_t, std::uint32_t) const { return target; }
};

__global__ void poll_from_device(mlx5::CompletionQueue* queue, mlx5::CompletionTarget* target,
                                 mlx5::Completion* completions, std::uint32_t capacity, std::uint32_t* count) {
    *count = queue->poll(completions, capacity, SingleQueueResolver{target});
}

// Arm a CQ from the device, then look whether a completion arrived before the arm (which may
// raise no event) before the caller waits; one event taken since the last arm.
__global__ void arm_from_device(mlx5::CompletionQueue* queue, bool solicited_only, bool event_taken,
                                bool* waiting) {
    if (event_taken) queue->event_received();
    queue->arm(solicited_only);
    *waiting = queue->completion_waiting();
}
