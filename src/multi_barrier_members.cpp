// Barriers among members that come and go (etcd membership): each barrier is among the members
// ready when it starts. A member writes, to every one of them, how many barriers of their
// pairing it has entered, and waits until each has written at least as many to it, or is no
// longer a member. One write per member and barrier, all posted at once: a dissemination's
// rounds would need every member to agree on who is in the barrier, which members that join and
// leave while it runs cannot.
#include <algorithm>
#include <atomic>

#include "src/engine.hpp"
#include "src/membership.hpp"
#include "src/multi_barrier.hpp"
#include "src/operations.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan::detail {
namespace {

std::string member_text(std::uint32_t member) {
    return "member " + std::to_string(member);
}

// The high half of a member's word: which pairing wrote it.
std::uint64_t pairing_half(std::uint64_t word) {
    return word & 0xffffffff00000000ull;
}

std::uint64_t member_word(std::uint64_t pairing, std::uint32_t entered) {
    return pairing_half(pairing) | entered;
}

}  // namespace

std::size_t Barrier::memory_bytes_for_members(std::uint32_t capacity) {
    return (1 + 2 * static_cast<std::size_t>(capacity)) * kWordBytes;
}

void Barrier::set_membership(std::shared_ptr<Membership> membership, MemoryRegion memory) {
    membership_ = std::move(membership);
    memory_ = std::move(memory);
    pairing_.assign(world_, 0);
    entered_.assign(world_, 0);
    member_tickets_.assign(world_, kNoTicket);
    awaited_.assign(world_, 0);
}

void Barrier::start_members(const char* call) {
    participants_.clear();
    for (std::uint32_t member = 0; member < world_; ++member) {
        if (member == rank_ || !membership_->ready(member)) continue;
        const RemoteRegion* found = regions_ == nullptr ? nullptr : regions_->find(member, kBarrierRegionName);
        if (found == nullptr || found->length < memory_bytes_for_members(world_)) {
            throw Error(std::string(call) + " (member " + std::to_string(rank_) + "): " + member_text(member) +
                        " published no barrier memory for members ('" + kBarrierRegionName + "')");
        }
        participants_.push_back(member);
    }
    for (const std::uint32_t member : participants_) {
        const std::uint64_t pairing = membership_->pair_identity(member);
        if (pairing != pairing_[member]) {
            pairing_[member] = pairing;
            entered_[member] = 0;
        }
        ++entered_[member];
        awaited_[member] = 1;
        std::atomic_ref<std::uint64_t>(*word(1 + world_ + member))
            .store(member_word(pairing, entered_[member]), std::memory_order_relaxed);
    }
    ++number_;
    std::atomic_ref<std::uint64_t>(*word(0)).store(number_, std::memory_order_release);
    member_writes_posted_ = false;
    until_ = std::chrono::steady_clock::now() + engine_->settings().deadline;
    running_ = true;
}

std::optional<BarrierResult> Barrier::step_members() {
    (void)engine_->poll_once();
    membership_->advance();  // a member that leaves or fails meanwhile is no longer waited for
    if (!member_writes_posted_) {
        member_writes_posted_ = true;
        for (const std::uint32_t member : participants_) {
            if (!membership_->ready(member)) continue;
            const RemoteRegion* found = regions_->find(member, kBarrierRegionName);
            if (found == nullptr) continue;  // it went while this barrier started
            const LocalSlice source = memory_.slice((1 + world_ + member) * kWordBytes, kWordBytes);
            const RemoteMemoryRegion into =
                RemoteMemoryRegion{found->addr, found->length, found->rkey}.slice((1 + rank_) * kWordBytes, kWordBytes);
            member_tickets_[member] = post_write_operation(*engine_, member, "MultiChannel::barrier", source, into, std::nullopt);
            if (member_tickets_[member] == kNoTicket) {
                std::vector<BarrierFailure> failures{{member, "barrier " + std::to_string(number_) + ": " + kNoSlotReason}};
                end_member_writes(engine_->settings().deadline / 10, failures);
                running_ = false;
                return BarrierResult(std::move(failures));
            }
        }
    }
    std::vector<BarrierFailure> failures;
    bool writing = false;
    bool waiting = false;
    for (const std::uint32_t member : participants_) {
        // Still a member of the same pairing: otherwise it left, failed or is being connected
        // again, and this barrier neither waits for it nor counts its write's failure.
        const bool present = membership_->ready(member) && membership_->pair_identity(member) == pairing_[member];
        if (member_tickets_[member] != kNoTicket) {
            if (std::optional<WorkResult> result = engine_->try_take(member_tickets_[member])) {
                member_tickets_[member] = kNoTicket;
                if (!result->ok() && present) {
                    failures.push_back({member, "barrier " + std::to_string(number_) + ": " + result->error().message()});
                }
            } else {
                writing = true;
            }
        }
        if (awaited_[member] == 0) continue;
        const std::uint64_t arrived = std::atomic_ref<std::uint64_t>(*word(1 + member)).load(std::memory_order_acquire);
        const bool same_pairing = pairing_half(arrived) == pairing_half(pairing_[member]);
        if (!present || (same_pairing && static_cast<std::uint32_t>(arrived) >= entered_[member])) {
            awaited_[member] = 0;
        } else {
            waiting = true;
        }
    }
    if (!failures.empty()) {
        end_member_writes(engine_->settings().deadline / 10, failures);
        running_ = false;
        return BarrierResult(std::move(failures));
    }
    if (writing || waiting) return std::nullopt;
    running_ = false;
    return BarrierResult();
}

void Barrier::end_member_writes(std::chrono::milliseconds grace, std::vector<BarrierFailure>& failures) {
    for (const std::uint32_t member : participants_) {
        awaited_[member] = 0;
        if (member_tickets_[member] == kNoTicket) continue;
        WorkResult result = take_or_flush(std::exchange(member_tickets_[member], kNoTicket), grace);
        if (!result.ok() && membership_->ready(member)) {
            const bool named = std::any_of(failures.begin(), failures.end(),
                                           [&](const BarrierFailure& failure) { return failure.peer == member; });
            if (!named) failures.push_back({member, "barrier " + std::to_string(number_) + ": " + result.error().message()});
        }
    }
}

BarrierResult Barrier::give_up_members() {
    std::vector<BarrierFailure> failures;
    for (const std::uint32_t member : participants_) {
        if (awaited_[member] == 0 || !membership_->ready(member)) continue;
        failures.push_back({member, "did not arrive at barrier " + std::to_string(number_) + " (its barrier " +
                                        std::to_string(entered_[member]) + " with this member) within " +
                                        std::to_string(engine_->settings().deadline.count()) + " ms"});
    }
    end_member_writes(std::max(engine_->settings().deadline / 10, std::chrono::milliseconds(1)), failures);
    running_ = false;
    return BarrierResult(std::move(failures));
}

}  // namespace rdmachan::detail
