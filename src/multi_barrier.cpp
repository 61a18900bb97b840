// MultiChannel barriers: dissemination over RDMA writes (src/multi_barrier.hpp).
#include "src/multi_barrier.hpp"

#include <atomic>
#include <thread>

#include "src/engine.hpp"
#include "src/operations.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan::detail {
namespace {

std::string rank_text(std::uint32_t rank) {
    return "rank " + std::to_string(rank);
}

}  // namespace

std::uint32_t Barrier::rounds_for(std::uint32_t world) {
    std::uint32_t rounds = 0;
    while ((1ull << rounds) < world) ++rounds;
    return rounds;
}

std::size_t Barrier::memory_bytes(std::uint32_t world) {
    return (1 + rounds_for(world) + world) * kWordBytes;
}

Barrier::Barrier(std::shared_ptr<Engine> engine, std::uint32_t rank, MemoryRegion memory)
    : engine_(std::move(engine)), rank_(rank), memory_(std::move(memory)) {
    world_ = engine_->peer_count();
    rounds_ = rounds_for(world_);
    targets_.resize(rounds_);
    remotes_.resize(rounds_);
    tickets_.assign(rounds_, kNoTicket);
    for (std::uint32_t round = 0; round < rounds_; ++round) {
        targets_[round] = static_cast<std::uint32_t>((rank_ + (1ull << round)) % world_);
    }
}

std::uint64_t* Barrier::word(std::size_t index) const {
    return static_cast<std::uint64_t*>(memory_.data()) + index;
}

void Barrier::start(const char* call, std::uint32_t scope) {
    if (running_) {
        throw Error(std::string(call) + " (rank " + std::to_string(rank_) + "): barrier " +
                    std::to_string(number_) +
                    " is still in progress (one barrier at a time: wait for it first)");
    }
    if (membership_ != nullptr) {
        start_members(call);
        scope_ = scope;
        return;
    }
    for (std::uint32_t round = 0; round < rounds_; ++round) {
        const std::uint32_t target = targets_[round];
        const RemoteRegion* found =
            regions_ == nullptr ? nullptr : regions_->find(target, kBarrierRegionName);
        if (found == nullptr) {
            throw Error(std::string(call) + " (rank " + std::to_string(rank_) + "): " +
                        rank_text(target) + " published no barrier memory ('" + kBarrierRegionName +
                        "'): barriers need the Endpoint handshake "
                        "(handshake(std::vector<Endpoint>) or connect)");
        }
        remotes_[round] = RemoteMemoryRegion{found->addr, found->length, found->rkey}.slice(
            (1 + round) * kWordBytes, kWordBytes);
    }
    ++number_;
    // Release: a peer that reads word 0 after this barrier ends sees what this rank wrote before.
    std::atomic_ref<std::uint64_t>(*word(0)).store(number_, std::memory_order_release);
    scope_ = scope;
    round_ = 0;
    posted_ = 0;
    until_ = std::chrono::steady_clock::now() + engine_->settings().deadline;
    running_ = true;
}

std::optional<BarrierResult> Barrier::take_writes() {
    for (std::uint32_t round = 0; round < posted_; ++round) {
        if (tickets_[round] == kNoTicket) continue;
        std::optional<WorkResult> result = engine_->try_take(tickets_[round]);
        if (!result.has_value()) continue;
        tickets_[round] = kNoTicket;
        if (!result->ok()) {
            BarrierFailure failure{targets_[round], "barrier " + std::to_string(number_) +
                                                        ", round " + std::to_string(round) + ": " +
                                                        result->error().message()};
            end_writes(engine_->settings().deadline / 10);
            running_ = false;
            return BarrierResult({std::move(failure)});
        }
    }
    return std::nullopt;
}

void Barrier::end_writes(std::chrono::milliseconds grace) {
    // The rounds' writes read word 0 of the barrier memory: none may stay with the device.
    for (std::uint32_t round = 0; round < posted_; ++round) {
        if (tickets_[round] == kNoTicket) continue;
        (void)take_or_flush(std::exchange(tickets_[round], kNoTicket), grace);
    }
}

std::optional<BarrierResult> Barrier::step() {
    if (!running_) return BarrierResult();
    if (membership_ != nullptr) return step_members();
    (void)engine_->poll_once();
    if (std::optional<BarrierResult> failed = take_writes()) return failed;
    const LocalSlice source = memory_.slice(0, kWordBytes);
    while (round_ < rounds_) {
        if (posted_ == round_) {
            // Round k's write goes out only once rounds 0..k-1 arrived: that is what tells
            // rank + 2^k that every rank within 2^(k+1) - 1 before it has arrived.
            const std::uint64_t ticket =
                post_write_operation(*engine_, targets_[round_], "MultiChannel::barrier", source,
                                     remotes_[round_], std::nullopt);
            if (ticket == kNoTicket) {
                end_writes(engine_->settings().deadline / 10);
                running_ = false;
                return BarrierResult({{targets_[round_], "barrier " + std::to_string(number_) +
                                                             ", round " + std::to_string(round_) +
                                                             ": " + kNoSlotReason}});
            }
            tickets_[round_] = ticket;
            ++posted_;
        }
        // The word only grows (each barrier writes a larger number), so a write from a later
        // barrier also says this one's round arrived. An aligned 8-byte RDMA write lands whole.
        if (std::atomic_ref<std::uint64_t>(*word(1 + round_)).load(std::memory_order_acquire) <
            number_) {
            return std::nullopt;
        }
        ++round_;
    }
    if (std::optional<BarrierResult> failed = take_writes()) return failed;
    for (std::uint32_t round = 0; round < rounds_; ++round) {
        if (tickets_[round] != kNoTicket) return std::nullopt;
    }
    running_ = false;
    return BarrierResult();
}

