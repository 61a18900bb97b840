#!/usr/bin/env bash
# Repeats the multi-process and multi-threaded suites under CPU load until a failure, to find
# the rare ones (issue 20): the Channel, MultiChannel RC and DC, software-device, fault-injection
# and demo suites, as CTest runs them (two at a time), with busy loops competing for the cores.
# Stops at the first failing round and keeps its output in build/soak/failures/ROUND/ (ctest's
# log and each failed test's output). Exit status 0 only if every round passed.
#   scripts/soak.sh [runs] [minutes]     (defaults: 200 rounds, at most 60 minutes)
#   SOAK_LOAD=N busy loops (default: one per core)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-200}"
minutes="${2:-60}"
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "soak: runs must be a positive number, got '$runs'" >&2; exit 2; }
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || { echo "soak: minutes must be a positive number, got '$minutes'" >&2; exit 2; }
build="$root/build/soak"
suites='^(channel_test|channel_processes_test|multi_channel_test|multi_channel_test_dc|multi_channel_processes_test|multi_channel_processes_dc_test|multi_channel_dc_test|soft_.*|fault_injection_test|partition_processes_test|backpressure_test|demo_test|handshake_pairwise_test|handshake_rendezvous_test)$'

"$root/scripts/setup.sh" --build-only >&2
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null

load=()
stop_load() { for pid in "${load[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_load EXIT
for _ in $(seq 1 "${SOAK_LOAD:-$(nproc)}"); do
    nice -n 10 bash -c 'while :; do :; done' &
    load+=($!)
done

deadline=$(($(date +%s) + minutes * 60))
started=$(date +%s)
round=0
while [ "$round" -lt "$runs" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    round=$((round + 1))
    log="$build/round.log"
    if ! ctest --test-dir "$build" -j 2 -R "$suites" --output-on-failure >"$log" 2>&1; then
        kept="$build/failures/$round"
        mkdir -p "$kept"
        cp "$log" "$kept/ctest.log"
        cp "$build/Testing/Temporary/LastTest.log" "$kept/" 2>/dev/null || true
        echo "soak: round $round FAILED after $(($(date +%s) - started)) s; output kept in $kept:"
        grep -E '\*\*\*|Failed|Timeout' "$log" | head -n 20
        exit 1
    fi
    echo "soak: round $round passed ($(grep -cE 'Test +#[0-9]+:' "$log") tests)"
done
echo "soak: $round rounds, 0 failures, $(($(date +%s) - started)) s, under ${#load[@]} busy loops on $(nproc) cores"
