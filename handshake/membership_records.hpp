// What MultiChannel's membership keeps in the store (etcd), under the service's key prefix:
//
//   members/<id>            a member's Endpoint (endpoint.hpp's versioned JSON), under its lease;
//                           claimed with MembershipStore::create, so one process holds an id
//   members/<id>/leaving    put by a member that leaves gracefully, before it lets its lease go
//   pairs/<to>/<from>       what member `from` tells member `to` about their pair, under from's
//                           lease: its queue pair for `to` (RC), whether it has connected it, or
//                           that it released `to` after `to` announced its leave
//
// A member watches members/ (everyone's joins and leaves) and pairs/<its id>/ (what is said to
// it only), so what each process reads grows with the members, not with the pairs. Every value
// read is checked before use; a value that fails is refused naming its key.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rdmachan::handshake {

// Ids are decimal, without leading zeros: one spelling per id, so one key per id.
std::string member_key(std::uint32_t id);
std::string leaving_key(std::uint32_t id);
inline constexpr std::string_view kMembersPrefix = "members/";
std::string pairs_prefix(std::uint32_t to);
std::string pair_key(std::uint32_t to, std::uint32_t from);

// A key under members/: whose, and whether it is the leaving mark. Nothing for a key of
// another shape (refused by the caller, naming it).
struct MemberKey {
    std::uint32_t id = 0;
    bool leaving = false;
};
std::optional<MemberKey> parse_member_key(std::string_view key);
// The `from` of a key under pairs/<to>/; nothing for a key of another shape.
std::optional<std::uint32_t> parse_pair_key(std::string_view key, std::uint32_t to);

struct PairRecord {
    enum class State : std::uint8_t {
        offered,    // RC: `from` made `qpn` for `to` and waits for to's
        connected,  // `from` connected its side to `to`'s (RC: to's queue pair `connected_to`)
        released,   // `to` announced its leave; `from` has no operation in flight against it
    };
    State state = State::offered;
    std::uint64_t from_session = 0;
    std::uint64_t to_session = 0;
    std::uint32_t qpn = 0;  // RC: from's queue pair for `to`; 0 in DC
    std::uint32_t psn = 0;
    std::uint32_t connected_to = 0;  // RC, connected: the queue pair of to's it connected to
    bool operator==(const PairRecord&) const = default;
};
const char* to_string(PairRecord::State state);

std::string serialize_pair_record(const PairRecord& record);
// Throws rdmachan::Error naming the field that is missing, of the wrong type or out of range.
PairRecord parse_pair_record(std::string_view text);

}  // namespace rdmachan::handshake
