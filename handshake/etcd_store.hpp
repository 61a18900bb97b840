// The membership store over etcd v3's JSON gateway (etcd 3.4: POST /v3/kv/*, /v3/lease/*,
// /v3/watch streamed), through Boost.Beast's HTTP client.
#pragma once

#include <memory>
#include <string>

#include "handshake/membership_store.hpp"

namespace rdmachan::handshake {

struct EtcdSettings {
    // http://host:port or https://host:port (RDMACHAN_ETCD).
    std::string endpoint;
    // Every key of this job or service lives under it (RDMACHAN_ETCD_PREFIX); e.g. "rdmachan/job-7/".
    // Empty: kDefaultEtcdPrefix.
    std::string key_prefix;
    // etcd's user and password, when etcd has authentication enabled (RDMACHAN_ETCD_USER,
    // RDMACHAN_ETCD_PASSWORD); empty: no authentication.
    std::string user;
    std::string password;
    // https: the certificate authority that signed etcd's certificate (RDMACHAN_ETCD_CA_FILE);
    // empty: the system's default authorities.
    std::string ca_file;
};

inline constexpr const char* kDefaultEtcdPrefix = "rdmachan/";

// `given`, each field it leaves empty read from the variable named above (the one place they are
// read); throws rdmachan::Error when no endpoint is given and RDMACHAN_ETCD is unset.
EtcdSettings etcd_settings_from_environment(EtcdSettings given = {});

// Checks the settings (the endpoint's form) and returns the store; nothing is sent until the
// first call. Throws rdmachan::Error naming a malformed setting.
std::unique_ptr<MembershipStore> connect_etcd_store(const EtcdSettings& settings);

}  // namespace rdmachan::handshake
