// MultiChannel set-up through the PMIx bootstrap: the builder's rank and world size from PMIx,
// and PreparedMultiChannel::connect() (handshake/pmix_bootstrap.hpp does the exchange).
#include "src/multi_channel_bootstrap.hpp"

#include "handshake/pmix_bootstrap.hpp"
#include "rdmachan/multi_channel.hpp"
#include "src/engine.hpp"

namespace rdmachan {
namespace detail {

BootstrapIdentity bootstrap_identity(Bootstrap requested, std::optional<std::uint32_t> rank,
                                     std::optional<std::uint32_t> world_size) {
    BootstrapIdentity identity{};
    try {
        identity.choice = choose_bootstrap(requested);
    } catch (const Error& error) {
        throw Error(std::string("MultiChannelBuilder::build: ") + error.what());
    }
    identity.rank = rank;
    identity.world_size = world_size;
    if (identity.choice.bootstrap != Bootstrap::pmix) return identity;
    try {
        identity.pmix = PmixSession::open();
    } catch (const Error& error) {
        throw Error("MultiChannelBuilder::build (bootstrap " + identity.choice.reason + "): " + error.what());
    }
    const std::uint32_t pmix_rank = identity.pmix->rank();
    const std::uint32_t pmix_world = identity.pmix->world_size();
    if (rank.has_value() && *rank != pmix_rank) {
        throw Error("MultiChannelBuilder::build: rank " + std::to_string(*rank) + " was set, but PMIx says this process is rank " +
                    std::to_string(pmix_rank) + " (namespace " + identity.pmix->job() + ")");
    }
    if (world_size.has_value() && *world_size != pmix_world) {
        throw Error("MultiChannelBuilder::build: world_size " + std::to_string(*world_size) +
                    " was set, but PMIx says the job has " + std::to_string(pmix_world) + " ranks (namespace " +
                    identity.pmix->job() + ")");
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

MultiChannel PreparedMultiChannel::connect() && {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::connect: this prepared multi-channel was already used");
    if (pmix_ == nullptr) {
        throw Error("PreparedMultiChannel::connect(): this multi-channel uses the TCP rendezvous bootstrap (" +
                    bootstrap_.reason + "): call connect(RendezvousSettings), or choose PMIx with "
                    "MultiChannelBuilder::bootstrap or RDMACHAN_BOOTSTRAP=pmix under a PMIx launcher");
    }
    const auto deadline = std::chrono::steady_clock::now() + engine_->settings().deadline;
    std::shared_ptr<detail::PmixSession> session = std::move(pmix_);
    const std::vector<Endpoint> table = session->exchange(endpoint(), deadline);
    MultiChannel channels = std::move(*this).handshake(table);
    // Nobody posts to a peer whose queue pair may not be connected yet.
    session->barrier(deadline);
    return channels;
}

}  // namespace rdmachan
