// MultiChannel's membership through etcd (include/rdmachan/membership.hpp): join, leave and
// the channel's view of its members; src/membership.cpp runs the protocol.
#include <cstring>

#include "handshake/etcd_store.hpp"
#include "rdmachan/multi_channel.hpp"
#include "src/engine.hpp"
#include "src/membership.hpp"
#include "src/multi_barrier.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan {
namespace {

// MembershipSettings' fields, each left empty read from its RDMACHAN_ETCD* variable.
handshake::EtcdSettings etcd_settings(const MembershipSettings& settings) {
    handshake::EtcdSettings given;
    given.endpoint = settings.etcd;
    given.key_prefix = settings.key_prefix;
    given.user = settings.user;
    given.password = settings.password;
    given.ca_file = settings.ca_file;
    return handshake::etcd_settings_from_environment(std::move(given));
}

}  // namespace

MultiChannel PreparedMultiChannel::join(MembershipSettings settings) && {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::join: this prepared multi-channel was already used");
    if (bootstrap_.bootstrap != Bootstrap::etcd) {
        throw Error(std::string("PreparedMultiChannel::join: the bootstrap chosen is ") + to_string(bootstrap_.bootstrap) +
                    " (" + bootstrap_.reason +
                    "): join needs the etcd bootstrap (MultiChannelBuilder::bootstrap(Bootstrap::etcd) or "
                    "RDMACHAN_BOOTSTRAP=etcd)");
    }
    if (settings.lease_ttl.count() < 1) throw Error("PreparedMultiChannel::join: MembershipSettings::lease_ttl is below 1 s");
    // A member's barriers write one word to every member (multi_barrier_members.cpp): its barrier
    // memory, published with the endpoint it puts, is laid out for that.
    MemoryRegion member_barrier =
        engine_->allocate_memory(detail::Barrier::memory_bytes_for_members(engine_->peer_count()), Access::remote_all);
    std::memset(member_barrier.data(), 0, member_barrier.length());
    const RemoteMemoryRegion barrier_remote = member_barrier.remote();
    published_[kBarrierRegionName] = RemoteRegion{barrier_remote.addr, barrier_remote.length, barrier_remote.rkey};
    auto regions = std::make_unique<detail::PeerRegions>();
    std::shared_ptr<detail::Membership> membership;
    try {
        membership = std::make_shared<detail::Membership>(engine_, *regions,
                                                          handshake::connect_etcd_store(etcd_settings(settings)),
                                                          settings, endpoint(), requested_id_);
    } catch (const Error& error) {
        throw Error(std::string("PreparedMultiChannel::join: ") + error.what());
    }
    rank_ = membership->id();
    MultiChannel channels = make_channel(rank_);
    channels.remote_regions_ = std::move(regions);
    channels.barrier_->set_peer_regions(channels.remote_regions_.get());
    channels.barrier_->set_membership(membership, std::move(member_barrier));
    channels.lives_.resize(channels.engine_->peer_count());
    channels.life(rank_).session = membership->session();
    channels.membership_ = std::move(membership);
    return channels;
}

LeaveResult MultiChannel::leave() {
    if (membership_ == nullptr) {
        throw Error("MultiChannel::leave (rank " + std::to_string(rank_) +
                    "): this multi-channel was not joined through etcd (PreparedMultiChannel::join)");
    }
    return membership_->leave();
}

std::vector<std::uint32_t> MultiChannel::members() const {
    if (membership_ != nullptr) return membership_->ready_members();
    std::vector<std::uint32_t> all;
    for (std::uint32_t peer = 0; peer < engine_->peer_count(); ++peer) {
        if (engine_->connected(peer)) all.push_back(peer);
    }
    return all;
}

}  // namespace rdmachan
