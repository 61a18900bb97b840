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
#   scripts/soak.sh [--continue] [runs] [minutes]   (defaults: 200 rounds, at most 60 minutes)
#   SOAK_LOAD=N busy loops (default: one per core)
# --continue adds rounds to the block's record instead of starting afresh, up to `runs` rounds in
# all, when a run cannot hold them (this machine's 2 cores take over an hour per 50 rounds): only
# when the record has no failure, the code it soaked is the code here (git diff of the soaked
# paths), its suites and load are this run's, and it ran on as many cores of the same kernel.
# The block then lists every run; its commit stays the record's, whose code all runs soaked.
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
continuing=0
if [ "${1:-}" = "--continue" ]; then
    continuing=1
    shift
fi
runs="${1:-200}"
minutes="${2:-60}"
[[ "$runs" =~ ^[1-9][0-9]*$ ]] || { echo "soak: runs must be a positive number, got '$runs'" >&2; exit 2; }
[[ "$minutes" =~ ^[1-9][0-9]*$ ]] || { echo "soak: minutes must be a positive number, got '$minutes'" >&2; exit 2; }
build="$root/build/soak"
suites='^(channel_test|channel_processes_test|multi_channel_test|multi_channel_test_dc|multi_channel_processes_test|multi_channel_processes_dc_test|multi_channel_dc_test|soft_.*|fault_injection_test|partition_processes_test|backpressure_test|demo_test|handshake_pairwise_test|handshake_rendezvous_test|peer_replacement_test|pmix_replacement_(rc|dc|twice_rc|twice_dc)_4|pmix_replacement_(disabled|stale|live|impostor))$'

