#include "transport/fault/fault_injection.hpp"

#include <vector>

#include "rdmachan/error.hpp"

namespace rdmachan::transport {
namespace {

std::shared_ptr<FaultPlan>& active_plan() {
    static std::shared_ptr<FaultPlan> plan;
    return plan;
}

class FaultCompletionQueue final : public CompletionQueue {
public:
    FaultCompletionQueue(std::shared_ptr<CompletionQueue> inner, std::shared_ptr<FaultPlan> plan)
        : inner_(std::move(inner)), plan_(std::move(plan)), held_(inner_->depth() + 16) {}

    std::uint32_t poll(mlx5::Completion* completions, std::uint32_t capacity) noexcept override {
        FaultPlan& plan = *plan_;
        if (plan.delay.count() == 0 && !plan.hold_until_error && held_count_ == 0) {
            const std::uint32_t count = inner_->poll(completions, capacity);
            for (std::uint32_t i = 0; i < count; ++i) corrupt(completions[i]);
            return count;
        }
        // Take what the device has into the holding ring (sized for a whole CQ), then hand out
        // what has waited long enough, oldest first.
        const auto now = std::chrono::steady_clock::now();
        mlx5::Completion fresh[16];
        const std::uint32_t room = static_cast<std::uint32_t>(held_.size()) - held_count_;
        const std::uint32_t count = inner_->poll(fresh, room < 16 ? room : 16);
        for (std::uint32_t i = 0; i < count; ++i) {
            corrupt(fresh[i]);
            const auto ready = plan.hold_until_error ? std::chrono::steady_clock::time_point::max() : now + plan.delay;
            held_[(held_first_ + held_count_++) % held_.size()] = {fresh[i], ready};
            ++plan.delayed;
        }
        std::uint32_t out = 0;
        while (out < capacity && held_count_ != 0 && (held_[held_first_].ready <= now || (plan.hold_until_error && plan.moved_to_error))) {
            completions[out++] = held_[held_first_].completion;
            held_first_ = (held_first_ + 1) % held_.size();
            --held_count_;
        }
        return out;
    }
    std::uint32_t depth() const noexcept override { return inner_->depth(); }
    const std::shared_ptr<CompletionQueue>& inner() const { return inner_; }

private:
    struct Held {
        mlx5::Completion completion;
        std::chrono::steady_clock::time_point ready;
    };
    void corrupt(mlx5::Completion& completion) noexcept {
        FaultPlan& plan = *plan_;
        if (plan.corrupt_completions == 0) return;
        if (plan.corrupt_qpn != 0 && completion.qp_num != plan.corrupt_qpn) return;
        --plan.corrupt_completions;
        ++plan.corrupted;
        completion.status = plan.corrupt_status;
        completion.syndrome = plan.corrupt_syndrome;
    }
    std::shared_ptr<CompletionQueue> inner_;
    std::shared_ptr<FaultPlan> plan_;
    std::vector<Held> held_;
    std::size_t held_first_ = 0;
    std::uint32_t held_count_ = 0;
};

class FaultQueuePair final : public QueuePair {
public:
    FaultQueuePair(std::shared_ptr<QueuePair> inner, std::shared_ptr<FaultPlan> plan)
        : inner_(std::move(inner)), plan_(std::move(plan)) {}
    std::uint32_t qpn() const noexcept override { return inner_->qpn(); }
    mlx5::PostResult post_send(const mlx5::SendWorkRequest* requests, std::uint32_t count,
                               std::uint32_t* posted) noexcept override {
        if (refuse(posted)) return plan_->refusal;
        return inner_->post_send(requests, count, posted);
    }
    mlx5::PostResult post_receive(const mlx5::ReceiveWorkRequest* requests, std::uint32_t count,
                                  std::uint32_t* posted) noexcept override {
        if (refuse(posted)) return plan_->refusal;
        return inner_->post_receive(requests, count, posted);
    }
    std::uint32_t max_send_wr() const noexcept override { return inner_->max_send_wr(); }
    std::uint32_t max_recv_wr() const noexcept override { return inner_->max_recv_wr(); }
    void connect(const ConnectSettings& settings) override { inner_->connect(settings); }
    void move_to_error() override {
        inner_->move_to_error();
        plan_->moved_to_error = true;
    }
    QueuePair& inner() const { return *inner_; }

private:
    bool refuse(std::uint32_t* posted) noexcept {
        if (plan_->refuse_posts == 0) return false;
        --plan_->refuse_posts;
        ++plan_->refused;
        if (posted != nullptr) *posted = 0;
        return true;
    }
    std::shared_ptr<QueuePair> inner_;
    std::shared_ptr<FaultPlan> plan_;
};

class FaultProtectionDomain final : public ProtectionDomain {
public:
    FaultProtectionDomain(std::shared_ptr<ProtectionDomain> inner, std::shared_ptr<FaultPlan> plan)
        : inner_(std::move(inner)), plan_(std::move(plan)) {}
    Registration register_memory(void* data, std::size_t length, std::uint32_t access) override {
        return inner_->register_memory(data, length, access);
    }
    Registration allocate_memory(std::size_t length, std::uint32_t access) override {
        return inner_->allocate_memory(length, access);
    }
    std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth) override {
        return std::make_shared<FaultCompletionQueue>(inner_->create_completion_queue(depth), plan_);
    }
    std::shared_ptr<CompletionQueue> create_completion_queue(std::uint32_t depth, CqeCompression compression) override {
        return std::make_shared<FaultCompletionQueue>(inner_->create_completion_queue(depth, compression), plan_);
    }
    std::shared_ptr<QueuePair> create_queue_pair(const QueuePairSettings& settings,
                                                 std::shared_ptr<CompletionQueue> send_queue,
                                                 std::shared_ptr<CompletionQueue> receive_queue) override {
        auto send = std::dynamic_pointer_cast<FaultCompletionQueue>(send_queue);
        auto receive = std::dynamic_pointer_cast<FaultCompletionQueue>(receive_queue);
        if (send == nullptr || receive == nullptr) throw Error("fault injection: completion queues come from another device");
        return std::make_shared<FaultQueuePair>(inner_->create_queue_pair(settings, send->inner(), receive->inner()), plan_);
    }