BarrierResult Barrier::finish() {
    std::uint32_t polls = 0;
    while (true) {
        if (std::optional<BarrierResult> result = step()) return std::move(*result);
        if (std::chrono::steady_clock::now() >= until_) {
            return membership_ != nullptr ? give_up_members() : give_up();
        }
        backoff(polls);
    }
}

void Barrier::backoff(std::uint32_t& polls) const {
    // The words arrive in memory, with no completion to sleep on: spin, then yield, then sleep.
    const ChannelSettings& settings = engine_->settings();
    ++polls;
    if (polls <= settings.spin_polls) return;
    if (polls <= settings.spin_polls + settings.yield_polls) {
        std::this_thread::yield();
        return;
    }
    std::this_thread::sleep_for(settings.sleep);
}

WorkResult Barrier::take_or_flush(std::uint64_t ticket, std::chrono::milliseconds grace) {
    WorkResult result = engine_->wait(ticket, grace);
    if (!result.ok() && result.error().deadline_expired) {
        if (std::optional<std::uint32_t> peer = engine_->peer_of(ticket)) {
            engine_->fail_and_flush(
                *peer, "a barrier's write or read did not complete before the deadline");
        }
        (void)engine_->try_take(ticket);
    }
    return result;
}

// The deadline passed. Who is missing is not known here: rank - 2^k may itself wait for
// someone. Each peer's word 0 says how far it got; one read each finds the ranks that did not
// arrive (or whose process does not answer).
BarrierResult Barrier::give_up() {
    // The writes and reads below share one grace period: a tenth of the deadline in all.
    const auto grace_ends =
        std::chrono::steady_clock::now() +
        std::max(engine_->settings().deadline / 10, std::chrono::milliseconds(1));
    const auto grace = [&grace_ends] {
        const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
            grace_ends - std::chrono::steady_clock::now());
        return std::max(left, std::chrono::milliseconds(1));
    };
    const std::string barrier = "barrier " + std::to_string(number_);
    std::vector<BarrierFailure> failures;
    for (std::uint32_t round = 0; round < posted_; ++round) {
        if (tickets_[round] == kNoTicket) continue;
        WorkResult result = take_or_flush(std::exchange(tickets_[round], kNoTicket), grace());
        if (!result.ok())
            failures.push_back({targets_[round], barrier + ", round " + std::to_string(round) +
                                                     ": " + result.error().message()});
    }
    std::vector<std::uint64_t> reads(world_, kNoTicket);
    for (std::uint32_t peer = 0; peer < world_; ++peer) {
        if (peer == rank_ || regions_ == nullptr || !engine_->healthy(peer)) continue;
        const RemoteRegion* found = regions_->find(peer, kBarrierRegionName);
        if (found == nullptr) continue;
        const LocalSlice into = memory_.slice((1 + rounds_ + peer) * kWordBytes, kWordBytes);
        *word(1 + rounds_ + peer) = 0;
        reads[peer] = post_read_operation(
            *engine_, peer, "MultiChannel::barrier", into,
            RemoteMemoryRegion{found->addr, found->length, found->rkey}.slice(0, kWordBytes));
        if (reads[peer] == kNoTicket) {
            failures.push_back({peer, barrier + ": its progress could not be read: " +
                                          kNoSlotReason});
        }
    }
    for (std::uint32_t peer = 0; peer < world_; ++peer) {
        if (peer == rank_) continue;
        bool named = false;
        for (const BarrierFailure& failure : failures) named = named || failure.peer == peer;
        if (named) continue;
        if (!engine_->healthy(peer) && reads[peer] == kNoTicket) {
            failures.push_back(
                {peer, "did not arrive at " + barrier + ": its queue pair failed earlier"});
            continue;
        }
        if (reads[peer] == kNoTicket) continue;
        WorkResult result = take_or_flush(reads[peer], grace());
        if (!result.ok()) {
            failures.push_back({peer, "did not arrive at " + barrier +
                                          " and does not answer (its process may be gone): " +
                                          result.error().message()});
            continue;
        }
        const std::uint64_t reached = std::atomic_ref<std::uint64_t>(*word(1 + rounds_ + peer))
                                          .load(std::memory_order_acquire);
        if (reached < number_) {
            failures.push_back({peer, "did not arrive at " + barrier + " within " +
                                          std::to_string(engine_->settings().deadline.count()) +
                                          " ms (it is at barrier " + std::to_string(reached) +
                                          ")"});
        }
    }
    if (failures.empty() && round_ < rounds_) {
        // Everyone arrived, yet round k's word did not come: name whom it should have come from.
        const auto source =
            static_cast<std::uint32_t>((rank_ + world_ - (1ull << round_) % world_) % world_);
        failures.push_back({source, barrier + ", round " + std::to_string(round_) +
                                        ": its write did not arrive within " +
                                        std::to_string(engine_->settings().deadline.count()) +
                                        " ms"});
    }
    running_ = false;
    return BarrierResult(std::move(failures));
}

}  // namespace rdmachan::detail
