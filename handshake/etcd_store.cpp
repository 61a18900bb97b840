#include "handshake/etcd_store.hpp"

#include <condition_variable>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "handshake/crypto.hpp"
#include "handshake/etcd_client.hpp"
#include "handshake/etcd_watch.hpp"

namespace rdmachan::handshake {
namespace {

using Clock = std::chrono::steady_clock;

// Longest a renewal waits for etcd before trying again: it also bounds how long the store's
// destructor waits for the renewal thread.
constexpr std::chrono::milliseconds renewal_attempt_limit(1000);

class EtcdStore final : public MembershipStore {
  public:
    explicit EtcdStore(const EtcdSettings& settings) : client_(std::make_shared<EtcdClient>(settings)) {
        renewal_thread_ = std::thread([this] { renew_leases(); });
    }

    ~EtcdStore() override {
        {
            std::lock_guard lock(mutex_);
            stopping_ = true;
        }
        wake_.notify_all();
        renewal_thread_.join();
    }

    LeaseId grant_lease(std::chrono::seconds ttl, StoreDeadline deadline) override {
        const AnswerReader reader(client_->context("grant", "") + " lease of " + std::to_string(ttl.count()) + " s", prefix());
        if (ttl.count() < 1) throw Error(reader.context() + ": the TTL must be at least 1 s");
        const nlohmann::json answer = client_->call("/v3/lease/grant", {{"TTL", std::to_string(ttl.count())}}, reader, deadline);
        reader.header_revision(answer);
        const LeaseId lease = reader.integer(answer, "", "ID", true);
        if (lease <= 0) reader.refuse("ID", "is not a positive lease id");
        const std::int64_t granted = reader.integer(answer, "", "TTL", true);
        if (granted < 1) reader.refuse("TTL", "is below 1 s");
        const auto now = Clock::now();
        {
            std::lock_guard lock(mutex_);
            kept_[lease] = KeptLease{std::chrono::seconds(granted), now, now + renewal_period(std::chrono::seconds(granted))};
        }
        wake_.notify_all();
        return lease;
    }

    std::int64_t put(std::string_view key, std::string_view value, LeaseId lease, StoreDeadline deadline) override {
        const AnswerReader reader(client_->context("put", key), prefix());
        nlohmann::json request = {{"key", base64_encode(prefix() + std::string(key))}, {"value", base64_encode(value)}};
        if (lease != 0) request["lease"] = std::to_string(lease);
        return reader.header_revision(client_->call("/v3/kv/put", request, reader, deadline));
    }

    std::int64_t put_all(const std::vector<KeyValue>& entries, LeaseId lease, StoreDeadline deadline) override {
        if (entries.empty() || entries.size() > kMaxKeysPerTransaction)
            throw Error(client_->context("put", "") + ": " + std::to_string(entries.size()) +
                        " keys in one transaction: it takes 1 to " + std::to_string(kMaxKeysPerTransaction));
        const AnswerReader reader(
            client_->context("put", entries.front().key) + " and " + std::to_string(entries.size() - 1) + " more keys",
            prefix());
        nlohmann::json operations = nlohmann::json::array();
        for (const KeyValue& entry : entries) {
            nlohmann::json put = {{"key", base64_encode(prefix() + entry.key)}, {"value", base64_encode(entry.value)}};
            if (lease != 0) put["lease"] = std::to_string(lease);
            operations.push_back({{"request_put", std::move(put)}});
        }
        const nlohmann::json answer = client_->call("/v3/kv/txn", {{"success", std::move(operations)}}, reader, deadline);
        // No comparison: the transaction always takes its success branch.
        if (!reader.boolean(answer, "", "succeeded")) reader.refuse("succeeded", "is not true for a transaction without comparisons");
        return reader.header_revision(answer);
    }

