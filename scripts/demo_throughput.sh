#!/usr/bin/env bash
# The demo's aggregate throughput (issue 17's target: `rdmachan-demo` with its defaults, 4 local
# peers on the software device, at least 4 GB/s in all), as the README quotes it.
# Runs the Release `rdmachan-demo --json` RUNS times (default 3) per row, pinned to CPUS
# (default 0,1) like the other measuring scripts, and prints a markdown table of the medians of
# `aggregate_throughput_mb_s` (every rank's bytes written, read and sent, over the longest
# rank's workload time). Rows: the defaults (the target), then the same job with 1 MiB slices
# and with the same-host path off (RDMACHAN_SOFT_TRANSPORT=tcp), to show what bounds it.
#   scripts/demo_throughput.sh [build-dir]      (default: build-perf)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
runs="${RUNS:-3}"
cpus="${CPUS:-0,1}"
target_mb_s=4000

"$source_dir/scripts/build_release.sh" "$build_dir" rdmachan-demo
demo="$build_dir/examples/rdmachan-demo"

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# One row: label, transport, then the demo's options. Prints "median|every run".
measure() {
    local transport=$1
    shift
    local figures=()
    for _ in $(seq 1 "$runs"); do
        if ! RDMACHAN_SOFT_TRANSPORT=$transport taskset -c "$cpus" "$demo" --device soft --json "$@" \
            >"$work/run.json" 2>"$work/run.log"; then
            cat "$work/run.log" "$work/run.json" >&2
            echo "demo_throughput.sh: rdmachan-demo $* failed (output above)" >&2
            exit 1
        fi
        figures+=("$(python3 -c 'import json,sys; print("%.1f" % json.load(open(sys.argv[1]))["aggregate_throughput_mb_s"])' "$work/run.json")")
    done
    python3 - "${figures[@]}" <<'PY'
import statistics, sys
values = [float(v) for v in sys.argv[1:]]
print("%.1f|%s" % (statistics.median(values), ", ".join("%.1f" % v for v in values)))
PY
}

defaults=$(measure auto)
large=$(measure auto --size 1048576)
tcp=$(measure tcp)

median() { echo "${1%%|*}"; }
every() { echo "${1#*|}"; }
verdict=$(python3 -c "import sys; v=float(sys.argv[1]); t=float(sys.argv[2]); print('met' if v >= t else 'missed: %.2fx the target' % (v / t))" "$(median "$defaults")" "$target_mb_s")

echo "| rdmachan-demo (4 local peers, software device, RC) | aggregate MB/s, median | target | every run |"
echo "|---|---:|---|---|"
echo "| defaults (64 KiB slices, 20 iterations; same-host path) | $(median "$defaults") | >= $target_mb_s ($verdict) | $(every "$defaults") |"
echo "| 1 MiB slices (same-host path) | $(median "$large") | - | $(every "$large") |"
echo "| defaults, same-host path off (RDMACHAN_SOFT_TRANSPORT=tcp) | $(median "$tcp") | - | $(every "$tcp") |"
echo
echo "Medians of $runs runs; pinned with \`taskset -c $cpus\` (the 4 peers, each with its device thread, share those CPUs); MB = 10^6 bytes; every byte of every run verified by the demo."