commit=$(git -C "$root" rev-parse --short=7 HEAD)
git -C "$root" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude,glob)**/*.md' || commit="$commit-dirty"
load_count=${SOAK_LOAD:-$(nproc)}

# The record to continue: its commit, rounds, failures, seconds, busy loops, suites per round,
# cores, kernel and runs ("END ROUNDS SECONDS" each, ';' between).
previous_rounds=0
previous_seconds=0
previous_runs=""
if [ "$continuing" -eq 1 ]; then
    record=$(python3 - "$root/docs/RELIABILITY.md" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
block = re.search(r"<!-- generated: soak -->\n(.*?)<!-- end: soak -->", text, re.S)
if not block:
    sys.exit("soak: --continue: docs/RELIABILITY.md has no soak block")
body = block.group(1)
def find(pattern, what):
    found = re.search(pattern, body)
    if not found:
        sys.exit("soak: --continue: the soak block names no %s" % what)
    return found
commit = find(r"at commit ([0-9a-f]{7,40})\._", "clean commit").group(1)
figures = find(r"\*\*(\d+) rounds, (\d+) failures\*\* in (\d+) s", "rounds, failures and seconds")
machine = find(r"\(([0-9TZ:-]+), (\d+) cores, ([^)]+)\)", "date, cores and kernel")
loops = find(r"under (\d+) busy loops", "busy loops").group(1)
suites = find(r"runs the (\d+) multi-process", "suites per round").group(1)
listed = re.search(r"over \d+ runs \(([^)]*)\)", body)
runs = listed.group(1) if listed else "%s %s rounds %s s" % (machine.group(1), figures.group(1), figures.group(3))
print(commit, figures.group(1), figures.group(2), figures.group(3), loops, suites, machine.group(2),
      machine.group(3).replace(" ", "_"), runs.replace(" ", "+"))
PY
) || exit 2
    read -r previous_commit previous_rounds previous_failures previous_seconds previous_loops previous_suites \
        previous_cores previous_kernel previous_runs <<<"$record"
    previous_runs=${previous_runs//+/ }
    refuse() { echo "soak: --continue: $1; run without --continue to start a new record" >&2; exit 2; }
    [ "$previous_failures" -eq 0 ] || refuse "the record at $previous_commit has $previous_failures failures"
    [ "$previous_loops" -eq "$load_count" ] || refuse "the record ran under $previous_loops busy loops, this run would use $load_count"
    [ "$previous_cores" -eq "$(nproc)" ] || refuse "the record ran on $previous_cores cores, this machine has $(nproc)"
    [ "$previous_kernel" = "$(uname -r)" ] || refuse "the record ran on kernel $previous_kernel, this is $(uname -r)"
    [ "$previous_rounds" -lt "$runs" ] || refuse "the record has $previous_rounds rounds already, not fewer than $runs"
    [ "${commit%-dirty}" = "$commit" ] || refuse "the code here has uncommitted changes"
    git -C "$root" diff --quiet "$previous_commit" HEAD -- common src include transport handshake tests examples cmake \
        CMakeLists.txt || refuse "the code the soak runs changed between $previous_commit and HEAD"
    [ "$(git -C "$root" show "$previous_commit:scripts/soak.sh" | grep '^suites=')" = "$(grep '^suites=' "$root/scripts/soak.sh")" ] ||
        refuse "the suites changed since $previous_commit"
    commit=$previous_commit
fi

"$root/scripts/setup.sh" --build-only >&2
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build "$build" -j "$(nproc)" >/dev/null

load=()
stop_load() { for pid in "${load[@]}"; do kill "$pid" 2>/dev/null || true; done; }
trap stop_load EXIT
for _ in $(seq 1 "$load_count"); do
    nice -n 10 bash -c 'while :; do :; done' &
    load+=($!)
done

# Every test writes its flight records here; emptied before each round.
records="$build/flight-records"
export RDMACHAN_FLIGHT_RECORD_DIR="$records"

deadline=$(($(date +%s) + minutes * 60))
started=$(date +%s)
round=0
failures=0
tests_per_round=0
while [ $((previous_rounds + round)) -lt "$runs" ] && [ "$(date +%s)" -lt "$deadline" ]; do
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
        echo "soak: round $((previous_rounds + round)) FAILED after $(($(date +%s) - started)) s; output kept in $kept:"
        grep -E '\*\*\*|Failed|Timeout' "$log" | head -n 20
        echo "soak: its flight records: $(cd "$kept/flight-records" && ls | tr '\n' ' ')"
        failures=1
        break
    fi
    tests_per_round=$(grep -cE 'Test +#[0-9]+:' "$log")
    if [ "$continuing" -eq 1 ] && [ "$tests_per_round" -ne "$previous_suites" ]; then
        echo "soak: --continue: a round runs $tests_per_round suites, the record's ran $previous_suites" >&2
        exit 2
    fi
    echo "soak: round $((previous_rounds + round)) passed ($tests_per_round tests)"
done
elapsed=$(($(date +%s) - started))
echo "soak: $round rounds, $failures failures, $elapsed s, under ${#load[@]} busy loops on $(nproc) cores"

if [ "$failures" -ne 0 ]; then
    ending="stopped at the failing round $round"
elif [ $((previous_rounds + round)) -ge "$runs" ]; then
    ending="ran all $runs rounds"
else
    ending="stopped at its $minutes-minute limit"
fi
ended=$(date -u +%Y-%m-%dT%H:%MZ)
if [ "$continuing" -eq 1 ]; then
    head=$(git -C "$root" rev-parse --short=7 HEAD)
    separators=${previous_runs//[^;]/}
    run_count=$((${#separators} + 2))
    block="_Printed by \`scripts/soak.sh\` at commit $commit._

\`scripts/soak.sh --continue $runs $minutes\` ($ended, $(nproc) cores, $(uname -r)): **$((previous_rounds + round)) rounds, $failures failures** in $((previous_seconds + elapsed)) s over $run_count runs ($previous_runs; $ended $round rounds $elapsed s), the later ones at $head, whose soaked code is $commit's; each round runs the $tests_per_round multi-process and threaded suites above as CTest does, two at a time, under ${#load[@]} busy loops at nice 10; the last run $ending."
else
    block="_Printed by \`scripts/soak.sh\` at commit $commit._

\`scripts/soak.sh $runs $minutes\` ($ended, $(nproc) cores, $(uname -r)): **$round rounds, $failures failures** in $elapsed s; each round runs the $tests_per_round multi-process and threaded suites above as CTest does, two at a time, under ${#load[@]} busy loops at nice 10; it $ending."
fi
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
