// MultiChannel's membership through etcd (include/rdmachan/membership.hpp): join, leave and
// the channel's view of its members; src/membership.cpp runs the protocol.
#include <cstdlib>
#include <cstring>

#include "handshake/etcd_store.hpp"
#include "rdmachan/multi_channel.hpp"
#include "src/engine.hpp"
#include "src/membership.hpp"
#include "src/multi_barrier.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan {
namespace {

std::string from_environment(const std::string& given, const char* name) {
    if (!given.empty()) return given;
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
}

handshake::EtcdSettings etcd_settings(const MembershipSettings& settings) {
    handshake::EtcdSettings etcd;
    etcd.endpoint = from_environment(settings.etcd, "RDMACHAN_ETCD");
    if (etcd.endpoint.empty()) {
        throw Error("no etcd address: set MembershipSettings::etcd or RDMACHAN_ETCD (http://host:port or https://host:port)");
    }
    if (std::string prefix = from_environment(settings.key_prefix, "RDMACHAN_ETCD_PREFIX"); !prefix.empty()) {
        etcd.key_prefix = std::move(prefix);
    }
    etcd.user = from_environment(settings.user, "RDMACHAN_ETCD_USER");
    etcd.password = from_environment(settings.password, "RDMACHAN_ETCD_PASSWORD");
    etcd.ca_file = from_environment(settings.ca_file, "RDMACHAN_ETCD_CA_FILE");
    return etcd;
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
    channels.lives_[rank_].session = membership->session();
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
