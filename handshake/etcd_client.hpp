// One request to etcd's gateway, answered or failed by its deadline: a fresh connection per
// request (nothing to go stale when etcd restarts), retried while etcd cannot be reached and
// time is left, and the authentication token fetched and refreshed when a user is configured.
// Shared by the store's caller, its lease renewal thread and its watches: thread-safe.
#pragma once

#include <mutex>
#include <nlohmann/json.hpp>
#include <string>

#include "handshake/etcd_answers.hpp"
#include "handshake/etcd_http.hpp"
#include "handshake/etcd_store.hpp"

namespace rdmachan::handshake {

class EtcdClient {
  public:
    explicit EtcdClient(EtcdSettings settings);

    const EtcdAddress& address() const { return address_; }
    const EtcdSettings& settings() const { return settings_; }
    // "etcd http://host:port: <operation> '<key>'", how every error of that call begins.
    std::string context(const char* operation, std::string_view key) const;

    // POSTs `request` to `target`; returns the answer of status 200 as a JSON object. Errors
    // begin with the reader's context.
    nlohmann::json call(const std::string& target, const nlohmann::json& request, const AnswerReader& reader,
                        StoreDeadline deadline);

    // The Authorization header's value ("" without a user), authenticating first if needed.
    std::string token(StoreDeadline deadline);
    // The token was refused: the next token() authenticates again.
    void forget_token(const std::string& refused);

  private:
    std::string authenticate(StoreDeadline deadline);

    EtcdSettings settings_;
    EtcdAddress address_;
    std::mutex token_mutex_;
    std::string token_;
};

// One POST on a fresh connection, ended by the deadline. Throws EtcdUnreachable (nothing was
// sent), EtcdConnectionLost, or EtcdDeadlinePassed.
HttpAnswer post_once(const EtcdAddress& address, const std::string& ca_file, const std::string& target,
                     std::string body, const std::string& token, StoreDeadline deadline);

// A refusal that means the token is no longer good (expired, or etcd restarted with another).
bool refuses_token(const HttpAnswer& answer);

}  // namespace rdmachan::handshake
