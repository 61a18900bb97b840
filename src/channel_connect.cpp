// Channel set-up through the shipped pairwise exchange (handshake/pairwise.cpp): the versioned
// endpoint of a channel, and connect().
#include "rdmachan/channel.hpp"
#include "src/engine.hpp"

namespace rdmachan {

void PreparedChannel::publish_region(const std::string& name, const MemoryRegion& region) {
    if (name.empty() || name.size() > endpoint_max_region_name_length) {
        throw Error("PreparedChannel::publish_region: the name must have 1 to " +
                    std::to_string(endpoint_max_region_name_length) + " characters");
    }
    const RemoteMemoryRegion remote = region.remote();
    published_[name] = RemoteRegion{remote.addr, remote.length, remote.rkey};
}

Endpoint PreparedChannel::versioned_endpoint(std::uint32_t rank) const {
    if (core_ == nullptr) throw Error("PreparedChannel::versioned_endpoint: this prepared channel was already used");
    const ChannelEndpoint& local = core_->local_endpoint(0);
    const transport::PortIdentity& port = core_->port();
    Endpoint endpoint;
    endpoint.rank = rank;
    endpoint.session = session_;
    const std::string name = core_->device_name();
    endpoint.device = name.rfind("soft:", 0) == 0 ? DeviceKind::soft : name.rfind("mlx5", 0) == 0 ? DeviceKind::mlx5 : DeviceKind::verbs;
    endpoint.port.lid = port.lid;
    endpoint.port.gid = port.gid;
    endpoint.port.gid_index = port.gid_index;
    endpoint.port.link_layer = port.ethernet ? LinkLayer::ethernet : LinkLayer::infiniband;
    endpoint.port.mtu = local.mtu;
    endpoint.rc.push_back(RcEntry{1 - rank, local.qpn, local.psn});
    endpoint.regions = published_;
    return endpoint;
}

Channel PreparedChannel::connect(const PairwiseSettings& settings) && {
    if (core_ == nullptr) throw Error("PreparedChannel::connect: this prepared channel was already used");
    const std::uint32_t rank = settings.role == PairwiseSettings::Role::listen ? 0 : 1;
    const std::string peer = "the peer at " + settings.address;
    // The queue pair is connected (RTR, then RTS) inside the exchange, which returns on neither
    // side before both are: a channel returned here can be used at once. Connected only after
    // the exchange, the connector's first request could reach the listener's queue pair before
    // the listener's thread had moved it to RTR, be dropped, and cost the connector its retries
    // (8 tries of 537 ms by default) if that thread was not scheduled for as long.
    bool connected = false;
    const PairwiseReady make_ready = [&](const Endpoint& theirs) {
        if (theirs.rank != 1 - rank) {
            throw Error("PreparedChannel::connect: " + peer + " says it is rank " + std::to_string(theirs.rank) +
                        "; both sides chose the same role");
        }
        if (theirs.rc.size() != 1 || theirs.rc[0].peer != rank) {
            throw Error("PreparedChannel::connect: " + peer + " published " + std::to_string(theirs.rc.size()) +
                        " RC entries, none for rank " + std::to_string(rank));
        }
        ChannelEndpoint remote;
        remote.gid = theirs.port.gid;
        remote.lid = theirs.port.lid;
        remote.qpn = theirs.rc[0].qpn;
        remote.psn = theirs.rc[0].psn;
        remote.mtu = theirs.port.mtu;
        remote.device = std::string(to_string(theirs.device)) + " device of " + settings.address;
        core_->connect(0, remote);
        connected = true;
    };
    Endpoint theirs;
    try {
        theirs = exchange_pairwise(settings, versioned_endpoint(rank), make_ready);
    } catch (...) {
        // A queue pair connected to a peer that then failed cannot be connected again.
        if (connected) core_.reset();
        throw;
    }
    Channel channel(std::move(core_));
    channel.remote_regions_ = theirs.regions;
    return channel;
}

RemoteMemoryRegion Channel::remote_region(const std::string& name) const {
    if (auto found = remote_regions_.find(name); found != remote_regions_.end()) {
        return RemoteMemoryRegion{found->second.addr, found->second.length, found->second.rkey};
    }
    throw Error("Channel::remote_region: the peer " + peer() + " published no region named '" + name + "'");
}

}  // namespace rdmachan
