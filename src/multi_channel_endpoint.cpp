// MultiChannel set-up in the versioned endpoint schema (handshake/): endpoint(), the checks on a
// peer's endpoint, and connect() through the rendezvous.
#include <limits>
#include <random>

#include "handshake/peer_watch.hpp"
#include "rdmachan/multi_channel.hpp"
#include "src/dc_peer_directory.hpp"
#include "src/engine.hpp"
#include "src/multi_barrier.hpp"
#include "src/peer_pairing.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan {
namespace {

DeviceKind endpoint_device_kind(const std::string& device_name) {
    if (device_name.rfind("soft:", 0) == 0) return DeviceKind::soft;
    if (device_name.rfind("mlx5", 0) == 0) return DeviceKind::mlx5;
    return DeviceKind::verbs;
}

std::string rank_text(std::uint32_t rank) { return "rank " + std::to_string(rank); }

}  // namespace

void PreparedMultiChannel::publish_region(const std::string& name, const MemoryRegion& region) {
    if (name.empty() || name.size() > endpoint_max_region_name_length) {
        throw Error("PreparedMultiChannel::publish_region: the name must have 1 to " +
                    std::to_string(endpoint_max_region_name_length) + " characters");
    }
    if (name.rfind("rdmachan.", 0) == 0) {
        throw Error("PreparedMultiChannel::publish_region: '" + name +
                    "': names starting with \"rdmachan.\" are the library's (the barrier publishes " +
                    kBarrierRegionName + ")");
    }
    const RemoteMemoryRegion remote = region.remote();
    published_[name] = RemoteRegion{remote.addr, remote.length, remote.rkey};
}

Endpoint PreparedMultiChannel::endpoint() const {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::endpoint: this prepared multi-channel was already used");
    Endpoint endpoint;
    endpoint.rank = rank_;
    endpoint.session = session_;
    endpoint.device = endpoint_device_kind(engine_->device_name());
    const transport::PortIdentity& port = engine_->port();
    endpoint.port.lid = port.lid;
    endpoint.port.gid = port.gid;
    endpoint.port.gid_index = port.gid_index;
    endpoint.port.link_layer = port.ethernet ? LinkLayer::ethernet : LinkLayer::infiniband;
    endpoint.port.mtu = engine_->local_endpoint(0).mtu;
    engine_->pairing().describe(*engine_, endpoint);
    endpoint.regions = published_;
    return endpoint;
}

MultiChannel PreparedMultiChannel::handshake(const std::vector<Endpoint>& table) && {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::handshake: this prepared multi-channel was already used");
    const std::uint32_t world = engine_->peer_count();
    const std::string me = "PreparedMultiChannel::handshake (" + rank_text(rank_) + ")";
    if (table.size() != world) {
        throw Error(me + ": the endpoint table has " + std::to_string(table.size()) + " ranks, the world has " +
                    std::to_string(world));
    }
    auto regions = std::make_unique<detail::PeerRegions>();
    std::size_t region_count = 0;
    for (const Endpoint& endpoint : table) region_count += endpoint.regions.size();
    regions->reserve(region_count);
    for (std::uint32_t peer = 0; peer < world; ++peer) {
        const Endpoint& theirs = table[peer];
        try {
            validate(theirs);
        } catch (const Error& error) {
            throw Error(me + ": the endpoint of " + rank_text(peer) + ": " + error.what());
        }
        if (theirs.rank != peer) {
            throw Error(me + ": table entry " + std::to_string(peer) + " is the endpoint of " + rank_text(theirs.rank));
        }
        regions->set(peer, theirs.regions);
    }
    engine_->pairing().connect_world(*engine_, rank_, table, me);
    MultiChannel channels = make_channel(rank_);
    channels.remote_regions_ = std::move(regions);
    channels.barrier_->set_peer_regions(channels.remote_regions_.get());
    channels.lives_.resize(world);
    auto sessions = std::make_shared<std::vector<std::uint64_t>>(world);
    for (std::uint32_t peer = 0; peer < world; ++peer) (*sessions)[peer] = table[peer].session;
    channels.session_of_ = [sessions](std::uint32_t peer) { return (*sessions)[peer]; };
    return channels;
}

