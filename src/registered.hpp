// What every copy of a MemoryRegion shares: the device's registration, how to end it early, and
// whether it was.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>

namespace rdmachan::detail {

struct Registered {
    std::shared_ptr<void> owner;        // the device's registration (and allocated memory): freed with the last copy
    std::function<void()> deregister;   // ends it now (throws rdmachan::Error on a refusal); empty for a layout
    std::atomic<bool> ended{false};     // deregister() succeeded
    std::mutex mutex;                   // one deregister() at a time
};

}  // namespace rdmachan::detail