    // DC: initiators get the same refusals as queue pairs; their completions and the
    // target's pass through the wrapped completion queues.
    std::shared_ptr<QueuePair> create_dc_initiator(const QueuePairSettings& settings,
                                                   std::shared_ptr<CompletionQueue> send_queue) override {
        return std::make_shared<FaultQueuePair>(inner_->create_dc_initiator(settings, unwrap(send_queue)), plan_);
    }
    void recover_dc_initiator(QueuePair& initiator) override {
        inner_->recover_dc_initiator(dynamic_cast<FaultQueuePair&>(initiator).inner());
    }
    std::shared_ptr<SharedReceiveQueue> create_shared_receive_queue(std::uint32_t max_wr,
                                                                    std::shared_ptr<CompletionQueue> receive_queue) override {
        return inner_->create_shared_receive_queue(max_wr, unwrap(receive_queue));
    }
    std::shared_ptr<DcTarget> create_dc_target(std::shared_ptr<SharedReceiveQueue> shared_receive_queue,
                                               std::shared_ptr<CompletionQueue> receive_queue, std::uint64_t access_key,
                                               std::uint32_t access) override {
        return inner_->create_dc_target(std::move(shared_receive_queue), unwrap(receive_queue), access_key, access);
    }
    std::array<std::uint8_t, 48> dc_address_vector(const PortIdentity& local, const Gid& gid, std::uint16_t lid, std::uint32_t dctn,
                                                   std::uint64_t key) override {
        if (plan_->refuse_address_vectors != 0) {
            --plan_->refuse_address_vectors;
            ++plan_->refused;
            throw Error("fault injection: the address vector for DC target " + std::to_string(dctn) + " was refused");
        }
        return inner_->dc_address_vector(local, gid, lid, dctn, key);
    }

private:
    static std::shared_ptr<CompletionQueue> unwrap(const std::shared_ptr<CompletionQueue>& queue) {
        auto wrapped = std::dynamic_pointer_cast<FaultCompletionQueue>(queue);
        if (wrapped == nullptr) throw Error("fault injection: the completion queue comes from another device");
        return wrapped->inner();
    }
    std::shared_ptr<ProtectionDomain> inner_;
    std::shared_ptr<FaultPlan> plan_;
};

class FaultDevice final : public Device {
public:
    FaultDevice(std::shared_ptr<Device> inner, std::shared_ptr<FaultPlan> plan)
        : inner_(std::move(inner)), plan_(std::move(plan)) {}
    DeviceKind kind() const noexcept override { return inner_->kind(); }
    std::string name() const override { return inner_->name(); }
    PortIdentity port_identity(std::uint8_t port, std::optional<std::uint8_t> gid_index) const override {
        return inner_->port_identity(port, gid_index);
    }
    std::shared_ptr<ProtectionDomain> allocate_protection_domain() override {
        return std::make_shared<FaultProtectionDomain>(inner_->allocate_protection_domain(), plan_);
    }

private:
    std::shared_ptr<Device> inner_;
    std::shared_ptr<FaultPlan> plan_;
};

}  // namespace

std::shared_ptr<Device> make_fault_injecting_device(std::shared_ptr<Device> inner, std::shared_ptr<FaultPlan> plan) {
    return std::make_shared<FaultDevice>(std::move(inner), std::move(plan));
}

FaultInjection::FaultInjection(std::shared_ptr<FaultPlan> plan) {
    if (active_plan() != nullptr) throw Error("FaultInjection: another fault plan is active");
    active_plan() = std::move(plan);
}

FaultInjection::~FaultInjection() { active_plan().reset(); }

std::shared_ptr<FaultPlan> active_fault_plan() { return active_plan(); }

}  // namespace rdmachan::transport
