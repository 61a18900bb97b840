// A store that long-running services already run (etcd), through which processes find their
// peers: keys under leases that vanish when their owner stops renewing them, and a watch that
// reports every change in order. The membership protocol is built on this interface; the store
// itself knows nothing of ranks or endpoints.
//
// Threading: every call may come from any thread, one at a time per store (the store is not a
// shared work queue). The store's own threads (lease renewal, each watch) never call user code:
// what they learn waits in the store until the user polls for it.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rdmachan::handshake {

using StoreDeadline = std::chrono::steady_clock::time_point;
using LeaseId = std::int64_t;

// Keys are relative to the store's key prefix (the job's or service's): the store adds the
// prefix on the way out and strips it from what it returns.
struct StoreEntry {
    std::string key;
    std::string value;  // any bytes
    std::int64_t modified_revision = 0;
    LeaseId lease = 0;  // 0: the key lives until deleted
};

struct StoreSnapshot {
    std::vector<StoreEntry> entries;  // in key order
    std::int64_t revision = 0;        // the store's revision when it answered; watch from revision + 1
};

struct StoreEvent {
    enum class Kind : std::uint8_t {
        put,
        removed,  // deleted, or its lease expired or was revoked
        failed,   // the watch stopped for good; `failure` says why; no event follows
    };
    Kind kind = Kind::put;
    std::string key;
    std::string value;  // put only
    std::int64_t revision = 0;
    LeaseId lease = 0;  // put only
    std::string failure;
};

struct LostLease {
    LeaseId lease = 0;
    std::string reason;
};

// A watch of every key under a prefix. It reconnects by itself when the store goes away and comes
// back, resuming after the last revision it reported, so nothing is missed; it fails for good
// (a `failed` event) when the store can no longer give what it missed (compacted) or answers
// nonsense.
class StoreWatch {
  public:
    virtual ~StoreWatch() = default;
    // The events received since the last call, in revision order. Never blocks.
    virtual std::vector<StoreEvent> poll() = 0;
    // Blocks until an event is there for poll(), or `until`; true when one is.
    virtual bool wait(std::chrono::steady_clock::time_point until) = 0;
};

// Errors are rdmachan::Error naming the store's address, the operation and the key. A call that
// gets no answer by its deadline fails saying so.
class MembershipStore {
  public:
    virtual ~MembershipStore() = default;

    // Grants a lease of `ttl` (whole seconds, at least 1) and keeps it alive from then on, renewing
    // it every ttl/3 until revoke_lease or stop_keepalive.
    virtual LeaseId grant_lease(std::chrono::seconds ttl, StoreDeadline deadline) = 0;
    // `lease` 0: no lease. Returns the revision of the write.
    virtual std::int64_t put(std::string_view key, std::string_view value, LeaseId lease,
                             StoreDeadline deadline) = 0;
    // Puts every key under the one lease in one etcd transaction (at most 128 keys, etcd's default
    // limit of operations per transaction): all are written, or none. Returns the revision.
    struct KeyValue {
        std::string key;
        std::string value;
    };
    static constexpr std::size_t kMaxKeysPerTransaction = 128;
    virtual std::int64_t put_all(const std::vector<KeyValue>& entries, LeaseId lease, StoreDeadline deadline) = 0;
    // Puts the key only if no key of that name exists (one etcd transaction: the check and the
    // write cannot be split by another writer). Returns the entry already there, untouched, when
    // one does; nothing when the key was created. What membership claims an id with.
    virtual std::optional<StoreEntry> create(std::string_view key, std::string_view value, LeaseId lease,
                                             StoreDeadline deadline) = 0;
    // A snapshot holding the key, if present.
    virtual StoreSnapshot get(std::string_view key, StoreDeadline deadline) = 0;
    // Every key that starts with `prefix` ("" for the whole key prefix of the store).
    virtual StoreSnapshot get_prefix(std::string_view prefix, StoreDeadline deadline) = 0;
    // Returns whether the key existed.
    virtual bool remove(std::string_view key, StoreDeadline deadline) = 0;
    // Deletes every key under the lease at once (watchers see each as removed).
    virtual void revoke_lease(LeaseId lease, StoreDeadline deadline) = 0;
    // Stops renewing the lease without revoking it: the store deletes its keys when its TTL
    // runs out, as it would for a process that died.
    virtual void stop_keepalive(LeaseId lease) = 0;
    // Leases the renewal found gone (expired, revoked elsewhere, or unrenewed past their TTL)
    // since the last call. Never blocks.
    virtual std::vector<LostLease> poll_lost_leases() = 0;
    // Events of every key under `prefix` from `from_revision` on (0: from now). Returns once the
    // store has accepted the watch.
    virtual std::unique_ptr<StoreWatch> watch_prefix(std::string_view prefix, std::int64_t from_revision,
                                                     StoreDeadline deadline) = 0;
    // The store's address, as errors name it (e.g. "etcd http://127.0.0.1:2379").
    virtual const std::string& address() const = 0;
};

}  // namespace rdmachan::handshake
