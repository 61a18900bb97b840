// The local launcher: starts N peers of this program (`rdmachan-demo peer`, one process each)
// with the launcher environment set, hosts the rendezvous, shows progress from the peers'
// events, stops everyone at the first failure or the deadline, and prints the summary.
#pragma once

#include "examples/demo/demo_options.hpp"

namespace demo {

// The process exit code: 0 when every peer verified everything.
int run_local_job(const Options& options);

}  // namespace demo
