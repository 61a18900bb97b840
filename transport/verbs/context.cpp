#include "transport/verbs/context.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "transport/verbs/device_list.hpp"
#include "transport/verbs/verbs_error.hpp"

namespace rdmachan::verbs {

namespace {

GidType gid_type_from_verbs(std::uint32_t type) {
    switch (type) {
        case IBV_GID_TYPE_ROCE_V1:
            return GidType::roce_v1;
        case IBV_GID_TYPE_ROCE_V2:
            return GidType::roce_v2;
        default:
            return GidType::infiniband;
    }
}

}  // namespace

std::shared_ptr<Context> Context::open(std::string_view device_name) {
    DeviceList list;
    ibv_device* device = list.find(device_name);
    if (device == nullptr) {
        const std::string known =
            list.empty() ? list.empty_reason() : fmt::format("{}", fmt::join(list.names(), ", "));
        throw VerbsError(fmt::format("open device '{}': no such verbs device (available: {})",
                                     device_name, known),
                         ENODEV);
    }
    errno = 0;
    ibv_context* context = ibv_open_device(device);
    if (context == nullptr)
        throw_from_errno("ibv_open_device", fmt::format("device '{}'", device_name));
    // The list may be freed once the device is open (libibverbs keeps the device referenced).
    return std::shared_ptr<Context>(new Context(context, std::string(device_name)));
}

Context::Context(ibv_context* context, std::string name)
    : context_(context), name_(std::move(name)) {
    const int return_code = ibv_query_device(context_, &device_attributes_);
    if (return_code != 0) {
        ibv_close_device(context_);
        check_return_code(return_code, "ibv_query_device", fmt::format("device '{}'", name_));
    }
    port_count_ = device_attributes_.phys_port_cnt;
}

Context::~Context() {
    ibv_close_device(context_);
}

PortAttributes Context::query_port(std::uint8_t port_num) const {
    if (port_num == 0 || port_num > port_count_) {
        throw VerbsError(fmt::format("query port {} on device '{}': ports are 1..{}", port_num,
                                     name_, port_count_),
                         EINVAL);
    }
    ibv_port_attr attributes{};
    check_return_code(ibv_query_port(context_, port_num, &attributes), "ibv_query_port",
                      fmt::format("device '{}' port {}", name_, port_num));
    PortAttributes port;
    port.port_num = port_num;
    port.active = attributes.state == IBV_PORT_ACTIVE;
    port.lid = attributes.lid;
    port.active_mtu = mtu_to_bytes(attributes.active_mtu);
    port.max_mtu = mtu_to_bytes(attributes.max_mtu);
    port.link_layer = attributes.link_layer == IBV_LINK_LAYER_ETHERNET     ? LinkLayer::ethernet
                      : attributes.link_layer == IBV_LINK_LAYER_INFINIBAND ? LinkLayer::infiniband
                                                                           : LinkLayer::unspecified;
    port.gid_table_length = static_cast<std::uint32_t>(attributes.gid_tbl_len);
    port.gid_table = query_gid_table(port_num, port.gid_table_length);
    return port;
}

std::vector<GidEntry> Context::query_gid_table(std::uint8_t port_num,
                                               std::uint32_t table_length) const {
    std::vector<GidEntry> table;
    if (table_length == 0) return table;
    // The whole table covers every port of the device; keep this port's entries.
    const std::size_t capacity = static_cast<std::size_t>(table_length) * port_count_;
    std::vector<ibv_gid_entry> entries(capacity);
    const ssize_t count = ibv_query_gid_table(context_, entries.data(), entries.size(), 0);
    if (count >= 0) {
        for (ssize_t i = 0; i < count; ++i) {
            const ibv_gid_entry& entry = entries[static_cast<std::size_t>(i)];
            if (entry.port_num != port_num) continue;
            GidEntry gid{entry.gid_index, {}, gid_type_from_verbs(entry.gid_type)};
            std::memcpy(gid.gid.data(), entry.gid.raw, gid.gid.size());
            table.push_back(gid);
        }
    } else {
        // Older kernels lack the table query; ask entry by entry. ENODATA marks an empty slot.
        for (std::uint32_t index = 0; index < table_length; ++index) {
            ibv_gid_entry entry{};
            const int return_code = ibv_query_gid_ex(context_, port_num, index, &entry, 0);
            if (return_code == ENODATA || return_code == -ENODATA) continue;
            check_return_code(
                return_code, "ibv_query_gid_ex",
                fmt::format("device '{}' port {} GID index {}", name_, port_num, index));
            GidEntry gid{index, {}, gid_type_from_verbs(entry.gid_type)};
            std::memcpy(gid.gid.data(), entry.gid.raw, gid.gid.size());
            table.push_back(gid);
        }
    }
    std::sort(table.begin(), table.end(),
              [](const GidEntry& a, const GidEntry& b) { return a.index < b.index; });
    return table;
}

}  // namespace rdmachan::verbs
