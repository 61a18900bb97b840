// An open verbs device. Every other verbs object keeps its Context alive (shared ownership),
// so a device is closed only after its last child is destroyed.
#pragma once

#include <infiniband/verbs.h>

#include <memory>
#include <string>
#include <string_view>

#include "transport/verbs/port.hpp"

namespace rdmachan::verbs {

class Context {
  public:
    // Throws VerbsError naming the device when it does not exist or cannot be opened; the
    // message lists the devices that do exist.
    static std::shared_ptr<Context> open(std::string_view device_name);
    ~Context();
    Context(const Context&) = delete;
    Context& operator=(const Context&) = delete;

    ibv_context* handle() const noexcept { return context_; }
    const std::string& name() const noexcept { return name_; }
    // Ports are numbered from 1.
    std::uint8_t port_count() const noexcept { return port_count_; }
    const ibv_device_attr& device_attributes() const noexcept { return device_attributes_; }

    // LID, state, active MTU, link layer and the valid GID entries with their types.
    PortAttributes query_port(std::uint8_t port_num) const;

  private:
    Context(ibv_context* context, std::string name);
    std::vector<GidEntry> query_gid_table(std::uint8_t port_num, std::uint32_t table_length) const;

    ibv_context* context_;
    std::string name_;
    ibv_device_attr device_attributes_{};
    std::uint8_t port_count_ = 0;
};

}  // namespace rdmachan::verbs
