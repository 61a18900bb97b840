// Peers added and removed by the application (PreparedMultiChannel::open, MultiChannel::offer_peer,
// add_peer, remove_peer): the same engine calls that membership through etcd makes, with the
// endpoints carried by the caller instead of a store.
#include <optional>
#include <string>

#include "rdmachan/multi_channel.hpp"
#include "src/engine.hpp"
#include "src/multi_barrier.hpp"
#include "src/peer_pairing.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan {
namespace {

constexpr const char* kNotAdded = "this peer was not added (MultiChannel::offer_peer, then add_peer)";
constexpr const char* kOffered =
    "this peer was offered a queue pair and is not added yet (MultiChannel::add_peer)";
constexpr const char* kRemoved = "this peer was removed (MultiChannel::remove_peer)";

std::string peer_text(const char* call, std::uint32_t rank, std::uint32_t peer) {
    return std::string(call) + " (rank " + std::to_string(rank) + ", peer " + std::to_string(peer) + ")";
}

}  // namespace

MultiChannel PreparedMultiChannel::open() && {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::open: this prepared multi-channel was already used");
    auto own = std::make_unique<Endpoint>(endpoint());
    own->rc.clear();
    detail::Engine& engine = *engine_;
    for (std::uint32_t peer = 0; peer < engine.peer_count(); ++peer) engine.mark_absent(peer, kNotAdded);
    engine.pairing().connect_own_slot(engine, rank_, *own, kNotAdded);
    engine.mark_ready(rank_);
    auto regions = std::make_unique<detail::PeerRegions>();
    regions->set(rank_, own->regions);
    MultiChannel channels = make_channel(rank_);
    channels.remote_regions_ = std::move(regions);
    channels.barrier_->set_peer_regions(channels.remote_regions_.get());
    channels.lives_.resize(channels.engine_->peer_count());
    channels.life(rank_).session = own->session;
    channels.opened_ = std::move(own);
    return channels;
}

Endpoint MultiChannel::offer_peer(std::uint32_t peer) {
    const std::string call = peer_text("MultiChannel::offer_peer", rank_, peer);
    if (opened_ == nullptr) throw Error(call + ": this multi-channel is not from PreparedMultiChannel::open()");
    check_peer("MultiChannel::offer_peer", peer);
    if (peer == rank_) throw Error(call + ": that is this process's own rank");
    Endpoint offer = *opened_;
    if (const std::optional<RcEntry> entry = engine_->pairing().offer(*engine_, peer, kOffered)) {
        offer.rc.push_back(*entry);
        life(peer).offered = true;
    }
    return offer;
}

void MultiChannel::add_peer(const Endpoint& theirs) {
    const std::uint32_t peer = theirs.rank;
    const std::string call = peer_text("MultiChannel::add_peer", rank_, peer);
    if (opened_ == nullptr) throw Error(call + ": this multi-channel is not from PreparedMultiChannel::open()");
    check_peer("MultiChannel::add_peer", peer);
    if (peer == rank_) throw Error(call + ": endpoint field 'rank' is this process's own rank");
    try {
        validate(theirs);
    } catch (const Error& error) {
        throw Error(call + ": " + error.what());
    }
    if (theirs.device != opened_->device) {
        throw Error(call + ": endpoint field 'device' is " + to_string(theirs.device) + ", this process's is " +
                    to_string(opened_->device));
    }
    try {
        engine_->pairing().connect_offered(*engine_, rank_, peer, theirs, life(peer).offered, kOffered);
    } catch (const Error& error) {
        throw Error(call + ": " + error.what());
    }
    engine_->mark_ready(peer);
    remote_regions_->set(peer, theirs.regions);
    PeerLife& added = life(peer);
    added.session = theirs.session;
    added.failure_reported = false;
    added.offered = false;
}

void MultiChannel::remove_peer(std::uint32_t peer) {
    const std::string call = peer_text("MultiChannel::remove_peer", rank_, peer);
    if (opened_ == nullptr) throw Error(call + ": this multi-channel is not from PreparedMultiChannel::open()");
    check_peer("MultiChannel::remove_peer", peer);
    if (peer == rank_) throw Error(call + ": that is this process's own rank");
    engine_->disconnect_peer(peer, kRemoved);
    remote_regions_->set(peer, {});
    lives_[peer].reset();
}

}  // namespace rdmachan
