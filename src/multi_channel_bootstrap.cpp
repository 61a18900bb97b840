// MultiChannel set-up through the PMIx bootstrap: the builder's rank and world size from PMIx,
// and PreparedMultiChannel::connect() (handshake/pmix_bootstrap.hpp does the exchange).
#include "src/multi_channel_bootstrap.hpp"

#include <cstdlib>

#include "handshake/pmix_bootstrap.hpp"
#include "handshake/pmix_replacement.hpp"
#include "rdmachan/multi_channel.hpp"
#include "src/engine.hpp"

namespace rdmachan {
namespace detail {

BootstrapIdentity bootstrap_identity(Bootstrap requested, std::optional<std::uint32_t> rank,
                                     std::optional<std::uint32_t> world_size, std::chrono::milliseconds deadline) {
    BootstrapIdentity identity{};
    try {
        identity.choice = choose_bootstrap(requested);
    } catch (const Error& error) {
        throw Error(std::string("MultiChannelBuilder::build: ") + error.what());
    }
    identity.rank = rank;
    identity.world_size = world_size;
    if (identity.choice.bootstrap != Bootstrap::pmix) return identity;
    const PmixSession::Clock::time_point until = PmixSession::Clock::now() + deadline;
    try {
        identity.pmix = PmixSession::open(until);
    } catch (const Error& error) {
        throw Error("MultiChannelBuilder::build (bootstrap " + identity.choice.reason + "): " + error.what());
    }
    std::uint32_t pmix_rank = identity.pmix->rank();
    std::uint32_t pmix_world = identity.pmix->world_size();
    std::string job = identity.pmix->job();
    // A process spawn_replacement started: it is the rank it replaces, in that rank's job.
    if (const char* replaces_text = std::getenv(kPmixReplacesVariable); replaces_text != nullptr) {
        try {
            PmixSession::Replaces replaces = parse_pmix_replaces(replaces_text);
            pmix_world = identity.pmix->job_size(replaces.job, until);
            if (replaces.rank >= pmix_world) {
                throw Error(std::string(kPmixReplacesVariable) + " names rank " + std::to_string(replaces.rank) +
                            ", outside namespace " + replaces.job + "'s " + std::to_string(pmix_world) + " ranks");
            }
            pmix_rank = replaces.rank;
            job = replaces.job;
            identity.pmix->set_replaces(std::move(replaces));
        } catch (const Error& error) {
            throw Error("MultiChannelBuilder::build (bootstrap " + identity.choice.reason + "): " + error.what());
        }
    }
    if (rank.has_value() && *rank != pmix_rank) {
        throw Error("MultiChannelBuilder::build: rank " + std::to_string(*rank) + " was set, but PMIx says this process is rank " +
                    std::to_string(pmix_rank) + " (namespace " + job + ")");
    }
    if (world_size.has_value() && *world_size != pmix_world) {
        throw Error("MultiChannelBuilder::build: world_size " + std::to_string(*world_size) +
                    " was set, but PMIx says the job has " + std::to_string(pmix_world) + " ranks (namespace " + job + ")");
    }
    if (pmix_world > 4096) {
        throw Error("MultiChannelBuilder::build: PMIx says the job has " + std::to_string(pmix_world) +
                    " ranks; a MultiChannel takes [1, 4096]");
    }
    identity.rank = pmix_rank;
    identity.world_size = pmix_world;
    return identity;
}

}  // namespace detail

MultiChannel PreparedMultiChannel::connect() && { return std::move(*this).connect(PeerReplacement::disabled); }

MultiChannel PreparedMultiChannel::connect(PeerReplacement replacement) && {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::connect: this prepared multi-channel was already used");
    if (pmix_ == nullptr) {
        throw Error("PreparedMultiChannel::connect(): this multi-channel uses the TCP rendezvous bootstrap (" +
                    bootstrap_.reason + "): call connect(RendezvousSettings), or choose PMIx with "
                    "MultiChannelBuilder::bootstrap or RDMACHAN_BOOTSTRAP=pmix under a PMIx launcher");
    }
    const auto deadline = std::chrono::steady_clock::now() + engine_->settings().deadline;
    const std::uint32_t world = engine_->peer_count();
    const std::uint32_t rank = rank_;
    const std::optional<detail::PmixSession::Replaces> replaces = pmix_->replaces();
    const std::string me = "PreparedMultiChannel::connect (rank " + std::to_string(rank) + ", bootstrap " + bootstrap_.reason + ")";
    if (replaces && replacement != PeerReplacement::replace_failed_rank) {
        throw Error(me + ": this process was started to replace rank " + std::to_string(replaces->rank) + " of namespace " +
                    replaces->job + " (" + detail::kPmixReplacesVariable +
                    "): connect it with PeerReplacement::replace_failed_rank");
    }
    if (!replaces && replacement == PeerReplacement::replace_failed_rank) {
        throw Error(me + ": PeerReplacement::replace_failed_rank, but this process was not started to replace a rank (" +
                    detail::kPmixReplacesVariable + " is not set: MultiChannel::spawn_replacement starts such a process)");
    }
    std::shared_ptr<detail::PmixSession> session = std::move(pmix_);
    if (replaces) {
        const Endpoint mine = endpoint();
        const detail::PmixReplacementTable announced = detail::pmix_announce_replacement(*session, mine, world, deadline);
        MultiChannel channels = std::move(*this).handshake(announced.table);
        detail::pmix_announce_connected(*session, announced, mine.session);
        channels.watch_ = detail::watch_through_pmix(session, replaces->job, announced.sequence, rank, world,
                                                     announced.index + 1, announced.holders);
        return channels;
    }
    const std::vector<Endpoint> table = session->exchange(endpoint(), deadline);
    MultiChannel channels = std::move(*this).handshake(table);
    // Nobody posts to a peer whose queue pair may not be connected yet.
    session->barrier(deadline);
    if (replacement != PeerReplacement::disabled) {
        channels.watch_ = detail::watch_through_pmix(session, session->job(), session->last_exchange_sequence(), rank, world, 1);
    }
    return channels;
}

}  // namespace rdmachan
