// One member of an elastic run (rdmachan-demo --bootstrap etcd --elastic): joins the service
// through etcd (RDMACHAN_ETCD, RDMACHAN_ETCD_PREFIX), then, round after round, writes a slice
// into every member's inbox and reads it back, checking every byte, until the launcher writes
// a line to its standard input (or closes it); then it leaves. It runs at nice 5, below etcd's
// priority: here etcd shares the cores with every busy member. Everything it sees goes to standard output as
// JSON events, one per line, stamped with the host's monotonic clock.
#pragma once

#include "examples/demo/demo_options.hpp"

namespace demo {

// The capacity every member is built with: the most member ids held at once. Twice --peers' limit:
// a killed member holds its id until its lease runs out, while a newcomer already joins.
inline constexpr std::uint32_t kElasticCapacity = 128;

// Exit status 0 when every byte read back was the one written; 1 otherwise, or on an error.
int run_elastic_member(const Options& options);

}  // namespace demo
