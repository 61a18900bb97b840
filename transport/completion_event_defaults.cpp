// Completion events for CQs whose device gives none: no descriptor, and an arm that never
// succeeds, so a waiter keeps polling.
#include "transport/device_interface.hpp"

namespace rdmachan::transport {

int CompletionQueue::event_descriptor() const noexcept { return -1; }
bool CompletionQueue::arm() noexcept { return false; }
void CompletionQueue::take_event() noexcept {}

}  // namespace rdmachan::transport
