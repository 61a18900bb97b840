// rdmachan-demo --bootstrap etcd --elastic: a service whose members join and leave while the
// others keep writing to every member and reading back what they wrote (elastic_member.hpp).
// It starts --peers members one by one, then --churn changes one second apart, in turn a member
// leaving (told on its standard input), a new one joining, a member killed (SIGKILL) and a new
// one joining, and at the end prints a table of the changes: when each was seen by every other
// member, and the members' aggregate traffic in the second before and after it. Exit status 1
// when a byte read back differed, a change was not seen by every member within 10 s, or a member
// not killed on purpose failed.
#pragma once

#include "examples/demo/demo_options.hpp"

namespace demo {

int run_elastic_job(const Options& options);

}  // namespace demo