MultiChannel PreparedMultiChannel::handshake_view(const std::shared_ptr<const RendezvousTableView>& view) && {
    const std::uint32_t world = engine_->peer_count();
    const std::string me = "PreparedMultiChannel::connect (" + rank_text(rank_) + ")";
    if (view->size() != world) {
        throw Error(me + ": the endpoint table has " + std::to_string(view->size()) + " ranks, the world has " +
                    std::to_string(world));
    }
    if (view->dc_directory().empty() || engine_->pairing().mode() != MultiChannelMode::dynamically_connected) {
        // RC needs every peer's entry, and a table without a directory is decoded whole anyway.
        std::vector<Endpoint> table;
        table.reserve(world);
        for (std::uint32_t peer = 0; peer < world; ++peer) table.push_back(view->endpoint(peer));
        return std::move(*this).handshake(table);
    }
    // Nothing per peer is read here: the directory stays in the table's bytes (on a host that
    // shares the table, its one mapped copy), a peer's endpoint is parsed when its regions are
    // first asked for, and its session comes from its record. The directory's form is checked
    // again although Rendezvous checked it on receipt: the view may be any RendezvousTableView,
    // and the check is a pass over the directory (under a millisecond at 16,384 ranks).
    const std::shared_ptr<const detail::DcPeerDirectory> directory =
        detail::DcPeerDirectory::from_bytes(view->dc_directory(), std::numeric_limits<std::size_t>::max(), view, world, me);
    engine_->use_dc_directory(directory);
    MultiChannel channels = make_channel(rank_);
    auto regions = std::make_unique<detail::PeerRegions>();
    regions->set_loader([view](std::uint32_t peer) { return view->endpoint(peer).regions; }, world);
    channels.remote_regions_ = std::move(regions);
    channels.barrier_->set_peer_regions(channels.remote_regions_.get());
    channels.lives_.resize(world);
    channels.session_of_ = [directory](std::uint32_t peer) {
        const std::optional<detail::DcPeerRecord> record = directory->record(peer);
        return record.has_value() ? record->session : 0;
    };
    return channels;
}

MultiChannel PreparedMultiChannel::connect(RendezvousSettings settings) && {
    if (engine_ == nullptr) throw Error("PreparedMultiChannel::connect: this prepared multi-channel was already used");
    if (bootstrap_.bootstrap == Bootstrap::pmix && bootstrap_.explicit_choice) {
        throw Error("PreparedMultiChannel::connect(RendezvousSettings): the PMIx bootstrap was chosen (" +
                    bootstrap_.reason + "): call connect()");
    }
    if (bootstrap_.bootstrap == Bootstrap::etcd) {
        throw Error("PreparedMultiChannel::connect(RendezvousSettings): the etcd bootstrap was chosen (" + bootstrap_.reason +
                    "): call join()");
    }
    pmix_.reset();  // automatic detection chose PMIx, but this call asks for the TCP rendezvous
    if (settings.rank != rank_ || settings.world_size != engine_->peer_count()) {
        throw Error("PreparedMultiChannel::connect: the rendezvous settings say rank " + std::to_string(settings.rank) +
                    " of " + std::to_string(settings.world_size) + ", this multi-channel is " + rank_text(rank_) + " of " +
                    std::to_string(engine_->peer_count()));
    }
    auto rendezvous = std::make_shared<Rendezvous>(settings);
    MultiChannel channels = engine_->pairing().mode() == MultiChannelMode::dynamically_connected
                                ? std::move(*this).handshake_view(rendezvous->exchange_view(endpoint()))
                                : std::move(*this).handshake(rendezvous->exchange(endpoint()));
    // Nobody posts to a peer whose queue pair may not be connected yet.
    rendezvous->barrier();
    // With replacement the connection stays: the server reports failures and replacements.
    if (settings.replacement != PeerReplacement::disabled) channels.watch_ = detail::watch_through_rendezvous(std::move(rendezvous));
    return channels;
}

PeerRemoteMemoryRegion MultiChannel::remote_region(std::uint32_t peer, const std::string& name) const {
    check_peer("MultiChannel::remote_region", peer);
    if (remote_regions_ != nullptr) {
        if (const RemoteRegion* found = remote_regions_->find(peer, name); found != nullptr) {
            return {peer, RemoteMemoryRegion{found->addr, found->length, found->rkey}};
        }
    }
    throw Error("MultiChannel::remote_region: rank " + std::to_string(peer) + " published no region named '" + name + "'");
}

}  // namespace rdmachan
