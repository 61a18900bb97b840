#!/usr/bin/env bash
# The demo as the README shows it, under mpirun with no other set-up (PMIx bootstrap):
#   run_demo_mpirun.sh MPIRUN DEMO RANKS [demo peer options...]
# Passes when mpirun exits 0 and every one of RANKS ranks printed its verified summary.
set -uo pipefail
mpirun=$1 demo=$2 ranks=$3
shift 3
output=$(mktemp)
trap 'rm -f "$output"' EXIT
# No rendezvous and no token: a leftover RDMACHAN_RENDEZVOUS / JOB_TOKEN / BOOTSTRAP from the
# caller's environment must not be what makes it work.
env -u RDMACHAN_RENDEZVOUS -u RDMACHAN_JOB_TOKEN -u RDMACHAN_BOOTSTRAP \
    "$mpirun" --allow-run-as-root --oversubscribe -np "$ranks" "$demo" peer "$@" >"$output" 2>&1
status=$?
cat "$output"
verified=$(grep -c "^rdmachan-demo: $ranks peers, .*every byte verified" "$output")
if [ "$status" -ne 0 ]; then
    echo "run_demo_mpirun: mpirun exited with status $status" >&2
    exit 1
fi
if [ "$verified" -ne "$ranks" ]; then
    echo "run_demo_mpirun: $verified of $ranks ranks reported every byte verified" >&2
    exit 1
fi
echo "run_demo_mpirun: all $ranks ranks verified every byte"
