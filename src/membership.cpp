#include "src/membership.hpp"

#include <algorithm>

#include "common/logger.hpp"
#include "handshake/hex.hpp"
#include "rdmachan/handshake.hpp"
#include "src/engine.hpp"
#include "src/peer_pairing.hpp"
#include "src/peer_regions.hpp"

namespace rdmachan::detail {
namespace {

using handshake::PairRecord;

// Why a slot's operations fail (static texts: the engine keeps the pointer).
constexpr const char* kNotMember = "no member holds this id (membership through etcd)";
constexpr const char* kJoining =
    "the member is joining: its pair is not connected on both sides yet (wait for PeerEvent::Kind::joined)";
constexpr const char* kReconnecting =
    "the pair is being connected again (wait for PeerEvent::Kind::reconnected)";
constexpr const char* kLeft = "the member left the service (PeerEvent::Kind::left)";
constexpr const char* kFailed = "the member failed: its lease ran out or its key was deleted (PeerEvent::Kind::failed)";
constexpr const char* kThisLeft = "this member left the service (MultiChannel::leave)";

std::string id_text(std::uint32_t id) { return "member " + std::to_string(id); }

// An entry of a snapshot, as the watch would have reported its last put.
handshake::StoreEvent as_put(const handshake::StoreEntry& entry) {
    handshake::StoreEvent event;
    event.kind = handshake::StoreEvent::Kind::put;
    event.key = entry.key;
    event.value = entry.value;
    event.revision = entry.modified_revision;
    event.lease = entry.lease;
    return event;
}

}  // namespace

Membership::Membership(std::shared_ptr<Engine> engine, PeerRegions& regions,
                       std::unique_ptr<handshake::MembershipStore> store, const MembershipSettings& settings,
                       Endpoint endpoint, std::optional<std::uint32_t> requested)
    : engine_(std::move(engine)), regions_(regions), store_(std::move(store)), settings_(settings),
      endpoint_(std::move(endpoint)) {
    members_.resize(engine_->peer_count());
    for (std::uint32_t peer = 0; peer < members_.size(); ++peer) engine_->mark_absent(peer, kNotMember);
    endpoint_.rc.clear();
    lease_ = store_->grant_lease(settings_.lease_ttl, deadline());
    claim(requested);
    engine_->pairing().connect_own_slot(*engine_, id_, endpoint_, kJoining);
    engine_->mark_ready(id_);
    regions_.set(id_, endpoint_.regions);
    members_[id_].stage = Stage::ready;
    members_[id_].session = endpoint_.session;

    const std::vector<std::uint32_t> present = pair_with_present();
    flush_said();
    // The members already there connect their side when they next poll.
    const auto until = Clock::now() + settings_.join_wait;
    auto waiting = [&] {
        return std::any_of(present.begin(), present.end(),
                           [&](std::uint32_t peer) { return members_[peer].stage == Stage::pairing; });
    };
    while (waiting() && Clock::now() < until) {
        take_store_events();
        if (waiting()) wait_for_store_events(until);
    }
}

Membership::~Membership() {
    if (left_ || lease_ == 0) return;
    // A member dropped without leave(): its keys go when the lease runs out, as for a process
    // that died; its peers see `failed`. Stopping the renewal makes that so now rather than at
    // the store's destruction.
    store_->stop_keepalive(lease_);
}

handshake::StoreDeadline Membership::deadline() const { return Clock::now() + engine_->settings().deadline; }

void Membership::claim(std::optional<std::uint32_t> requested) {
    const std::uint32_t capacity = static_cast<std::uint32_t>(members_.size());
    auto try_id = [&](std::uint32_t id) {
        endpoint_.rank = id;
        std::optional<handshake::StoreEntry> holder =
            store_->create(handshake::member_key(id), serialize_endpoint(endpoint_), lease_, deadline());
        if (!holder) {
            id_ = id;
            return std::optional<std::string>();
        }
        std::string who = "another process";
        try {
            who = "session " + handshake::to_hex_u64(parse_endpoint(holder->value).session);
        } catch (const Error&) {
        }
        return std::optional<std::string>(who);
    };
    if (requested) {
        if (*requested >= capacity) {
            throw Error("join: member id " + std::to_string(*requested) + " is not below the capacity " +
                        std::to_string(capacity) + " (MultiChannelBuilder::world_size)");
        }
        if (std::optional<std::string> holder = try_id(*requested)) {
            throw Error("join: " + store_->address() + ": key '" + handshake::member_key(*requested) +
                        "': member id " + std::to_string(*requested) + " is already registered by " + *holder +
                        ": refused (ids are held by one process at a time)");
        }
    } else {
        // The lowest free id: a few tries each losing a race to another joiner at most.
        const handshake::StoreSnapshot snapshot = store_->get_prefix(handshake::kMembersPrefix, deadline());
        std::vector<bool> taken(capacity, false);
        for (const handshake::StoreEntry& entry : snapshot.entries) {
            if (auto key = handshake::parse_member_key(entry.key); key && key->id < capacity) taken[key->id] = true;
        }
        bool claimed = false;
        for (std::uint32_t id = 0; id < capacity && !claimed; ++id) {
            if (!taken[id]) claimed = !try_id(id).has_value();
        }
        if (!claimed) {
            throw Error("join: " + store_->address() + ": every member id below the capacity " +
                        std::to_string(capacity) + " is held (keys '" + std::string(handshake::kMembersPrefix) +
                        "0' to '" + handshake::member_key(capacity - 1) + "')");
        }
    }
    engine_->set_peer_name(id_, id_text(id_) + " (this process)");
}

std::vector<std::uint32_t> Membership::pair_with_present() {
    // Each watch starts after its own snapshot, so nothing falls between them. What was said to
    // this member comes first: a member that saw the claim may have answered before the
    // snapshot of members/ was taken.
    const handshake::StoreSnapshot said = store_->get_prefix(handshake::pairs_prefix(id_), deadline());
    pair_watch_ = store_->watch_prefix(handshake::pairs_prefix(id_), said.revision + 1, deadline());
    for (const handshake::StoreEntry& entry : said.entries) on_pair_put(as_put(entry));
    const handshake::StoreSnapshot present_members = store_->get_prefix(handshake::kMembersPrefix, deadline());
    member_watch_ = store_->watch_prefix(handshake::kMembersPrefix, present_members.revision + 1, deadline());
    std::vector<std::uint32_t> present;
    for (const handshake::StoreEntry& entry : present_members.entries) {
        on_member_put(as_put(entry));
        if (auto key = handshake::parse_member_key(entry.key);
            key && key->id < members_.size() && key->id != id_ && members_[key->id].stage == Stage::pairing) {
            present.push_back(key->id);
        }
    }
    return present;
}

void Membership::advance() {
    if (left_) return;
    for (const handshake::LostLease& lost : store_->poll_lost_leases()) {
        if (lost.lease == lease_) rejoin("this member's lease was lost (" + lost.reason + ")");
    }
    take_store_events();
    retry_failed_pairs();
}

std::uint64_t Membership::pair_identity(std::uint32_t peer) const {
    const Member& member = members_[peer];
    if (member.stage != Stage::ready) return 0;
    // Each side as (session, its queue pair for the other: 0 in DC), in an order both sides
    // agree on.
    std::uint64_t first = endpoint_.session ^ (static_cast<std::uint64_t>(member.offered_qpn) << 40);
    std::uint64_t second = member.session ^ (static_cast<std::uint64_t>(member.connected_to) << 40);
    if (second < first) std::swap(first, second);
    std::uint64_t mixed = first * 0x9e3779b97f4a7c15ull ^ second;
    mixed ^= mixed >> 31;
    mixed *= 0xbf58476d1ce4e5b9ull;
    mixed ^= mixed >> 29;
    return mixed == 0 ? 1 : mixed;
}

std::vector<PeerEvent> Membership::poll() {
    advance();
    std::vector<PeerEvent> events;
    events.swap(events_);
    return events;
}

void Membership::wait_for_store_events(Clock::time_point until) {
    // Pairs answer on the pair watch, which wakes this at once; what comes on members/ (a member
    // that failed meanwhile) is looked at every 10 ms.
    pair_watch_->wait(std::min(until, Clock::now() + std::chrono::milliseconds(10)));
}

void Membership::take_store_events() {
    for (const handshake::StoreEvent& event : member_watch_->poll()) {
        switch (event.kind) {
            case handshake::StoreEvent::Kind::put: on_member_put(event); break;
            case handshake::StoreEvent::Kind::removed: on_member_removed(event); break;
            case handshake::StoreEvent::Kind::failed:
                events_.push_back({PeerEvent::Kind::failed, id_, endpoint_.session,
                                   "the watch of " + store_->address() + " members/ stopped: " + event.failure});
                break;
        }
    }
    for (const handshake::StoreEvent& event : pair_watch_->poll()) {
        if (event.kind == handshake::StoreEvent::Kind::put) {
            on_pair_put(event);
        } else if (event.kind == handshake::StoreEvent::Kind::failed) {
            events_.push_back({PeerEvent::Kind::failed, id_, endpoint_.session,
                               "the watch of " + store_->address() + " " + handshake::pairs_prefix(id_) +
                                   " stopped: " + event.failure});
        }
    }
    flush_said();
}

void Membership::refuse(const std::string& key, std::uint32_t peer, const std::string& why) {
    const std::string reason = store_->address() + ": key '" + key + "' refused: " + why;
    logger().warn("membership: {}", reason);
    events_.push_back({PeerEvent::Kind::refused, peer, 0, reason});
}

void Membership::on_member_put(const handshake::StoreEvent& event) {
    const std::optional<handshake::MemberKey> key = handshake::parse_member_key(event.key);
    if (!key) return refuse(event.key, PeerEvent::kNoPeer, "not a member key (members/<id> or members/<id>/leaving)");
    if (key->id >= members_.size()) {
        return refuse(event.key, key->id,
                      "member id " + std::to_string(key->id) + " is not below this process's capacity " +
                          std::to_string(members_.size()) + " (MultiChannelBuilder::world_size)");
    }
    if (key->id == id_) return;  // its own keys
    Member& member = members_[key->id];
    if (key->leaving) {
        if (engaged(member)) member_went(key->id, true, "it announced its leave");
        return;
    }
    Endpoint endpoint;
    try {
        endpoint = parse_endpoint(event.value);
        validate(endpoint);
    } catch (const Error& error) {
        return refuse(event.key, key->id, error.what());
    }
    if (endpoint.rank != key->id) {
        return refuse(event.key, key->id, "the endpoint says rank " + std::to_string(endpoint.rank));
    }
    if (endpoint.session == 0) return refuse(event.key, key->id, "the endpoint's session is 0");
    if (const std::optional<std::string> why = engine_->pairing().mismatch(endpoint)) {
        return refuse(event.key, key->id, "the member " + *why);
    }
    if (member.stage != Stage::absent && member.session == endpoint.session) return;  // nothing new
    if (engaged(member)) {
        member_went(key->id, false, "another process took its id");
    }
    begin_pairing(key->id, std::move(endpoint));
}

void Membership::on_member_removed(const handshake::StoreEvent& event) {
    const std::optional<handshake::MemberKey> key = handshake::parse_member_key(event.key);
    if (!key || key->leaving || key->id >= members_.size() || key->id == id_) return;
    Member& member = members_[key->id];
    if (engaged(member)) {
        member_went(key->id, false, "its key '" + event.key + "' was deleted (its lease ran out: the process died, or was "
                                    "stopped or cut off from the store longer than its TTL)");
    }
    if (member.stage == Stage::left) {
        forget_pair_record(key->id);  // its pair key under this member's lease has no reader any more
    }
    member.stage = Stage::absent;
    member.endpoint.reset();
    member.theirs.reset();
}

void Membership::on_pair_put(const handshake::StoreEvent& event) {
    const std::optional<std::uint32_t> from = handshake::parse_pair_key(event.key, id_);
    if (!from) return refuse(event.key, PeerEvent::kNoPeer, "not a pair key (" + handshake::pairs_prefix(id_) + "<id>)");
    if (*from >= members_.size() || *from == id_) return refuse(event.key, *from, "names no other member below the capacity");
    PairRecord record;
    try {
        record = handshake::parse_pair_record(event.value);
    } catch (const Error& error) {
        return refuse(event.key, *from, error.what());
    }
    // Said to an earlier holder of this id.
    if (record.to_session != endpoint_.session) return;
    if (const std::optional<std::string> why = engine_->pairing().record_mismatch(record.qpn, record.connected_to)) {
        return refuse(event.key, *from, *why);
    }
    members_[*from].theirs = record;
    advance(*from);
}

void Membership::begin_pairing(std::uint32_t peer, Endpoint endpoint) {
    Member& member = members_[peer];
    const bool same_session = member.session == endpoint.session;
    if (!same_session) {
        member.was_ready = false;
        if (member.theirs && member.theirs->from_session != endpoint.session) member.theirs.reset();
    }
    member.session = endpoint.session;
    member.endpoint = std::make_unique<Endpoint>(std::move(endpoint));
    member.stage = Stage::pairing;
    member.connected = false;
    member.connected_to = 0;
    member.reconnect_attempts = 0;
    member.next_reconnect.reset();
    engine_->set_peer_name(peer, id_text(peer));
    try {
        start_pair(peer, same_session ? kReconnecting : kJoining);
    } catch (const Error& error) {
        member.stage = Stage::absent;
        return refuse(handshake::member_key(peer), peer, error.what());
    }
    advance(peer);
}

void Membership::say(std::uint32_t peer, PairRecord::State state) {
    const Member& member = members_[peer];
    PairRecord record;
    record.state = state;
    record.from_session = endpoint_.session;
    record.to_session = member.session;
    record.qpn = member.offered_qpn;
    record.psn = member.offered_psn;
    record.connected_to = member.connected_to;
    std::string key = handshake::pair_key(peer, id_);
    unsay(key);  // a later record for the same pair replaces one not yet written
    said_.push_back({std::move(key), handshake::serialize_pair_record(record)});
}

void Membership::start_pair(std::uint32_t peer, const char* why) {
    Member& member = members_[peer];
    const PairStart start = engine_->pairing().begin(*engine_, peer, *member.endpoint, why);
    member.offered_qpn = start.qpn;
    member.offered_psn = start.psn;
    member.connected = start.connected;
    member.stage = Stage::pairing;
    say(peer, start.connected ? PairRecord::State::connected : PairRecord::State::offered);
}

void Membership::forget_pair_record(std::uint32_t peer) {
    try {
        unsay(handshake::pair_key(peer, id_));
        store_->remove(handshake::pair_key(peer, id_), deadline());
    } catch (const Error& error) {
        logger().warn("membership: {}", error.what());
    }
}

void Membership::unsay(const std::string& key) {
    std::erase_if(said_, [&](const handshake::MembershipStore::KeyValue& entry) { return entry.key == key; });
}

void Membership::flush_said() {
    for (std::size_t first = 0; first < said_.size(); first += handshake::MembershipStore::kMaxKeysPerTransaction) {
        const std::size_t count = std::min(said_.size() - first, handshake::MembershipStore::kMaxKeysPerTransaction);
        const std::vector<handshake::MembershipStore::KeyValue> batch(said_.begin() + static_cast<std::ptrdiff_t>(first),
                                                                      said_.begin() + static_cast<std::ptrdiff_t>(first + count));
        try {
            store_->put_all(batch, lease_, deadline());
        } catch (const Error& error) {
            // The store is away longer than the deadline: those pairs wait; a reconnect or the
            // member's next change says it again.
            logger().warn("membership: telling {} members failed: {}", batch.size(), error.what());
        }
    }
    said_.clear();
}

void Membership::advance(std::uint32_t peer) {
    Member& member = members_[peer];
    if (!engaged(member)) return;
    if (!member.theirs || member.theirs->from_session != member.session) return;
    const PairRecord& record = *member.theirs;
    if (record.state == PairRecord::State::released) return;  // an answer to this member's leave
    if (leaving_) return;
    // A queue pair it made for this member (RC; a DC record names none) that this side has not
    // connected to: connect to it, after making a new one of its own if it was connected (the
    // peer reconnects). A record still naming the queue pair this side left is an old one.
    if (record.qpn != 0 && record.qpn != member.stale_qpn && record.qpn != member.connected_to) {
        try {
            if (member.connected) {
                member.stale_qpn = member.connected_to;
                start_pair(peer, kReconnecting);
            }
            engine_->pairing().answer(*engine_, peer, *member.endpoint, record.qpn, record.psn);
        } catch (const Error& error) {
            return refuse(handshake::pair_key(id_, peer), peer, error.what());
        }
        member.connected = true;
        member.connected_to = record.qpn;
        say(peer, PairRecord::State::connected);
    }
    // Ready once both sides are connected, the other to what this side offered.
    if (member.stage == Stage::pairing && member.connected && record.state == PairRecord::State::connected &&
        record.connected_to == member.offered_qpn) {
        become_ready(peer);
    }
}

void Membership::become_ready(std::uint32_t peer) {
    Member& member = members_[peer];
    engine_->mark_ready(peer);
    regions_.set(peer, member.endpoint->regions);
    member.stage = Stage::ready;
    member.stale_qpn = 0;
    member.reconnect_attempts = 0;
    member.next_reconnect.reset();
    events_.push_back({member.was_ready ? PeerEvent::Kind::reconnected : PeerEvent::Kind::joined, peer, member.session, {}});
    member.was_ready = true;
}

void Membership::member_went(std::uint32_t peer, bool graceful, const std::string& reason) {
    Member& member = members_[peer];
    engine_->disconnect_peer(peer, graceful ? kLeft : kFailed);
    regions_.set(peer, {});
    if (graceful) {
        member.stage = Stage::left;
        // Its operations are flushed: nothing of this member's is in flight against it any more.
        say(peer, PairRecord::State::released);
        events_.push_back({PeerEvent::Kind::left, peer, member.session, reason});
    } else {
        member.stage = Stage::absent;
        events_.push_back({PeerEvent::Kind::failed, peer, member.session, reason});
        forget_pair_record(peer);
    }
    member.connected = false;
    member.connected_to = 0;
    member.stale_qpn = 0;
}

void Membership::reconnect(std::uint32_t peer) {
    Member& member = members_[peer];
    const std::string me = "MultiChannel::reconnect (" + id_text(id_) + ", peer " + id_text(peer) + ")";
    if (left_) throw Error(me + ": this member left the service");
    if (peer == id_) throw Error(me + ": a member does not reconnect to itself");
    if (!engaged(member)) {
        throw Error(me + ": no member holds id " + std::to_string(peer) + " (or it left)");
    }
    member.next_reconnect.reset();
    // RC: a new queue pair offered, the one connected until now left; DC: the peer's target set
    // up again (its initiators were recovered by the engine).
    member.stale_qpn = member.connected_to;
    member.connected_to = 0;
    start_pair(peer, kReconnecting);
    advance(peer);
    flush_said();
}

void Membership::retry_failed_pairs() {
    if (settings_.reconnect_attempts == 0) return;
    const auto now = Clock::now();
    for (std::uint32_t peer = 0; peer < members_.size(); ++peer) {
        Member& member = members_[peer];
        if (peer == id_ || member.stage != Stage::ready || engine_->healthy(peer)) continue;
        if (member.reconnect_attempts >= settings_.reconnect_attempts) continue;
        if (!member.next_reconnect) {
            member.next_reconnect = now + settings_.reconnect_backoff * (1u << std::min(member.reconnect_attempts, 20u));
            continue;
        }
        if (now < *member.next_reconnect) continue;
        ++member.reconnect_attempts;
        const std::uint32_t attempts = member.reconnect_attempts;
        reconnect(peer);
        member.reconnect_attempts = attempts;
    }
}

void Membership::rejoin(const std::string& reason) {
    // Everyone has seen this member fail: each pair is gone on the other side.
    said_.clear();
    for (std::uint32_t peer = 0; peer < members_.size(); ++peer) {
        Member& member = members_[peer];
        if (peer == id_ || !engaged(member)) continue;
        engine_->disconnect_peer(peer, kFailed);
        regions_.set(peer, {});
        events_.push_back({PeerEvent::Kind::failed, peer, member.session, reason + ": rejoining"});
        member = Member{};
    }
    const std::uint64_t old_session = endpoint_.session;
    // The renewal gave up on a lease etcd may still hold (etcd was away longer than the TTL, and
    // restored its leases when it came back): its keys would hold this id against the claim.
    try {
        store_->revoke_lease(lease_, deadline());
    } catch (const Error&) {
        store_->stop_keepalive(lease_);  // gone already, as for a member that was stopped
    }
    endpoint_.session = random_session_id();
    members_[id_].session = endpoint_.session;
    try {
        lease_ = store_->grant_lease(settings_.lease_ttl, deadline());
        claim(id_);
        pair_with_present();
        flush_said();
    } catch (const Error& error) {
        events_.push_back({PeerEvent::Kind::failed, id_, old_session,
                           reason + "; rejoining failed: " + error.what()});
        return;
    }
    logger().info("membership: {} rejoined as session {} ({})", id_text(id_), handshake::to_hex_u64(endpoint_.session),
                  reason);
}

LeaveResult Membership::leave() {
    if (left_) throw Error("MultiChannel::leave (" + id_text(id_) + "): this member already left");
    leaving_ = true;
    store_->put(handshake::leaving_key(id_), handshake::to_hex_u64(endpoint_.session),
                lease_, deadline());
    const auto until = Clock::now() + engine_->settings().deadline;
    auto waiting_for = [&] {
        std::vector<std::uint32_t> peers;
        for (std::uint32_t peer = 0; peer < members_.size(); ++peer) {
            const Member& member = members_[peer];
            if (peer == id_ || !engaged(member)) continue;
            if (member.theirs && member.theirs->from_session == member.session &&
                member.theirs->state == PairRecord::State::released)
                continue;
            peers.push_back(peer);
        }
        return peers;
    };
    LeaveResult result;
    std::vector<std::uint32_t> before;
    for (std::uint32_t peer = 0; peer < members_.size(); ++peer) {
        if (peer != id_ && engaged(members_[peer]))
            before.push_back(peer);
    }
    while (!waiting_for().empty() && Clock::now() < until) {
        take_store_events();
        if (!waiting_for().empty()) wait_for_store_events(until);
    }
    result.unanswered = waiting_for();
    for (std::uint32_t peer : before) {
        if (std::find(result.unanswered.begin(), result.unanswered.end(), peer) == result.unanswered.end())
            result.released.push_back(peer);
    }
    // Its keys go at once; its peers, having seen the leaving mark, take that as the end.
    try {
        store_->revoke_lease(lease_, deadline());
    } catch (const Error& error) {
        logger().warn("membership: {}", error.what());
        store_->stop_keepalive(lease_);
    }
    for (std::uint32_t peer = 0; peer < members_.size(); ++peer) {
        if (members_[peer].stage != Stage::absent) engine_->disconnect_peer(peer, kThisLeft);
        members_[peer] = Member{};
    }
    left_ = true;
    member_watch_.reset();
    pair_watch_.reset();
    return result;
}

std::vector<std::uint32_t> Membership::ready_members() const {
    std::vector<std::uint32_t> ready;
    for (std::uint32_t peer = 0; peer < members_.size(); ++peer) {
        if (members_[peer].stage == Stage::ready) ready.push_back(peer);
    }
    return ready;
}

}  // namespace rdmachan::detail
