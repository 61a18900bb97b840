#!/usr/bin/env bash
# Times the PMIx bootstrap's endpoint exchange under mpirun with RANKS processes, each with an RC
# multi-channel on its own software device, and prints exactly one line:
#   pmix exchange: ranks=N seconds=X.XXX
# X is the slowest rank's time from its first PMIx_Put to its last PMIx_Get (publish, the fence
# with data collection, which includes waiting for the last rank to arrive, and reading every
# peer's endpoint), as measured inside the ranks (tests/pmix/pmix_exchange_benchmark.cpp).
# Exit 0; non-zero with the reason on stderr on failure.
#   scripts/pmix_exchange_benchmark.sh RANKS [BUILD_DIR]     (default build dir: build-perf)
#   --synthetic as a third argument: made-up endpoints, no devices (for more ranks than fit)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ranks="${1:-}"
build_dir="${2:-build-perf}"
mode="${3:-}"
fail() { echo "pmix_exchange_benchmark: $*" >&2; exit 1; }
[[ "$ranks" =~ ^[1-9][0-9]*$ ]] || fail "usage: $0 RANKS [BUILD_DIR] [--synthetic] (RANKS a positive number, got '$ranks')"
[ -z "$mode" ] || [ "$mode" = "--synthetic" ] || fail "unknown option '$mode'"

# libpmix-dev and mpirun (openmpi-bin) come with setup.sh; its messages go to stderr.
"$source_dir/scripts/setup.sh" >&2
command -v mpirun >/dev/null || fail "mpirun not found (Debian's openmpi-bin)"
"$source_dir/scripts/build_release.sh" "$build_dir" pmix_exchange_benchmark >&2
program="$build_dir/tests/pmix/pmix_exchange_benchmark"
[ -x "$program" ] || fail "$program was not built (was libpmix-dev found? see the configure output)"

output="$(mktemp)"
errors="$(mktemp)"
trap 'rm -f "$output" "$errors"' EXIT
if ! env -u RDMACHAN_BOOTSTRAP mpirun --allow-run-as-root --oversubscribe -np "$ranks" "$program" $mode \
        >"$output" 2>"$errors"; then
    cat "$errors" >&2
    fail "mpirun with $ranks ranks failed (output above)"
fi
reported="$(grep -c '^rank [0-9]* seconds ' "$output" || true)"
[ "$reported" -eq "$ranks" ] || fail "$reported of $ranks ranks reported a time"
awk -v ranks="$ranks" '$1 == "rank" && $3 == "seconds" { if ($4 > slowest) slowest = $4 }
    END { printf "pmix exchange: ranks=%d seconds=%.3f\n", ranks, slowest }' "$output"
