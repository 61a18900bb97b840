// A watch over etcd's streamed /v3/watch, on a thread of its own with its own io_context.
#pragma once

#include <memory>

#include "handshake/etcd_client.hpp"

namespace rdmachan::handshake {

// Starts the watch of every key under `full_prefix` (the store's key prefix included) from
// `from_revision` (0: now); returns once etcd has accepted it, or throws at the deadline naming
// the last reason.
std::unique_ptr<StoreWatch> start_etcd_watch(std::shared_ptr<EtcdClient> client, std::string full_prefix,
                                             std::int64_t from_revision, StoreDeadline deadline);

}  // namespace rdmachan::handshake
