#!/usr/bin/env bash
# Repeats the multi-process and multi-threaded suites under CPU load until a failure, to find
# the rare ones: the Channel, MultiChannel RC and DC, software-device, fault-injection,
# partition, backpressure, demo, pairwise, rendezvous and peer-replacement (TCP and PMIx) suites
# (the list in `suites` below), as CTest runs them (two at a time), with busy loops competing for
# the cores.
# Stops at the first failing round and keeps its output in build/soak/failures/ROUND/: ctest's
# log, LastTest.log, and in flight-records/ the flight records the round's failed tests and error
# completions wrote (tests/flight_record_listener.cpp; passed runs remove their own). Exit status
# 0 only if every round passed.
#
# At the end it prints the figure as the block "soak" of docs/RELIABILITY.md, stamped with the
# commit it ran on, and writes it there. scripts/check_figures.sh treats that block as the record
# of a run, not a figure of the current code: it fails if the stamped commit is not in the
# repository or was printed from uncommitted code (-dirty), and when the code the soak runs has
# changed since that commit it says so without failing (the figure is of that commit).
#   scripts/soak.sh [runs] [minutes]     (defaults: 200 rounds, at most 60 minutes)
#   SOAK_LOAD=N busy loops (default: one per core)
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${1:-200}"
minutes="${2:-60}"
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "soak: runs must be a positive number, got '$runs'" >&2; exit 2; }
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || { echo "soak: minutes must be a positive number, got '$minutes'" >&2; exit 2; }
build="$root/build/soak"
suites='^(channel_test|channel_processes_test|multi_channel_test|multi_channel_test_dc|multi_channel_processes_test|multi_channel_processes_dc_test|multi_channel_dc_test|soft_.*|fault_injection_test|partition_processes_test|backpressure_test|demo_test|handshake_pairwise_test|handshake_rendezvous_test|peer_replacement_test|pmix_replacement_(rc|dc|twice_rc|twice_dc)_4|pmix_replacement_(disabled|stale|live|impostor))$'

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

# Every test writes its flight records here; emptied before each round.
records="$build/flight-records"
export RDMACHAN_FLIGHT_RECORD_DIR="$records"
commit=$(git -C "$root" rev-parse --short=7 HEAD)
git -C "$root" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude,glob)**/*.md' || commit="$commit-dirty"

deadline=$(($(date +%s) + minutes * 60))
started=$(date +%s)
round=0
failures=0
tests_per_round=0
while [ "$round" -lt "$runs" ] && [ "$(date +%s)" -lt "$deadline" ]; do
    round=$((round + 1))
    log="$build/round.log"
    rm -rf "$records"
    mkdir -p "$records"
    if ! ctest --test-dir "$build" -j 2 -R "$suites" --output-on-failure >"$log" 2>&1; then
        kept="$build/failures/$round"
        rm -rf "$kept"  # an earlier run's failure at the same round
        mkdir -p "$kept"
        cp "$log" "$kept/ctest.log"
        cp "$build/Testing/Temporary/LastTest.log" "$kept/" 2>/dev/null || true
        cp -r "$records" "$kept/flight-records"
        echo "soak: round $round FAILED after $(($(date +%s) - started)) s; output kept in $kept:"
        grep -E '\*\*\*|Failed|Timeout' "$log" | head -n 20
        echo "soak: its flight records: $(cd "$kept/flight-records" && ls | tr '\n' ' ')"
        failures=1
        break
    fi
    tests_per_round=$(grep -cE 'Test +#[0-9]+:' "$log")
    echo "soak: round $round passed ($tests_per_round tests)"
done
elapsed=$(($(date +%s) - started))
echo "soak: $round rounds, $failures failures, $elapsed s, under ${#load[@]} busy loops on $(nproc) cores"

if [ "$failures" -ne 0 ]; then
    ending="stopped at the failing round $round"
elif [ "$round" -ge "$runs" ]; then
    ending="ran all $runs rounds"
else
    ending="stopped at its $minutes-minute limit"
fi
block="_Printed by \`scripts/soak.sh\` at commit $commit._

\`scripts/soak.sh $runs $minutes\` ($(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, $(uname -r)): **$round rounds, $failures failures** in $elapsed s; each round runs the $tests_per_round multi-process and threaded suites above as CTest does, two at a time, under ${#load[@]} busy loops at nice 10; it $ending."
printf '%s\n' "$block"
python3 - "$root/docs/RELIABILITY.md" "$block" <<'PY'
import re, sys
document, body = sys.argv[1], sys.argv[2]
text = open(document).read()
pattern = re.compile(r"(<!-- generated: soak -->\n).*?(<!-- end: soak -->)", re.S)
if not pattern.search(text):
    sys.exit("soak: %s has no block named soak" % document)
open(document, "w").write(pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))
PY
echo "soak: block 'soak' of docs/RELIABILITY.md written" >&2
exit "$failures"
