#!/usr/bin/env bash
# The wait modes side by side, in one run on this machine (docs/PERFORMANCE.md, block
# "wait-modes"):
#   - idle wake latency and CPU while idle (tests/channel/idle_wake_benchmark): a receive waited
#     for while the peer sleeps 200 ms or 1 s, then sends; the same-host path with the machine
#     idle and with every CPU kept busy by spinning processes, and TCP; beside a process blocked
#     in read() on a pipe, measured the same way in the same run;
#   - the busy 8-byte RDMA write latency (rdmachan-bench, same host, median of RUNS runs of
#     each mode, the modes alternating), and adaptive's and event's ratio to spin's.
# Prints the block, with the targets: CPU while idle <= 0.1% of a core in adaptive and event
# mode; wake after 200 ms idle <= 2x the pipe; adaptive's busy latency <= 1.1x spin's.
#   scripts/wait_modes.sh [build-dir]        (default: build-perf)
# Environment: RUNS (default 3), ITERATIONS (default 20000), ROUNDS (default 15).
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
runs="${RUNS:-3}"
iterations="${ITERATIONS:-20000}"
rounds="${ROUNDS:-15}"

"$source_dir/scripts/build_release.sh" "$build_dir" idle_wake_benchmark >&2
"$source_dir/scripts/build_release.sh" "$build_dir" rdmachan-bench >&2
idle="$build_dir/tests/channel/idle_wake_benchmark"
bench="$build_dir/tools/bench/rdmachan-bench"
cpus=$(nproc)

echo '```'
echo "\$ scripts/wait_modes.sh    # $cpus cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
idle_output=$(mktemp)
trap 'rm -f "$idle_output"' EXIT
for run in "200 $rounds auto 0" "1000 $((rounds / 3 + 1)) auto 0" "200 $rounds auto $cpus" "200 $rounds tcp 0"; do
    read -r idle_ms count transport load <<<"$run"
    echo "\$ idle_wake_benchmark --idle-ms $idle_ms --rounds $count --transport $transport --load $load"
    status=0
    "$idle" --idle-ms "$idle_ms" --rounds "$count" --transport "$transport" --load "$load" | tee -a "$idle_output" || status=$?
    [ "$status" -eq 0 ] || echo "FAILED (exit $status)"
done
echo '```'
echo

# The idle targets, judged on each run's adaptive and event rows: CPU while idle <= 0.1% of a
# core in every run; the wake <= 2x the pipe in the runs idle for 200 ms.
echo "| idle target, per run | mode | measured | target | verdict |"
echo "|---|---|---:|---|---|"
awk '
    /^idle_wake_benchmark: idle/ { transport = $8; sub(/,$/, "", transport); run = $3 " ms idle, " transport ", " $9 " spinning"; idle_ms = $3 + 0 }
    ($1 == "adaptive" || $1 == "event") && $2 == "wake" {
        for (i = 1; i <= NF; ++i) {
            if ($i ~ /^x[0-9.]+$/) ratio = substr($i, 2) + 0
            if ($i == "cpu") cpu = $(i + 1) + 0
        }
        printf "| %s | %s | %.3f%% of a core | <= 0.1%% | %s |\n", run, $1, cpu,
               cpu <= 0.1 ? "met" : sprintf("missed by %.2fx", cpu / 0.1)
        if (idle_ms == 200)
            printf "| %s | %s | wake %.2fx the pipe | <= 2x | %s |\n", run, $1, ratio,
                   ratio <= 2 ? "met" : sprintf("missed by %.2fx", ratio / 2)
    }' "$idle_output"
echo

# The busy latency: the typical (median) one-way 8 B write latency of each run.
declare -A latencies=()
for ((run = 1; run <= runs; run++)); do
    for mode in spin adaptive event; do
        value=$("$bench" --test write --size 8 -n "$iterations" -w $((iterations / 10)) --wait "$mode" --format csv 2>/dev/null |
            awk -F, 'NR > 1 && $5 == 8 { print $9 }')
        latencies[$mode]="${latencies[$mode]:-} ${value:-FAILED}"
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{ v[NR] = $1 } END { print (NR ? v[int((NR + 1) / 2)] : "FAILED") }'; }
spin=$(median <<<"${latencies[spin]}")
echo "| busy 8 B RDMA write, same host, one-way | median of $runs runs (us) | each run (us) | x spin | target |"
echo "|---|---:|---|---:|---|"
for mode in spin adaptive event; do
    value=$(median <<<"${latencies[$mode]}")
    ratio=$(awk -v v="$value" -v s="$spin" 'BEGIN { if (v + 0 > 0 && s + 0 > 0) printf "%.2f", v / s; else print "-" }')
    target="-"
    if [ "$mode" = adaptive ]; then
        target=$(awk -v r="$ratio" 'BEGIN { print (r + 0 > 0 && r <= 1.1) ? "<= 1.1x: met" : "<= 1.1x: missed" }')
    fi
    echo "| $mode | $value |${latencies[$mode]} | $ratio | $target |"
done
