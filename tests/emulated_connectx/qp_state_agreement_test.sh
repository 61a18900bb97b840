#!/usr/bin/env bash
# The two emulations of the kernel's ibv_modify_qp rules answer every case of the walk
# (qp_state_walk.hpp) alike: the emulated ConnectX, and libmlx5 on the fake uverbs kernel.
# Both judge by qp_state_rules.cpp; what this checks is everything around it: how each derives
# the current and next state, what reaches the rules, and that a refused modify leaves the QP
# where it was.
#   qp_state_agreement_test.sh EMULATED_WALK LIBMLX5_WALK
set -euo pipefail
emulated_output=$(mktemp)
libmlx5_output=$(mktemp)
# The emulated ConnectX names every refusal on stderr: shown only when something fails.
messages=$(mktemp)
trap 'rm -f "$emulated_output" "$libmlx5_output" "$messages"' EXIT
"$1" >"$emulated_output" 2>>"$messages" || { cat "$messages"; exit 1; }
"$2" >"$libmlx5_output" 2>>"$messages" || { cat "$messages"; exit 1; }
if ! diff -u "$emulated_output" "$libmlx5_output"; then
    echo "qp_state_agreement: the emulated ConnectX (-) and libmlx5 on the fake kernel (+) disagree"
    exit 1
fi
accepted=$(grep -c ': 0$' "$emulated_output" || true)
cases=$(grep -c ' mask ' "$emulated_output" || true)
refused=$((cases - accepted))
echo "qp_state_agreement: $cases cases alike, $accepted accepted, $refused refused"
# A walk that reached nothing, or accepted or refused everything, checks nothing.
if [ "$cases" -lt 1000 ] || [ "$accepted" -lt 50 ] || [ "$refused" -lt 50 ]; then
    echo "qp_state_agreement: too few cases of each answer"
    exit 1
fi