    std::optional<StoreEntry> create(std::string_view key, std::string_view value, LeaseId lease,
                                     StoreDeadline deadline) override {
        const AnswerReader reader(client_->context("create", key), prefix());
        const std::string full_key = base64_encode(prefix() + std::string(key));
        nlohmann::json put = {{"key", full_key}, {"value", base64_encode(value)}};
        if (lease != 0) put["lease"] = std::to_string(lease);
        // A key that never existed, or was deleted, has create_revision 0.
        const nlohmann::json request = {
            {"compare", {{{"key", full_key}, {"target", "CREATE"}, {"result", "EQUAL"}, {"create_revision", "0"}}}},
            {"success", {{{"request_put", put}}}},
            {"failure", {{{"request_range", {{"key", full_key}}}}}}};
        const nlohmann::json answer = client_->call("/v3/kv/txn", request, reader, deadline);
        reader.header_revision(answer);
        if (reader.boolean(answer, "", "succeeded")) return std::nullopt;
        const auto responses = answer.find("responses");
        if (responses == answer.end() || !responses->is_array() || responses->size() != 1)
            reader.refuse("responses", "is not the one answer of the failed comparison's range");
        const nlohmann::json& response = responses->front();
        const auto found = response.is_object() ? response.find("response_range") : response.end();
        if (!response.is_object() || found == response.end() || !found->is_object())
            reader.refuse("responses[0].response_range", "is missing");
        std::vector<StoreEntry> entries = reader.entries(*found);
        // The key may have gone between the comparison and now only in another transaction; one
        // transaction sees one revision, so a failed comparison always finds the key.
        if (entries.size() != 1) reader.refuse("responses[0].response_range.kvs", "does not hold the one existing key");
        return std::move(entries.front());
    }

    StoreSnapshot get(std::string_view key, StoreDeadline deadline) override {
        const AnswerReader reader(client_->context("get", key), prefix());
        return range(reader, {{"key", base64_encode(prefix() + std::string(key))}}, deadline);
    }

    StoreSnapshot get_prefix(std::string_view key_prefix, StoreDeadline deadline) override {
        const AnswerReader reader(client_->context("get prefix", key_prefix), prefix());
        const std::string full = prefix() + std::string(key_prefix);
        return range(reader, {{"key", base64_encode(full)}, {"range_end", base64_encode(prefix_range_end(full))}},
                     deadline);
    }

    bool remove(std::string_view key, StoreDeadline deadline) override {
        const AnswerReader reader(client_->context("delete", key), prefix());
        const nlohmann::json answer =
            client_->call("/v3/kv/deleterange", {{"key", base64_encode(prefix() + std::string(key))}}, reader, deadline);
        reader.header_revision(answer);
        const std::int64_t deleted = reader.integer(answer, "", "deleted");
        if (deleted < 0 || deleted > 1) reader.refuse("deleted", "is not 0 or 1 for one key");
        return deleted == 1;
    }

    void revoke_lease(LeaseId lease, StoreDeadline deadline) override {
        stop_keepalive(lease);
        const AnswerReader reader(client_->context("revoke", "") + " lease " + std::to_string(lease), prefix());
        reader.header_revision(client_->call("/v3/lease/revoke", {{"ID", std::to_string(lease)}}, reader, deadline));
    }

    void stop_keepalive(LeaseId lease) override {
        std::lock_guard lock(mutex_);
        kept_.erase(lease);
    }

    std::vector<LostLease> poll_lost_leases() override {
        std::lock_guard lock(mutex_);
        std::vector<LostLease> lost;
        lost.swap(lost_);
        return lost;
    }

    std::unique_ptr<StoreWatch> watch_prefix(std::string_view key_prefix, std::int64_t from_revision,
                                             StoreDeadline deadline) override {
        if (from_revision < 0)
            throw Error(client_->context("watch", key_prefix) + ": revision " + std::to_string(from_revision) + " is negative");
        return start_etcd_watch(client_, prefix() + std::string(key_prefix), from_revision, deadline);
    }

    const std::string& address() const override { return client_->address().name; }

  private:
    struct KeptLease {
        std::chrono::seconds ttl;
        Clock::time_point last_renewed;
        Clock::time_point next_renewal;
    };

    static Clock::duration renewal_period(std::chrono::seconds ttl) {
        return std::chrono::duration_cast<Clock::duration>(ttl) / 3;
    }

    const std::string& prefix() const { return client_->settings().key_prefix; }

    StoreSnapshot range(const AnswerReader& reader, const nlohmann::json& request, StoreDeadline deadline) {
        const nlohmann::json answer = client_->call("/v3/kv/range", request, reader, deadline);
        StoreSnapshot snapshot;
        snapshot.revision = reader.header_revision(answer);
        snapshot.entries = reader.entries(answer);
        const std::int64_t count = reader.integer(answer, "", "count");
        if (count != static_cast<std::int64_t>(snapshot.entries.size()))
            reader.refuse("count", std::to_string(count) + " does not match the " +
                                       std::to_string(snapshot.entries.size()) + " entries sent");
        return snapshot;
    }

