// The transport interface's post of one request for providers that do not specialise it.
// Out of line on purpose: defined in the header, GCC guessed at every call that this default
// was the one called and compared the vtable entry with it first, a cost for the ring family,
// which overrides it.
#include "transport/device_interface.hpp"

namespace rdmachan::transport {

mlx5::PostResult QueuePair::post_one(const mlx5::SendWorkRequest& request) noexcept {
    std::uint32_t posted = 0;
    return post_send(&request, 1, &posted);
}

}  // namespace rdmachan::transport
