// MultiChannel's membership through a store (include/rdmachan/membership.hpp says what it does;
// handshake/membership_records.hpp the keys): the member's lease and watches, each peer slot's
// pairing state, and the engine calls that connect, flush and disconnect a slot's member.
// Driven by the channel's thread only (join, poll, reconnect, leave).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "handshake/membership_records.hpp"
#include "handshake/membership_store.hpp"
#include "rdmachan/endpoint.hpp"
#include "rdmachan/membership.hpp"
#include "rdmachan/multi_channel.hpp"

namespace rdmachan::detail {

class Engine;
class PeerRegions;

class Membership {
public:
    using Clock = std::chrono::steady_clock;

    // Claims an id (`requested`, else the lowest free one below the engine's peer count), puts
    // `endpoint` (its rank set to the id; RC entries dropped: pairs carry them) under a new
    // lease, watches, pairs with every member present and waits up to settings.join_wait for
    // them. Throws rdmachan::Error naming the store and the key.
    Membership(std::shared_ptr<Engine> engine, PeerRegions& regions, std::unique_ptr<handshake::MembershipStore> store,
               const MembershipSettings& settings, Endpoint endpoint, std::optional<std::uint32_t> requested);
    ~Membership();
    Membership(const Membership&) = delete;
    Membership& operator=(const Membership&) = delete;

    std::uint32_t id() const { return id_; }
    std::uint64_t session() const { return endpoint_.session; }
    // What happened since the last call (events of join() included in the first).
    std::vector<PeerEvent> poll();
    // Runs the protocol as poll() does, keeping the events for the next poll(): for waits
    // inside the channel (a barrier) that must see members come and go.
    void advance();
    bool ready(std::uint32_t peer) const { return members_[peer].stage == Stage::ready; }
    // What names this pairing of the two members, the same on both sides: both sessions and, in
    // RC, both queue pairs (a reconnected pair is a new pairing). Zero when not ready.
    std::uint64_t pair_identity(std::uint32_t peer) const;
    void reconnect(std::uint32_t peer);
    LeaveResult leave();
    bool left() const { return left_; }
    std::vector<std::uint32_t> ready_members() const;
    std::uint64_t member_session(std::uint32_t peer) const { return members_[peer].session; }

private:
    enum class Stage : std::uint8_t { absent, pairing, ready, left };
    struct Member {
        Stage stage = Stage::absent;
        bool was_ready = false;     // ready once in this session: the next ready is `reconnected`
        bool connected = false;     // this side is connected (RC: to `connected_to`; DC: its target)
        std::uint64_t session = 0;
        std::unique_ptr<Endpoint> endpoint;  // its port and regions (a pointer: most slots are empty)
        std::uint32_t offered_qpn = 0;       // RC: this side's queue pair for it, as offered
        std::uint32_t offered_psn = 0;
        std::uint32_t connected_to = 0;      // RC: its queue pair this side is connected to
        std::uint32_t stale_qpn = 0;         // RC: its queue pair before a reconnect, not to be reused
        std::optional<handshake::PairRecord> theirs;  // the last record it put for this member
        std::uint32_t reconnect_attempts = 0;
        std::optional<Clock::time_point> next_reconnect;
    };

    handshake::StoreDeadline deadline() const;
    // Pairing or ready: a member this one is connecting or connected to.
    static bool engaged(const Member& member) { return member.stage == Stage::pairing || member.stage == Stage::ready; }
    // The pair's first step on this side, in the mode's way (PeerPairing::begin: RC a fresh queue
    // pair offered in place of what the slot held, DC the member's target), and said to it.
    // `why` names the slot's state to its operations until the pair is ready.
    void start_pair(std::uint32_t peer, const char* why);
    // Removes the pair record `peer` put for this member (it is gone, so nobody reads it).
    void forget_pair_record(std::uint32_t peer);
    void claim(std::optional<std::uint32_t> requested);
    // Reads members/ and pairs with each one there; returns the ids it began to pair with.
    std::vector<std::uint32_t> pair_with_present();
    void take_store_events();
    // Blocks until the store says something (or a short while, or `until`): join and leave wait
    // here instead of looking every millisecond.
    void wait_for_store_events(Clock::time_point until);
    void on_member_put(const handshake::StoreEvent& event);
    void on_member_removed(const handshake::StoreEvent& event);
    void on_pair_put(const handshake::StoreEvent& event);
    void begin_pairing(std::uint32_t peer, Endpoint endpoint);
    void advance(std::uint32_t peer);
    void become_ready(std::uint32_t peer);
    void member_went(std::uint32_t peer, bool graceful, const std::string& reason);
    // Pair records wait here and go in one transaction per flush (the end of each look at the
    // store): a joiner tells every member at once, not in one round trip each.
    void say(std::uint32_t peer, handshake::PairRecord::State state);
    void flush_said();
    void unsay(const std::string& key);
    void retry_failed_pairs();
    void rejoin(const std::string& reason);
    void refuse(const std::string& key, std::uint32_t peer, const std::string& why);

    std::shared_ptr<Engine> engine_;
    PeerRegions& regions_;
    std::unique_ptr<handshake::MembershipStore> store_;
    MembershipSettings settings_;
    Endpoint endpoint_;
    std::uint32_t id_ = 0;
    handshake::LeaseId lease_ = 0;
    std::unique_ptr<handshake::StoreWatch> member_watch_;
    std::unique_ptr<handshake::StoreWatch> pair_watch_;
    std::vector<Member> members_;  // by id, sized to the capacity
    std::vector<PeerEvent> events_;
    std::vector<handshake::MembershipStore::KeyValue> said_;  // by flush_said, in order
    bool leaving_ = false;
    bool left_ = false;
};

}  // namespace rdmachan::detail