    // One renewal. Returns the TTL etcd granted again (0: the lease is gone); throws when etcd
    // could not be asked.
    std::int64_t renew(LeaseId lease) {
        const AnswerReader reader(client_->context("keepalive", "") + " lease " + std::to_string(lease), prefix());
        const nlohmann::json answer = client_->call("/v3/lease/keepalive", {{"ID", std::to_string(lease)}}, reader,
                                                    Clock::now() + renewal_attempt_limit);
        const auto result = answer.find("result");
        if (result == answer.end()) reader.refuse("result", "is missing");
        if (!result->is_object()) reader.refuse("result", "is not an object");
        reader.header_revision(*result, "result");
        if (reader.integer(*result, "result", "ID", true) != lease) reader.refuse("result.ID", "names another lease");
        const std::int64_t ttl = reader.integer(*result, "result", "TTL");
        if (ttl < 0) reader.refuse("result.TTL", "is negative");
        return ttl;
    }

    // The renewal thread: each kept lease every TTL/3; a failed renewal is tried again soon, and
    // the lease is reported lost once etcd says so or its TTL has passed since the last renewal.
    void renew_leases() {
        std::unique_lock lock(mutex_);
        while (!stopping_) {
            auto next = Clock::time_point::max();
            LeaseId due = 0;
            for (const auto& [lease, kept] : kept_) {
                if (kept.next_renewal < next) {
                    next = kept.next_renewal;
                    due = lease;
                }
            }
            if (due == 0 || next > Clock::now()) {
                if (due == 0)
                    wake_.wait(lock);
                else
                    wake_.wait_until(lock, next);
                continue;
            }
            lock.unlock();
            std::int64_t ttl = -1;
            std::string failure;
            try {
                ttl = renew(due);
            } catch (const Error& error) {
                failure = error.what();
            }
            lock.lock();
            const auto kept = kept_.find(due);
            if (kept == kept_.end()) continue;  // stopped or revoked meanwhile
            const auto now = Clock::now();
            if (ttl > 0) {
                kept->second.last_renewed = now;
                kept->second.next_renewal = now + renewal_period(kept->second.ttl);
            } else if (ttl == 0) {
                lost_.push_back({due, client_->address().name + ": lease " + std::to_string(due) +
                                          " is gone (expired or revoked), etcd says"});
                kept_.erase(kept);
            } else if (now - kept->second.last_renewed >= kept->second.ttl) {
                lost_.push_back({due, failure + " (not renewed for its whole TTL of " +
                                          std::to_string(kept->second.ttl.count()) + " s: etcd has let it expire)"});
                kept_.erase(kept);
            } else {
                kept->second.next_renewal = now + std::chrono::milliseconds(200);
            }
        }
    }

    std::shared_ptr<EtcdClient> client_;
    std::mutex mutex_;
    std::condition_variable wake_;
    std::map<LeaseId, KeptLease> kept_;
    std::vector<LostLease> lost_;
    bool stopping_ = false;
    std::thread renewal_thread_;
};

std::string environment(const char* name) {
    const char* value = std::getenv(name);
    return value == nullptr ? std::string() : std::string(value);
}

}  // namespace

EtcdSettings etcd_settings_from_environment(EtcdSettings given) {
    const auto fill = [](std::string& field, const char* variable) {
        if (field.empty()) field = environment(variable);
    };
    fill(given.endpoint, "RDMACHAN_ETCD");
    if (given.endpoint.empty()) {
        throw Error("no etcd address was given and RDMACHAN_ETCD is not set (expected http://host:port or https://host:port "
                    "of etcd)");
    }
    fill(given.key_prefix, "RDMACHAN_ETCD_PREFIX");
    fill(given.user, "RDMACHAN_ETCD_USER");
    fill(given.password, "RDMACHAN_ETCD_PASSWORD");
    fill(given.ca_file, "RDMACHAN_ETCD_CA_FILE");
    return given;
}

std::unique_ptr<MembershipStore> connect_etcd_store(const EtcdSettings& settings) {
    if (!settings.key_prefix.empty()) return std::make_unique<EtcdStore>(settings);
    EtcdSettings with_prefix = settings;
    with_prefix.key_prefix = kDefaultEtcdPrefix;
    return std::make_unique<EtcdStore>(with_prefix);
}

}  // namespace rdmachan::handshake
