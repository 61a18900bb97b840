// A walk over ibv_modify_qp's cases that matter, through the public verbs API only, so that the
// same walk runs on both emulations of the kernel's rules: the emulated ConnectX (its exported
// ibv_* functions) and Debian's libibverbs and libmlx5 on the fake uverbs kernel. Each program
// prints one line per case; qp_state_agreement_test.sh compares the two outputs line by line.
#pragma once

#include <infiniband/verbs.h>

#include <cstdio>

namespace rdmachan::emulated {

// For an RC QP and a DCI, each in RESET, INIT, RTR, RTS and ERR (reached by the accepted path),
// every next state and every attribute mask of the list in qp_state_walk.cpp: one line
// "KIND FROM -> TO mask MASK: ERRNO" (0: accepted) to `out`. A QP that cannot be brought to the
// state a case starts from is a line saying so. Returns the number of cases walked.
int walk_modify_cases(ibv_context* context, ibv_pd* pd, ibv_cq* cq, std::FILE* out);

}  // namespace rdmachan::emulated
