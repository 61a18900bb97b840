#!/usr/bin/env bash
# Times the PMIx bootstrap's endpoint exchange under mpirun with RANKS processes, each with an RC
# multi-channel on its own software device, and prints exactly one line:
#   pmix exchange: ranks=N seconds=X.XXX publish=P fence=F read=G endpoints=E start=S
# X is the slowest rank's time from its first PMIx_Put to its last PMIx_Get (publish, the fence
# with data collection, and reading every peer's endpoint), as measured inside the ranks
# (tests/pmix/pmix_exchange_benchmark.cpp); P, F and G are the slowest rank's time in each of the
# three phases (a different rank may be the slowest in each). E: devices (each rank's own RC
# multi-channel) or synthetic. S: launch (the clock starts at each rank's first put, so the
# fence includes waiting for the last rank the launcher started) or arrived (a fence without
# data first: the exchange alone).
# Exit 0; non-zero with the reason on stderr on failure.
#   scripts/pmix_exchange_benchmark.sh RANKS [BUILD_DIR] [--synthetic] [--arrived]
#     (default build dir: build-perf)
#   --synthetic  made-up endpoints, no devices (for more ranks than fit)
#   --arrived    start the clock once every rank has arrived
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
fail() { echo "pmix_exchange_benchmark: $*" >&2; exit 1; }
ranks="${1:-}"
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || fail "usage: $0 RANKS [BUILD_DIR] [--synthetic] [--arrived] (RANKS a positive number, got '$ranks')"
shift
build_dir=build-perf
if [ $# -gt 0 ] && [[ "$1" != --* ]]; then build_dir=$1; shift; fi
options=()
endpoints=devices
start=launch
for option in "$@"; do
    case "$option" in
        --synthetic) options+=(--synthetic); endpoints=synthetic ;;
        --arrived) options+=(--arrived); start=arrived ;;
        *) fail "unknown option '$option'" ;;
    esac
done

# libpmix-dev and mpirun (openmpi-bin) come with setup.sh; its messages go to stderr.
"$source_dir/scripts/setup.sh" >&2
command -v mpirun >/dev/null || fail "mpirun not found (Debian's openmpi-bin)"
"$source_dir/scripts/build_release.sh" "$build_dir" pmix_exchange_benchmark >&2
program="$build_dir/tests/pmix/pmix_exchange_benchmark"
[ -x "$program" ] || fail "$program was not built (was libpmix-dev found? see the configure output)"

output="$(mktemp)"
errors="$(mktemp)"
trap 'rm -f "$output" "$errors"' EXIT
if ! env -u RDMACHAN_BOOTSTRAP mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$program" "${options[@]}" \
        >"$output" 2>"$errors"; then
    cat "$errors" >&2
    fail "mpirun with $ranks ranks failed (output above)"
fi
reported="$(grep -c '^rank [0-9]* seconds ' "$output" || true)"
[ "$reported" -eq "$ranks" ] || fail "$reported of $ranks ranks reported a time"
awk -v ranks="$ranks" -v endpoints="$endpoints" -v start="$start" '$1 == "rank" && $3 == "seconds" {
        if ($4 > slowest) slowest = $4
        if ($8 > publish) publish = $8
        if ($10 > fence) fence = $10
        if ($12 > read) read = $12
    }
    END { printf "pmix exchange: ranks=%d seconds=%.3f publish=%.3f fence=%.3f read=%.3f endpoints=%s start=%s\n",
          ranks, slowest, publish, fence, read, endpoints, start }' "$output"
