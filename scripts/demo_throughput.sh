#!/usr/bin/env bash
# The demo's aggregate throughput (the target: `rdmachan-demo` with its defaults, 4 local peers on
# the software device, at least 4 GB/s in all), as the README quotes it.
# Runs the Release `rdmachan-demo --json` RUNS times (default 5) per row, pinned to CPUS
# (default 0,1) like the other measuring scripts, each run for SECONDS seconds of work (default
# 2, --duration: the defaults' 20 iterations are about 0.04 s, too short to give the same figure
# twice), and prints a markdown table of the medians of `aggregate_throughput_mb_s` (every rank's
# bytes written, read and sent, over the longest rank's workload time), their spread, and the
# cores the ranks' processes used (their CPU time over the workload time). Rows: the defaults
# (the target; adaptive waits), the same job with spin and with event waits, with 1 MiB slices,
# and with the same-host path off (RDMACHAN_SOFT_TRANSPORT=tcp), to show what bounds it.
#   scripts/demo_throughput.sh [build-dir]      (default: build-perf)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
runs="${RUNS:-5}"
seconds="${SECONDS_OF_WORK:-2}"
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
        if ! RDMACHAN_SOFT_TRANSPORT=$transport taskset -c "$cpus" "$demo" --device soft --json --duration "$seconds" "$@" \
            >"$work/run.json" 2>"$work/run.log"; then
            cat "$work/run.log" "$work/run.json" >&2
            echo "demo_throughput.sh: rdmachan-demo $* failed (output above)" >&2
            exit 1
        fi
        figures+=("$(python3 - "$work/run.json" <<'PY'
import json, sys
job = json.load(open(sys.argv[1]))
longest = max(rank["seconds"] for rank in job["ranks"])
cores = sum(rank["cpu_seconds"] for rank in job["ranks"]) / longest if longest > 0 else 0
print("%.1f/%.2f" % (job["aggregate_throughput_mb_s"], cores))
PY
)")
    done
    python3 - "${figures[@]}" <<'PY'
import statistics, sys
pairs = [tuple(float(x) for x in v.split("/")) for v in sys.argv[1:]]
values = [p[0] for p in pairs]
cores = [p[1] for p in pairs]
print("%.1f|%.1f-%.1f (%.0f%%)|%.2f|%s" % (statistics.median(values), min(values), max(values),
      100 * (max(values) - min(values)) / statistics.median(values), statistics.median(cores),
      ", ".join("%.1f" % v for v in values)))
PY
}

defaults=$(measure auto)
spin=$(measure auto --wait spin)
event=$(measure auto --wait event)
large=$(measure auto --size 1048576)
tcp=$(measure tcp)

field() { echo "$1" | cut -d'|' -f"$2"; }
median() { field "$1" 1; }
row() { echo "$(field "$1" 1) | $(field "$1" 2) | $(field "$1" 3) | $2 | $(field "$1" 4)"; }
verdict=$(python3 -c "import sys; v=float(sys.argv[1]); t=float(sys.argv[2]); print('met' if v >= t else 'missed: %.2fx the target' % (v / t))" "$(median "$defaults")" "$target_mb_s")

echo "| rdmachan-demo (4 local peers, software device, RC, ${seconds} s of work) | aggregate MB/s, median | spread (min-max, of the median) | cores used | target | every run |"
echo "|---|---:|---|---:|---|---|"
echo "| defaults (64 KiB slices; adaptive waits; same-host path) | $(row "$defaults" ">= $target_mb_s ($verdict)") |"
echo "| --wait spin | $(row "$spin" -) |"
echo "| --wait event | $(row "$event" -) |"
echo "| 1 MiB slices (same-host path) | $(row "$large" -) |"
echo "| defaults, same-host path off (RDMACHAN_SOFT_TRANSPORT=tcp) | $(row "$tcp" -) |"
echo
echo "Medians of $runs runs of ${seconds} s of work each (\`--duration $seconds\`); pinned with \`taskset -c $cpus\` (the 4 peers, each with its device thread, share those CPUs); cores used: the ranks' processes' CPU time over the longest rank's workload time; MB = 10^6 bytes; every byte of every run verified by the demo."
