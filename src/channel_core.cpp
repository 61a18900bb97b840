#include "src/channel_core.hpp"

#include <cstdlib>
#include <cstring>
#include <mutex>
#include <random>
#include <thread>

#include "src/logger.hpp"

namespace rdmachan {

// Builds MemoryRegion values (their constructor is private to keep them honest).
class ChannelCoreAccess {
public:
    static MemoryRegion make(std::shared_ptr<void> owner, void* data, std::size_t length, std::uint32_t lkey,
                             std::uint32_t rkey) {
        return MemoryRegion(std::move(owner), data, length, lkey, rkey);
    }
};

namespace detail {
namespace {

// One software device per process, shared by its channels (like one NIC): created on first
// use, gone when the last channel is.
std::shared_ptr<soft::Device> process_soft_device() {
    static std::mutex mutex;
    static std::weak_ptr<soft::Device> cached;
    std::lock_guard lock(mutex);
    std::shared_ptr<soft::Device> device = cached.lock();
    if (device == nullptr) {
        soft::DeviceOptions options;
        if (const char* address = std::getenv("RDMACHAN_SOFT_ADDRESS")) options.address = address;
        device = soft::Device::open(options);
        cached = device;
    }
    return device;
}

std::shared_ptr<soft::Device> select_device(const std::string& name) {
    if (name == "soft") return process_soft_device();
    if (name == "auto") {
        logger().info("device auto: software mlx5 device (no verbs provider is built into this version)");
        return process_soft_device();
    }
    throw Error("ChannelBuilder::device: device '" + name +
                "' cannot be opened: only 'auto' and 'soft' are available until the verbs provider lands");
}

std::uint32_t access_flags(Access access) {
    const auto bits = static_cast<std::uint32_t>(access);
    std::uint32_t flags = 0;
    if ((bits & static_cast<std::uint32_t>(Access::local_write)) != 0) flags |= soft::kLocalWrite;
    if ((bits & static_cast<std::uint32_t>(Access::remote_write)) != 0) flags |= soft::kRemoteWrite;
    if ((bits & static_cast<std::uint32_t>(Access::remote_read)) != 0) flags |= soft::kRemoteRead;
    if ((bits & static_cast<std::uint32_t>(Access::remote_atomic)) != 0) flags |= soft::kRemoteAtomic;
    return flags;
}

constexpr std::uint8_t kStatusGeneralError = 21;
constexpr std::uint8_t kStatusLocalLengthError = 1;

}  // namespace

ChannelCore::ChannelCore(const ChannelSettings& settings) : settings_(settings) {
    device_ = select_device(settings.device);
    domain_ = device_->allocate_protection_domain();
    send_cq_ = device_->create_completion_queue(settings.cq_entries);
    receive_cq_ = device_->create_completion_queue(settings.cq_entries);
    soft::QueuePairInit init;
    init.send_cq = send_cq_;
    init.recv_cq = receive_cq_;
    init.capabilities = {settings.max_send_wr, settings.max_recv_wr, settings.max_send_sge, settings.max_recv_sge,
                         settings.max_inline_data};
    queue_pair_ = device_->create_queue_pair(domain_, init);
    queue_pair_->modify_to_init(settings.port, access_flags(settings.access));

    const mlx5::SendQueueRing& send_ring = queue_pair_->send_ring();
    send_wr_ids_.resize(send_ring.wqe_count);
    send_wqe_ends_.resize(send_ring.wqe_count);
    mlx5::SendQueueConfig config;
    config.max_sge = settings.max_send_sge;
    config.max_inline_data = settings.max_inline_data;
    send_ = mlx5::SendQueue(send_ring, {send_wr_ids_.data(), send_wqe_ends_.data(), 0, 0}, config);
    receive_wr_ids_.resize(queue_pair_->receive_ring().wqe_count);
    receive_ = mlx5::ReceiveQueue(queue_pair_->receive_ring(), receive_wr_ids_.data(), {});
    send_completions_ = mlx5::CompletionQueue(send_cq_->ring());
    receive_completions_ = mlx5::CompletionQueue(receive_cq_->ring());
    target_.send = &send_.tracking();
    target_.send_wqe_count = send_ring.wqe_count;
    target_.receive = &receive_;

    // One slot per WQE the rings can hold: every outstanding operation has its place.
    const std::uint32_t capacity = send_ring.wqe_count + queue_pair_->receive_ring().wqe_count;
    slots_.resize(capacity);
    free_slots_.reserve(capacity);
    for (std::uint32_t slot = capacity; slot-- > 0;) free_slots_.push_back(slot);

    const auto gid = device_->gid();
    local_.gid = gid;
    local_.lid = device_->lid();
    local_.qpn = queue_pair_->qpn();
    local_.psn = settings.psn.has_value() ? *settings.psn : (std::random_device{}() & 0xffffff);
    local_.mtu = settings.mtu;
    local_.device = device_->name();
}

ChannelCore::~ChannelCore() {
    // Nothing may be left in the NIC's hands when the buffers go away.
    if (outstanding_ != 0) fail_and_flush("channel destroyed with work outstanding");
}

MemoryRegion ChannelCore::register_memory(void* data, std::size_t length, Access access) {
    try {
        std::shared_ptr<soft::MemoryRegion> region = device_->register_memory(domain_, data, length, access_flags(access));
        const std::uint32_t lkey = region->lkey();
        const std::uint32_t rkey = region->rkey();
        return ChannelCoreAccess::make(std::move(region), data, length, lkey, rkey);
    } catch (const soft::SoftDeviceError& error) {
        throw Error(std::string("register_memory on ") + device_->name() + ": " + error.what());
    }
}

void ChannelCore::connect(const ChannelEndpoint& remote) {
    remote_ = remote;
    peer_ = remote.device.empty() ? "peer qpn " + std::to_string(remote.qpn)
                                  : remote.device + " qpn " + std::to_string(remote.qpn);
    soft::ReadyToReceiveAttributes receive;
    receive.remote.gid = remote.gid;
    receive.remote.lid = remote.lid;
    receive.remote.qpn = remote.qpn;
    receive.rq_psn = remote.psn;
    receive.path_mtu_bytes = std::min(settings_.mtu, remote.mtu);
    receive.max_dest_rd_atomic = settings_.max_rd_atomic;
    receive.min_rnr_timer = settings_.min_rnr_timer;
    soft::ReadyToSendAttributes send;
    send.sq_psn = local_.psn;
    send.timeout = settings_.ack_timeout;
    send.retry_cnt = settings_.retry_count;
    send.rnr_retry = settings_.rnr_retry;
    send.max_rd_atomic = settings_.max_rd_atomic;
    try {
        queue_pair_->modify_to_ready_to_receive(receive);
        queue_pair_->modify_to_ready_to_send(send);
    } catch (const soft::SoftDeviceError& error) {
        throw Error("handshake with " + peer_ + ": " + error.what());
    }
}

std::uint64_t ChannelCore::claim_slot(Operation operation) {
    // Both rings have fewer WQEs than there are slots, so a slot is free whenever a post can
    // succeed; waiting for one is waiting for the ring.
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    while (free_slots_.empty()) {
        poll_once();
        if (std::chrono::steady_clock::now() >= until) return ~0ull;
        backoff(round);
    }
    const std::uint32_t slot = free_slots_.back();
    free_slots_.pop_back();
    Slot& entry = slots_[slot];
    entry.state = SlotState::pending;
    entry.operation = operation;
    entry.post_failed = false;
    entry.scope = 0;
    ++outstanding_;
    return static_cast<std::uint64_t>(entry.generation) << 32 | slot;
}

void ChannelCore::release(std::uint32_t slot) {
    Slot& entry = slots_[slot];
    entry.state = SlotState::free;
    ++entry.generation;  // a stale ticket can never take the next operation's completion
    free_slots_.push_back(slot);
}

ChannelCore::Slot* ChannelCore::slot_for(std::uint64_t ticket) {
    const std::uint32_t slot = static_cast<std::uint32_t>(ticket);
    if (slot >= slots_.size()) return nullptr;
    Slot& entry = slots_[slot];
    if (entry.generation != static_cast<std::uint32_t>(ticket >> 32) || entry.state == SlotState::free) return nullptr;
    return &entry;
}

std::uint64_t ChannelCore::fail_immediately(std::uint64_t ticket, std::uint8_t status) {
    Slot& entry = slots_[static_cast<std::uint32_t>(ticket)];
    entry.state = SlotState::done;
    entry.post_failed = true;
    entry.completion = {};
    entry.completion.status = static_cast<mlx5::CompletionStatus>(status);
    --outstanding_;
    return ticket;
}

std::uint64_t ChannelCore::post_send_request(mlx5::SendWorkRequest& request, Operation operation) {
    const std::uint64_t ticket = claim_slot(operation);
    if (ticket == ~0ull) return ticket;
    request.wr_id = ticket;
    request.flags |= mlx5::kSendSignaled;
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    while (true) {
        const mlx5::PostResult result = send_.post(&request, 1, nullptr);
        if (result == mlx5::PostResult::ok) break;
        if (result != mlx5::PostResult::queue_full || std::chrono::steady_clock::now() >= until) {
            return fail_immediately(ticket, result == mlx5::PostResult::queue_full ? kStatusGeneralError : kStatusLocalLengthError);
        }
        poll_once();  // backpressure: completions free the ring
        backoff(round);
    }
    queue_pair_->ring_send_doorbell();
    return ticket;
}

std::uint64_t ChannelCore::post_receive_request(const LocalSlice& local) {
    const std::uint64_t ticket = claim_slot(Operation::receive);
    if (ticket == ~0ull) return ticket;
    const mlx5::ScatterGatherElement element{local.addr(), local.length(), local.lkey()};
    const mlx5::ReceiveWorkRequest request{ticket, &element, 1};
    std::uint32_t round = 0;
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    while (true) {
        const mlx5::PostResult result = receive_.post(&request, 1, nullptr);
        if (result == mlx5::PostResult::ok) return ticket;
        if (result != mlx5::PostResult::queue_full || std::chrono::steady_clock::now() >= until) {
            return fail_immediately(ticket, kStatusGeneralError);
        }
        poll_once();
        backoff(round);
    }
}

bool ChannelCore::poll_once() {
    mlx5::Completion completions[16];
    auto resolve = [this](std::uint32_t qpn, std::uint32_t) {
        return qpn == local_.qpn ? &target_ : static_cast<mlx5::CompletionTarget*>(nullptr);
    };
    bool any = false;
    for (mlx5::CompletionQueue* queue : {&send_completions_, &receive_completions_}) {
        const std::uint32_t count = queue->poll(completions, 16, resolve);
        for (std::uint32_t i = 0; i < count; ++i) {
            any = true;
            if (completions[i].status != mlx5::CompletionStatus::success) healthy_ = false;
            Slot* entry = slot_for(completions[i].wr_id);
            if (entry == nullptr || entry->state != SlotState::pending) continue;  // not ours: nothing to deliver
            entry->state = SlotState::done;
            entry->completion = completions[i];
            --outstanding_;
        }
    }
    return any;
}

// Spin briefly, then yield, then sleep: 16 processes on 2 cores must all make progress.
void ChannelCore::backoff(std::uint32_t& round) const {
    ++round;
    if (round < 64) return;
    if (round < 256) {
        std::this_thread::yield();
        return;
    }
    std::this_thread::sleep_for(std::chrono::microseconds(50));
}

WorkResult ChannelCore::result_of(const Slot& slot) const {
    const mlx5::Completion& completion = slot.completion;
    if (completion.status == mlx5::CompletionStatus::success) {
        WorkCompletion work;
        work.bytes = completion.byte_len;
        if ((completion.flags & mlx5::kCompletionWithImmediate) != 0) work.immediate = completion.immediate;
        return WorkResult::success(work);
    }
    WorkError error;
    error.operation = slot.operation;
    error.status = static_cast<std::uint8_t>(completion.status);
    error.syndrome = completion.syndrome;
    error.vendor_syndrome = completion.vendor_error;
    error.peer = peer_;
    return WorkResult::failure(std::move(error));
}

std::optional<WorkResult> ChannelCore::try_take(std::uint64_t ticket) {
    Slot* entry = slot_for(ticket);
    if (entry == nullptr) return std::nullopt;
    if (entry->state != SlotState::done) poll_once();
    if (entry->state != SlotState::done) return std::nullopt;
    WorkResult result = result_of(*entry);
    release(static_cast<std::uint32_t>(ticket));
    return result;
}

WorkResult ChannelCore::wait(std::uint64_t ticket, std::chrono::milliseconds deadline) {
    Slot* entry = slot_for(ticket);
    if (entry == nullptr) {
        WorkError error;
        error.status = kStatusGeneralError;
        error.peer = peer_;
        return WorkResult::failure(error);  // posting itself timed out: no slot was ever taken
    }
    const auto until = std::chrono::steady_clock::now() + deadline;
    std::uint32_t round = 0;
    while (entry->state != SlotState::done) {
        if (poll_once()) continue;
        if (std::chrono::steady_clock::now() >= until) {
            WorkError error;
            error.operation = entry->operation;
            error.deadline_expired = true;
            error.peer = peer_;
            return WorkResult::failure(error);
        }
        backoff(round);
    }
    WorkResult result = result_of(*entry);
    release(static_cast<std::uint32_t>(ticket));
    return result;
}

void ChannelCore::fail_and_flush(const char* why) {
    logger().warn("channel to {}: moving QP {} to ERR: {}", peer_, local_.qpn, why);
    healthy_ = false;
    try {
        queue_pair_->modify_to_error();
    } catch (const std::exception& error) {
        logger().error("channel to {}: modify to ERR failed: {}", peer_, error.what());
    }
    // The device flushes everything it holds; collect those completions so no slot stays pending.
    const auto until = std::chrono::steady_clock::now() + settings_.deadline;
    std::uint32_t round = 0;
    while (outstanding_ != 0 && std::chrono::steady_clock::now() < until) {
        if (!poll_once()) backoff(round);
    }
    if (outstanding_ != 0) {
        logger().error("channel to {}: {} operations not flushed within the deadline", peer_, outstanding_);
    }
}

std::uint32_t ChannelCore::open_scope() { return next_scope_++; }

void ChannelCore::adopt(std::uint64_t ticket, std::uint32_t scope) {
    if (Slot* entry = slot_for(ticket)) entry->scope = scope;
}

ChannelCore::DrainReport ChannelCore::close_scope(std::uint32_t scope) {
    DrainReport report;
    for (std::uint32_t slot = 0; slot < slots_.size(); ++slot) {
        Slot& entry = slots_[slot];
        if (entry.state == SlotState::free || entry.scope != scope) continue;
        ++report.unpolled;
        const std::uint64_t ticket = static_cast<std::uint64_t>(entry.generation) << 32 | slot;
        WorkResult result = wait(ticket, settings_.deadline);
        if (!result.ok() && result.error().deadline_expired) {
            if (!report.failure.has_value()) report.failure = result.error();
            fail_and_flush("a scope's work did not complete before the deadline");
            if (slot_for(ticket) != nullptr) release(slot);
        }
    }
    return report;
}

}  // namespace detail
}  // namespace rdmachan
