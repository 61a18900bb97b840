// The software device: opening it, its identity and counters, and protection domains. Each
// object it creates has its own file (object_creation.hpp lists them).
#include "transport/soft/device.hpp"

#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "common/logger.hpp"
#include "transport/soft/object_creation.hpp"

namespace rdmachan::soft {

const char* to_string(QueuePairState state) {
    switch (state) {
        case QueuePairState::reset:
            return "RESET";
        case QueuePairState::init:
            return "INIT";
        case QueuePairState::ready_to_receive:
            return "RTR";
        case QueuePairState::ready_to_send:
            return "RTS";
        case QueuePairState::error:
            return "ERR";
    }
    return "unknown";
}

std::shared_ptr<Device> Device::open(const DeviceOptions& options) {
    std::shared_ptr<Device> device(new Device());
    device->core_ = std::make_unique<DeviceCore>(*device, options);
    detail::logger().info("software mlx5 device {} opened", device->name());
    return device;
}

Device::~Device() = default;

std::array<std::uint8_t, 16> Device::gid() const {
    return core_->gid;
}
std::uint64_t Device::transfers_by_reference() const {
    return core_->statistics.transfers_by_reference.load(std::memory_order_relaxed);
}
std::uint64_t Device::connects_started() const {
    return core_->statistics.connects_started.load(std::memory_order_relaxed);
}
std::uint64_t Device::connects_failed() const {
    return core_->statistics.connects_failed.load(std::memory_order_relaxed);
}
std::uint64_t Device::answered_hellos() const {
    return core_->statistics.answered_hellos.load(std::memory_order_acquire);
}
std::uint64_t Device::zero_hop_writes() const {
    return core_->statistics.zero_hop_writes.load(std::memory_order_relaxed);
}
std::uint64_t Device::doorbells_left_to_progress() const {
    return core_->statistics.doorbells_left_to_progress.load(std::memory_order_relaxed);
}
std::uint64_t Device::zero_hop_arena_writes() const {
    return core_->statistics.zero_hop_arena_writes.load(std::memory_order_relaxed);
}
std::uint64_t Device::zero_hop_reads() const {
    return core_->statistics.zero_hop_reads.load(std::memory_order_relaxed);
}
std::uint64_t Device::zero_hop_arena_reads() const {
    return core_->statistics.zero_hop_arena_reads.load(std::memory_order_relaxed);
}
std::uint64_t Device::zero_hop_atomics() const {
    return core_->statistics.zero_hop_atomics.load(std::memory_order_relaxed);
}
std::uint64_t Device::zero_hop_receives() const {
    return core_->statistics.zero_hop_receives.load(std::memory_order_relaxed);
}
std::uint64_t Device::acknowledgements_coalesced() const {
    return core_->statistics.coalesced_acknowledgements.load(std::memory_order_relaxed);
}
std::uint64_t Device::compressed_sessions() const {
    return core_->statistics.compressed_sessions.load(std::memory_order_relaxed);
}
std::uint64_t Device::compressed_cqes() const {
    return core_->statistics.compressed_cqes.load(std::memory_order_relaxed);
}
int Device::progress() {
    return core_->progress_from_caller();
}
void Device::stop_progress() {
    core_->stop_progress_from_caller();
}
std::uint64_t Device::caller_progress_turns() const {
    return core_->statistics.caller_progress_turns.load(std::memory_order_relaxed);
}
std::uint32_t Device::zero_hop_holder(std::uint32_t key) const {
    return core_->published_table.holder_of(key);
}
std::uint32_t Device::receive_lock_holder() const {
    return core_->published_table.receive_lock_holder();
}
std::uint64_t Device::receive_lock_takeovers() const {
    return core_->published_table.receive_lock_takeovers();
}
std::uint16_t Device::lid() const {
    return core_->lid;
}

std::string Device::name() const {
    char address[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &core_->ipv4, address, sizeof address);
    return std::string("soft:") + address + ":" + std::to_string(core_->lid);
}

std::shared_ptr<ProtectionDomain> Device::allocate_protection_domain() {
    std::lock_guard lock(core_->mutex);
    return std::shared_ptr<ProtectionDomain>(
        new ProtectionDomain(shared_from_this(), core_->next_handle++));
}

ProtectionDomain::~ProtectionDomain() = default;

}  // namespace rdmachan::soft
