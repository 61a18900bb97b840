// Membership that changes while a MultiChannel runs, found through etcd (Bootstrap::etcd,
// PreparedMultiChannel::join): processes join and leave a running service, each member's peers
// connect it while their operations on every other peer go on.
//
// Peer ids are member ids: small integers below the capacity set at build
// (MultiChannelBuilder::world_size), each held by one process at a time. A joining process claims
// one (the builder's rank if set, else the lowest free one) with an etcd transaction that writes
// the key only if nobody holds it, so two processes never share an id. They are the engine's
// per-peer table indices, so the data path looks a peer up as in a fixed world (no map on the
// post path), and they stay stable while other members come and go. Sparse: a service at 5
// members may hold ids 0, 2, 3, 7, 9. A slot no member holds fails its operations naming why.
//
// Capacity: the table is sized at build for `world_size` members and never grows, so nothing a
// posted operation points at ever moves. Each slot costs what a peer of a fixed world costs
// (docs/SCALE.md): RC one queue pair made at build (a fresh one when a slot's member changes),
// DC a peer entry and its address vector, no queue pair.
//
// The protocol (handshake/membership_records.hpp has the keys): a member puts its endpoint
// (endpoint.hpp's JSON) under members/<id> with a lease it keeps alive, then watches members/ and
// pairs/<id>/. For every other member both sides connect their side of the pair and say so under
// pairs/<to>/<from>: RC each offers the queue pair it made for the other, connects it to the
// other's offer, and the pair is ready once each has seen the other connected to its own queue
// pair (two writes per side); DC each sets up the other's DC target and says so (one write per
// side). Only then does the peer's `joined` event come, and its operations work. A put under
// members/ is a join; members/<id>/leaving then the key's deletion is a graceful leave; a
// deletion without it (the lease expired: the process died, or was stopped or cut off from etcd
// longer than the TTL) is a failure.
//
// Polled: the protocol advances in MultiChannel::poll_peer_events (and join/leave), on the
// thread that uses the channel, like everything else in it; a member that does not poll delays
// its new peers' joins and others' leaves (until their deadline), never anyone's data path.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace rdmachan {

struct MembershipSettings {
    // etcd's client URL, http://host:port or https://host:port. Empty: RDMACHAN_ETCD.
    std::string etcd;
    // The service's keys live under it. Empty: RDMACHAN_ETCD_PREFIX, else "rdmachan/".
    std::string key_prefix;
    // etcd's user and password when it has authentication enabled. Empty: RDMACHAN_ETCD_USER and
    // RDMACHAN_ETCD_PASSWORD (none when unset).
    std::string user;
    std::string password;
    // https: the authority that signed etcd's certificate. Empty: RDMACHAN_ETCD_CA_FILE, else
    // the system's.
    std::string ca_file;
    // The lease on this member's keys: a member that stops renewing it (died, stopped) is failed
    // this long after its last renewal. Renewed every third of it.
    std::chrono::seconds lease_ttl{5};
    // How long join() waits for the members already there to connect their side. Members that
    // did not by then join later, reported by poll_peer_events.
    std::chrono::milliseconds join_wait{5000};
    // A pair whose queue pair failed while both members live is connected again by
    // poll_peer_events this many times at most (0: only MultiChannel::reconnect does it), the
    // n-th attempt reconnect_backoff * 2^(n-1) after the failure was seen.
    std::uint32_t reconnect_attempts = 0;
    std::chrono::milliseconds reconnect_backoff{100};
};

// What MultiChannel::leave() saw: the members that released this one (none of their operations
// in flight against its memory any more), and the ones that did not answer by the deadline.
struct LeaveResult {
    std::vector<std::uint32_t> released;
    std::vector<std::uint32_t> unanswered;
    bool ok() const { return unanswered.empty(); }
};

}  // namespace rdmachan
