#include "transport/verbs/device_list.hpp"

#include <cerrno>
#include <string_view>
#include <utility>

#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

DeviceList::DeviceList() {
    int count = 0;
    errno = 0;
    devices_ = ibv_get_device_list(&count);
    if (devices_ == nullptr) {
        const int code = errno;
        empty_reason_ = "ibv_get_device_list found no RDMA device (errno " +
                        (code != 0 ? describe_error_code(code) : std::string("0")) + ")";
        return;
    }
    count_ = count > 0 ? static_cast<std::size_t>(count) : 0;
    if (count_ == 0) empty_reason_ = "ibv_get_device_list returned an empty list";
}

DeviceList::~DeviceList() {
    if (devices_ != nullptr) ibv_free_device_list(devices_);
}

DeviceList::DeviceList(DeviceList&& other) noexcept
    : devices_(std::exchange(other.devices_, nullptr)),
      count_(std::exchange(other.count_, 0)),
      empty_reason_(std::move(other.empty_reason_)) {}

DeviceList& DeviceList::operator=(DeviceList&& other) noexcept {
    if (this != &other) {
        if (devices_ != nullptr) ibv_free_device_list(devices_);
        devices_ = std::exchange(other.devices_, nullptr);
        count_ = std::exchange(other.count_, 0);
        empty_reason_ = std::move(other.empty_reason_);
    }
    return *this;
}

std::vector<std::string> DeviceList::names() const {
    std::vector<std::string> result;
    for (ibv_device* device : devices()) result.emplace_back(ibv_get_device_name(device));
    return result;
}

ibv_device* DeviceList::find(std::string_view name) const noexcept {
    for (ibv_device* device : devices()) {
        if (name == ibv_get_device_name(device)) return device;
    }
    return nullptr;
}

}  // namespace rdmachan::verbs
