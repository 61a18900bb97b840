// The list of verbs devices, owned. No RDMA device at all is a normal case: the list is then
// empty, never an error.
#pragma once

#include <infiniband/verbs.h>

#include <span>
#include <string>
#include <vector>

namespace rdmachan::verbs {

class DeviceList {
  public:
    // Never throws for "no devices": ibv_get_device_list returns NULL (errno ENOSYS when the
    // kernel has no RDMA stack, as on these build machines), which becomes an empty list.
    DeviceList();
    ~DeviceList();
    DeviceList(const DeviceList&) = delete;
    DeviceList& operator=(const DeviceList&) = delete;
    DeviceList(DeviceList&& other) noexcept;
    DeviceList& operator=(DeviceList&& other) noexcept;

    std::span<ibv_device* const> devices() const noexcept { return {devices_, count_}; }
    bool empty() const noexcept { return count_ == 0; }
    std::vector<std::string> names() const;
    // nullptr when no device has this name.
    ibv_device* find(std::string_view name) const noexcept;
    // Why the list is empty, in words (for logs); empty string when devices were found.
    const std::string& empty_reason() const noexcept { return empty_reason_; }

  private:
    ibv_device** devices_ = nullptr;  // NULL when none: ibv_free_device_list(NULL) crashes
    std::size_t count_ = 0;
    std::string empty_reason_;
};

}  // namespace rdmachan::verbs
