// Channel, its builder and prepared form, scopes and pending work: the public face of
// the engine (src/engine.hpp) with one peer.
#include "rdmachan/channel.hpp"

#include <exception>
#include <utility>

#include "src/engine.hpp"
#include "src/operations.hpp"
#include "src/settings_environment.hpp"
#include "common/logger.hpp"
#include "transport/mlx5/completion.hpp"

namespace rdmachan {
namespace {

template <typename Value>
void check_range(const char* setting, Value value, std::uint64_t low, std::uint64_t high) {
    const auto number = static_cast<std::uint64_t>(value);
    if (number < low || number > high) {
        throw Error(std::string("ChannelBuilder::") + setting + ": " + std::to_string(number) + " is out of range [" +
                    std::to_string(low) + ", " + std::to_string(high) + "]");
    }
}

}  // namespace

// ---- errors ---------------------------------------------------------------------------------

const char* to_string(Operation operation) {
    switch (operation) {
        case Operation::send: return "send";
        case Operation::send_with_immediate: return "send with immediate";
        case Operation::receive: return "receive";
        case Operation::rdma_write: return "RDMA write";
        case Operation::rdma_write_with_immediate: return "RDMA write with immediate";
        case Operation::rdma_read: return "RDMA read";
        case Operation::atomic_fetch_and_add: return "atomic fetch-and-add";
        case Operation::atomic_compare_and_swap: return "atomic compare-and-swap";
        case Operation::batch: return "batch";
    }
    return "operation";
}

std::string WorkError::message() const {
    if (cancelled) {
        return std::string(to_string(operation)) + (peer.empty() ? "" : " with " + peer) +
               ": its wait was cancelled (the operation stays posted until its completion)";
    }
    std::string text = std::string(to_string(operation)) + " with " + peer + " failed: ";
    if (deadline_expired) return text + "no completion before the deadline";
    if (not_posted != nullptr) return text + "it could not be posted: " + not_posted;
    char detail[64];
    std::snprintf(detail, sizeof detail, " (status %u, syndrome 0x%02x, vendor syndrome 0x%02x)", status, syndrome,
                  vendor_syndrome);
    return text + mlx5::to_string(static_cast<mlx5::CompletionStatus>(status)) + detail;
}

// ---- endpoints ------------------------------------------------------------------------------

void to_json(nlohmann::json& json, const ChannelEndpoint& endpoint) {
    static const char digits[] = "0123456789abcdef";
    std::string gid;
    for (std::uint8_t byte : endpoint.gid) {
        gid += digits[byte >> 4];
        gid += digits[byte & 0xf];
    }
    json = {{"gid", gid}, {"lid", endpoint.lid}, {"qpn", endpoint.qpn}, {"psn", endpoint.psn},
            {"mtu", endpoint.mtu}, {"device", endpoint.device}};
}

void from_json(const nlohmann::json& json, ChannelEndpoint& endpoint) {
    auto field = [&](const char* name) -> const nlohmann::json& {
        if (!json.is_object() || !json.contains(name)) throw Error(std::string("channel endpoint: field '") + name + "' is missing");
        return json.at(name);
    };
    auto number = [&](const char* name, std::uint64_t high) {
        const nlohmann::json& value = field(name);
        if (!value.is_number_unsigned()) {
            throw Error(std::string("channel endpoint: field '") + name + "' = " + value.dump() + " is not a non-negative integer");
        }
        const auto result = value.get<std::uint64_t>();
        if (result > high) {
            throw Error(std::string("channel endpoint: field '") + name + "' = " + std::to_string(result) +
                        " is out of range (at most " + std::to_string(high) + ")");
        }
        return result;
    };
    const nlohmann::json& gid = field("gid");
    if (!gid.is_string() || gid.get<std::string>().size() != 32) {
        throw Error("channel endpoint: field 'gid' = " + gid.dump() + " is not 32 hex digits");
    }
    const std::string text = gid.get<std::string>();
    for (std::size_t i = 0; i < 16; ++i) {
        auto nibble = [&](char c) -> int {
            if (c >= '0' && c <= '9') return c - '0';
            if (c >= 'a' && c <= 'f') return c - 'a' + 10;
            if (c >= 'A' && c <= 'F') return c - 'A' + 10;
            throw Error("channel endpoint: field 'gid' = \"" + text + "\" has a character that is not hex");
        };
        endpoint.gid[i] = static_cast<std::uint8_t>(nibble(text[2 * i]) << 4 | nibble(text[2 * i + 1]));
    }
    endpoint.lid = static_cast<std::uint16_t>(number("lid", 0xffff));
    endpoint.qpn = static_cast<std::uint32_t>(number("qpn", 0xffffff));
    endpoint.psn = static_cast<std::uint32_t>(number("psn", 0xffffff));
    endpoint.mtu = static_cast<std::uint32_t>(number("mtu", 4096));
    if (endpoint.mtu != 256 && endpoint.mtu != 512 && endpoint.mtu != 1024 && endpoint.mtu != 2048 && endpoint.mtu != 4096) {
        throw Error("channel endpoint: field 'mtu' = " + std::to_string(endpoint.mtu) + " is not 256, 512, 1024, 2048 or 4096");
    }
    if (endpoint.qpn == 0) throw Error("channel endpoint: field 'qpn' = 0 is not a queue pair number");
    endpoint.device = json.contains("device") && json.at("device").is_string() ? json.at("device").get<std::string>() : "";
}

// ---- builder --------------------------------------------------------------------------------

ChannelBuilder::ChannelBuilder() : settings_(detail::settings_from_environment()) {}

ChannelBuilder::ChannelBuilder(ChannelSettings settings) : settings_(std::move(settings)) {}

ChannelBuilder& ChannelBuilder::device(std::string name) {
    if (name.empty()) throw Error("ChannelBuilder::device: the device name is empty");
    settings_.device = std::move(name);
    return *this;
}
ChannelBuilder& ChannelBuilder::cq_entries(std::uint32_t value) { check_range("cq_entries", value, 2, 1u << 20); settings_.cq_entries = value; return *this; }
ChannelBuilder& ChannelBuilder::max_send_wr(std::uint32_t value) { check_range("max_send_wr", value, 1, 32768); settings_.max_send_wr = value; return *this; }
ChannelBuilder& ChannelBuilder::max_recv_wr(std::uint32_t value) { check_range("max_recv_wr", value, 1, 32768); settings_.max_recv_wr = value; return *this; }
ChannelBuilder& ChannelBuilder::max_send_sge(std::uint32_t value) { check_range("max_send_sge", value, 1, 30); settings_.max_send_sge = value; return *this; }
ChannelBuilder& ChannelBuilder::max_recv_sge(std::uint32_t value) { check_range("max_recv_sge", value, 1, 30); settings_.max_recv_sge = value; return *this; }
ChannelBuilder& ChannelBuilder::max_inline_data(std::uint32_t value) { check_range("max_inline_data", value, 0, 912); settings_.max_inline_data = value; return *this; }
ChannelBuilder& ChannelBuilder::mtu(std::uint32_t bytes) {
    if (bytes != 256 && bytes != 512 && bytes != 1024 && bytes != 2048 && bytes != 4096) {
        throw Error("ChannelBuilder::mtu: " + std::to_string(bytes) + " bytes is not 256, 512, 1024, 2048 or 4096");
    }
    settings_.mtu = bytes;
    return *this;
}
ChannelBuilder& ChannelBuilder::ack_timeout(std::uint8_t value) { check_range("ack_timeout", value, 0, 31); settings_.ack_timeout = value; return *this; }
ChannelBuilder& ChannelBuilder::retry_count(std::uint8_t value) { check_range("retry_count", value, 0, 7); settings_.retry_count = value; return *this; }
ChannelBuilder& ChannelBuilder::rnr_retry(std::uint8_t value) { check_range("rnr_retry", value, 0, 7); settings_.rnr_retry = value; return *this; }
ChannelBuilder& ChannelBuilder::min_rnr_timer(std::uint8_t value) { check_range("min_rnr_timer", value, 0, 31); settings_.min_rnr_timer = value; return *this; }
ChannelBuilder& ChannelBuilder::max_rd_atomic(std::uint8_t value) { check_range("max_rd_atomic", value, 1, 16); settings_.max_rd_atomic = value; return *this; }
ChannelBuilder& ChannelBuilder::psn(std::uint32_t value) { check_range("psn", value, 0, 0xffffff); settings_.psn = value; return *this; }
ChannelBuilder& ChannelBuilder::port(std::uint8_t value) { check_range("port", value, 1, 255); settings_.port = value; return *this; }
ChannelBuilder& ChannelBuilder::gid_index(std::uint8_t value) { settings_.gid_index = value; return *this; }
ChannelBuilder& ChannelBuilder::access(Access value) { settings_.access = value; return *this; }
ChannelBuilder& ChannelBuilder::deadline(std::chrono::milliseconds value) {
    if (value.count() <= 0) throw Error("ChannelBuilder::deadline: " + std::to_string(value.count()) + " ms is not a positive deadline");
    settings_.deadline = value;
    return *this;
}

ChannelBuilder& ChannelBuilder::backoff(std::uint32_t spin_polls, std::uint32_t yield_polls, std::chrono::microseconds sleep) {
    if (sleep.count() < 0 || sleep.count() > 10000) {
        throw Error("ChannelBuilder::backoff: sleep " + std::to_string(sleep.count()) + " us is out of range [0, 10000]");
    }
    settings_.spin_polls = spin_polls;
    settings_.yield_polls = yield_polls;
    settings_.sleep = sleep;
    return *this;
}

ChannelBuilder& ChannelBuilder::wait_mode(WaitMode mode) {
    if (mode != WaitMode::spin && mode != WaitMode::adaptive && mode != WaitMode::event) {
        throw Error("ChannelBuilder::wait_mode: " + std::to_string(static_cast<int>(mode)) + " is not spin, adaptive or event");
    }
    settings_.wait = mode;
    return *this;
}

ChannelBuilder& ChannelBuilder::cqe_compression(CqeCompression value) {
    if (value != CqeCompression::off && value != CqeCompression::hash && value != CqeCompression::checksum &&
        value != CqeCompression::checksum_stride_index) {
        throw Error("ChannelBuilder::cqe_compression: " + std::to_string(static_cast<int>(value)) +
                    " is not off, hash, checksum or checksum_stride_index");
    }
    settings_.cqe_compression = value;
    return *this;
}

ChannelBuilder& ChannelBuilder::scatter_to_cqe(bool value) {
    settings_.scatter_to_cqe = value;
    return *this;
}

const char* to_string(CqeCompression compression) {
    switch (compression) {
        case CqeCompression::off: return "off";
        case CqeCompression::hash: return "hash";
        case CqeCompression::checksum: return "checksum";
        case CqeCompression::checksum_stride_index: return "checksum_stride_index";
    }
    return "unknown";
}

const char* to_string(WaitMode mode) {
    switch (mode) {
        case WaitMode::spin: return "spin";
        case WaitMode::adaptive: return "adaptive";
        case WaitMode::event: return "event";
    }
    return "unknown";
}

PreparedChannel ChannelBuilder::build() const {
    try {
        return PreparedChannel(detail::make_engine(settings_, 1));
    } catch (const Error& error) {
        throw Error(std::string("ChannelBuilder::build: ") + error.what());
    }
}

// ---- prepared channel -----------------------------------------------------------------------

PreparedChannel::PreparedChannel(std::shared_ptr<detail::Engine> core)
    : core_(std::move(core)), session_(random_session_id()) {}
PreparedChannel::PreparedChannel(PreparedChannel&&) noexcept = default;
PreparedChannel& PreparedChannel::operator=(PreparedChannel&&) noexcept = default;
PreparedChannel::~PreparedChannel() = default;

const ChannelEndpoint& PreparedChannel::endpoint() const { return core_->local_endpoint(0); }

MemoryRegion PreparedChannel::register_memory(void* data, std::size_t length, Access access) {
    return core_->register_memory(data, length, access);
}

MemoryRegion PreparedChannel::allocate_memory(std::size_t length, Access access) {
    return core_->allocate_memory(length, access);
}

Channel PreparedChannel::handshake(const ChannelEndpoint& remote) && {
    if (core_ == nullptr) throw Error("PreparedChannel::handshake: this prepared channel was already used");
    core_->connect(0, remote);
    return Channel(std::move(core_));
}

// ---- pending work ---------------------------------------------------------------------------

namespace {

// Drops a handle's reference on the engine when the handle is done with it (maybe deleting it).
struct HandleReference {
    detail::Engine* engine;
    ~HandleReference() { engine->drop_handle(); }
};

}  // namespace

PendingWork::PendingWork(PendingWork&& other) noexcept
    : engine_(std::exchange(other.engine_, nullptr)), ticket_(other.ticket_), operation_(other.operation_) {}

PendingWork& PendingWork::operator=(PendingWork&& other) noexcept {
    if (this != &other) {
        if (engine_ != nullptr) (void)wait();
        engine_ = std::exchange(other.engine_, nullptr);
        ticket_ = other.ticket_;
        operation_ = other.operation_;
    }
    return *this;
}

PendingWork::~PendingWork() {
    if (engine_ == nullptr) return;
    const WorkResult result = wait();
    if (!result.ok() && result.error().deadline_expired) {
        // wait() already moved the QP to ERR; say which handle it was.
        detail::logger().warn("pending {} dropped unfinished: {}", to_string(operation_), result.error().message());
    }
}

WorkResult PendingWork::wait() { return wait(engine_ != nullptr ? engine_->settings().deadline : std::chrono::milliseconds(0)); }

WorkResult PendingWork::wait(std::chrono::milliseconds deadline) {
    if (engine_ == nullptr) throw Error("PendingWork::wait: this handle holds no pending work (already waited for, or moved)");
    const HandleReference reference{std::exchange(engine_, nullptr)};
    detail::Engine& engine = *reference.engine;
    WorkResult result = engine.wait(ticket_, deadline);
    if (!result.ok() && result.error().deadline_expired) {
        // The NIC may still use the buffers: take them back by failing the QP and flushing.
        if (std::optional<std::uint32_t> peer = engine.peer_of(ticket_)) {
            engine.fail_and_flush(*peer, "a completion did not arrive before the deadline");
        }
        if (std::optional<WorkResult> flushed = engine.try_take(ticket_)) (void)flushed;
    }
    return result;
}

WorkResult PendingWork::flush() {
    if (engine_ == nullptr) throw Error("PendingWork::flush: this handle holds no pending work (already waited for, or moved)");
    const HandleReference reference{std::exchange(engine_, nullptr)};
    detail::Engine& engine = *reference.engine;
    if (std::optional<WorkResult> result = engine.try_take(ticket_)) return std::move(*result);
    const std::optional<std::uint32_t> peer = engine.peer_of(ticket_);
    if (peer.has_value()) engine.fail_and_flush(*peer, "work given up unfinished (PendingWork::flush)");
    if (std::optional<WorkResult> flushed = engine.try_take(ticket_)) return std::move(*flushed);
    // The device did not flush it within the deadline (fail_and_flush logged it).
    WorkError error;
    error.operation = operation_;
    error.status = static_cast<std::uint8_t>(mlx5::CompletionStatus::work_request_flushed);
    if (peer.has_value()) error.peer = engine.peer_name(*peer);
    return WorkResult::failure(std::move(error));
}

// The completion's delivery that scripts/instruction_counts.sh counts: Engine::ready and
// take_ready are inlined, the result is built in the return value, and the handle lets go of
// the engine with a plain decrement once it is built.
std::optional<WorkResult> PendingWork::poll() {
    if (engine_ == nullptr) return std::nullopt;
    auto* const slot = engine_->ready(ticket_);
    if (slot == nullptr) {
        if (ticket_ == detail::kNoTicket) [[unlikely]] {
            const HandleReference reference{std::exchange(engine_, nullptr)};
            return detail::Engine::not_posted_for_want_of_a_slot();
        }
        return std::nullopt;
    }
    const HandleReference reference{std::exchange(engine_, nullptr)};
    return reference.engine->take_ready(*slot, ticket_);
}

// ---- channel --------------------------------------------------------------------------------

Channel::Channel(std::shared_ptr<detail::Engine> core) : core_(std::move(core)) {}
Channel::Channel(Channel&&) noexcept = default;
Channel& Channel::operator=(Channel&&) noexcept = default;
Channel::~Channel() = default;

MemoryRegion Channel::register_memory(void* data, std::size_t length, Access access) {
    return core_->register_memory(data, length, access);
}

MemoryRegion Channel::allocate_memory(std::size_t length, Access access) {
    return core_->allocate_memory(length, access);
}

MemoryRegion Channel::register_layout(const MemoryLayout& layout, Access access) {
    return core_->register_layout(layout, access);
}

const ChannelEndpoint& Channel::local_endpoint() const { return core_->local_endpoint(0); }
const ChannelEndpoint& Channel::remote_endpoint() const { return core_->remote_endpoint(0); }
std::string Channel::peer() const { return core_->peer_name(0); }
bool Channel::healthy() const { return core_->healthy(0); }

PendingWork Channel::post_send(const LocalSlice& local, std::optional<std::uint32_t> immediate) {
    return PendingWork(core_.get(), detail::post_send_operation(*core_, 0, local, immediate), detail::send_operation(immediate));
}

PendingWork Channel::post_receive(const LocalSlice& local) {
    return PendingWork(core_.get(), core_->post_receive(0, local), Operation::receive);
}

PendingWork Channel::post_write(const LocalSlice& local, const RemoteMemoryRegion& remote, std::optional<std::uint32_t> immediate) {
    return PendingWork(core_.get(), detail::post_write_operation(*core_, 0, "Channel::post_write", local, remote, immediate),
                       detail::write_operation(immediate));
}

PendingWork Channel::post_read(const LocalSlice& local, const RemoteMemoryRegion& remote) {
    return PendingWork(core_.get(), detail::post_read_operation(*core_, 0, "Channel::post_read", local, remote), Operation::rdma_read);
}

PendingWork Channel::post_fetch_and_add(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add) {
    return PendingWork(core_.get(), detail::post_fetch_and_add_operation(*core_, 0, "Channel::post_fetch_and_add", result, remote, add),
                       Operation::atomic_fetch_and_add);
}

PendingWork Channel::post_compare_and_swap(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t compare,
                                           std::uint64_t swap) {
    return PendingWork(core_.get(),
                       detail::post_compare_and_swap_operation(*core_, 0, "Channel::post_compare_and_swap", result, remote,
                                                               compare, swap),
                       Operation::atomic_compare_and_swap);
}

PendingWork Channel::post_batch(const WorkBatch& batch) {
    return PendingWork(core_.get(), detail::post_batch_operation(*core_, 0, "Channel::post_batch", batch), Operation::batch);
}

WorkResult Channel::execute(const WorkBatch& batch) { return post_batch(batch).wait(); }
PeerCounters Channel::counters() const { return core_->counters(0); }
std::string Channel::device_name() const { return core_->device_name(); }
bool Channel::progress() { return core_->progress(); }
int Channel::native_handle() { return core_->event_descriptor(); }
bool Channel::arm() { return core_->arm(); }

WorkResult Channel::send(const LocalSlice& local, std::optional<std::uint32_t> immediate) { return post_send(local, immediate).wait(); }
WorkResult Channel::receive(const LocalSlice& local) { return post_receive(local).wait(); }
WorkResult Channel::write(const LocalSlice& local, const RemoteMemoryRegion& remote, std::optional<std::uint32_t> immediate) {
    return post_write(local, remote, immediate).wait();
}
WorkResult Channel::read(const LocalSlice& local, const RemoteMemoryRegion& remote) { return post_read(local, remote).wait(); }
WorkResult Channel::fetch_and_add(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add) {
    return post_fetch_and_add(result, remote, add).wait();
}
WorkResult Channel::compare_and_swap(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t compare,
                                     std::uint64_t swap) {
    return post_compare_and_swap(result, remote, compare, swap).wait();
}

// ---- scopes ---------------------------------------------------------------------------------

std::uint64_t PendingWork::release_ticket() {
    std::exchange(engine_, nullptr)->drop_handle();  // the scope's channel still owns the engine
    return ticket_;
}

WorkResult ScopedWork::wait() {
    if (core_ == nullptr) throw Error("ScopedWork::wait: this handle holds no work");
    if (ticket_ != detail::kNoTicket && !core_->outstanding(ticket_)) {
        throw Error("ScopedWork::wait: this operation's completion was already taken");
    }
    WorkResult result = core_->wait(ticket_, core_->settings().deadline);
    if (!result.ok() && result.error().deadline_expired) {
        if (std::optional<std::uint32_t> peer = core_->peer_of(ticket_)) {
            core_->fail_and_flush(*peer, "a completion did not arrive before the deadline");
        }
        (void)core_->try_take(ticket_);
    }
    return result;
}

std::optional<WorkResult> ScopedWork::poll() {
    if (core_ == nullptr) return std::nullopt;
    return core_->try_take(ticket_);
}

ScopedWork Scope::adopt(PendingWork work) {
    const std::uint64_t ticket = work.release_ticket();
    channel_.core_->adopt(ticket, id_);
    return ScopedWork(channel_.core_, ticket);
}

ScopedWork Scope::post_send(const LocalSlice& local, std::optional<std::uint32_t> immediate) { return adopt(channel_.post_send(local, immediate)); }
ScopedWork Scope::post_receive(const LocalSlice& local) { return adopt(channel_.post_receive(local)); }
ScopedWork Scope::post_write(const LocalSlice& local, const RemoteMemoryRegion& remote, std::optional<std::uint32_t> immediate) {
    return adopt(channel_.post_write(local, remote, immediate));
}
ScopedWork Scope::post_read(const LocalSlice& local, const RemoteMemoryRegion& remote) { return adopt(channel_.post_read(local, remote)); }
ScopedWork Scope::post_fetch_and_add(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t add) {
    return adopt(channel_.post_fetch_and_add(result, remote, add));
}
ScopedWork Scope::post_batch(const WorkBatch& batch) { return adopt(channel_.post_batch(batch)); }

ScopedWork Scope::post_compare_and_swap(const LocalSlice& result, const RemoteMemoryRegion& remote, std::uint64_t compare,
                                        std::uint64_t swap) {
    return adopt(channel_.post_compare_and_swap(result, remote, compare, swap));
}

void Channel::scope(const std::function<void(Scope&)>& body) { run_scope(body, false); }
void Channel::manual_scope(const std::function<void(Scope&)>& body) { run_scope(body, true); }

void Channel::run_scope(const std::function<void(Scope&)>& body, bool strict) {
    Scope scope(*this, core_->open_scope());
    std::exception_ptr thrown;
    try {
        body(scope);
    } catch (...) {
        thrown = std::current_exception();
    }
    // Drain everything the body left, whatever happened in it.
    const detail::Engine::DrainReport report = core_->close_scope(scope.id_);
    if (thrown) std::rethrow_exception(thrown);
    if (report.failure.has_value()) {
        throw Error("scope drain: " + report.failure->message() + "; the QP was moved to ERR and flushed");
    }
    if (strict && report.unpolled != 0) {
        throw Error("manual_scope: " + std::to_string(report.unpolled) + " operation(s) on the channel to " + peer() +
                    " were left unpolled (drained at the end of the scope)");
    }
}

}  // namespace rdmachan
