#!/usr/bin/env bash
# rdmachan-bench over a size sweep (8 B .. 1 MiB): RDMA write, RDMA read and send, latency and
# bandwidth, RC and DC on the same-host path and RC on the TCP path (RDMACHAN_SOFT_TRANSPORT=tcp),
# 2 processes on this machine. Writes every run's CSV and a PNG plot of bandwidth and latency
# against message size, and prints markdown tables of the figures.
#   scripts/bench_sweep.sh [build-dir] [output-dir]     (defaults: build-perf, docs/performance)
# Environment: CPUS (default 0,1: both processes on these CPUs, as compare_ucx.sh runs them),
# LATENCY_ITERATIONS (default 1000), BANDWIDTH_ITERATIONS (default 2000), WINDOW (default 16
# requests per doorbell), WARMUP (iterations run and not measured before each size, passed to
# rdmachan-bench --warmup; default: as many as are measured).
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
output_dir="${2:-$source_dir/docs/performance}"
cpus="${CPUS:-0,1}"
latency_iterations="${LATENCY_ITERATIONS:-1000}"
bandwidth_iterations="${BANDWIDTH_ITERATIONS:-2000}"
window="${WINDOW:-16}"
# Unwarmed, the first size of a run is slow for hundreds of iterations (8 B sends: a median of
# 5.3 us over 1,000 against 1.1 us at 16 B, minimum 1.0 us): each size first runs as many
# unmeasured iterations as it measures, unless WARMUP says otherwise.
latency_warmup="${WARMUP:-$latency_iterations}"
bandwidth_warmup="${WARMUP:-$bandwidth_iterations}"

"$source_dir/scripts/setup.sh" gnuplot-nox >/dev/null
"$source_dir/scripts/build_release.sh" "$build_dir" rdmachan-bench
bench="$build_dir/tools/bench/rdmachan-bench"
mkdir -p "$output_dir"
csv_dir="$(mktemp -d)"
trap 'rm -rf "$csv_dir"' EXIT

# Three variants: RC and DC on the same-host path (RDMACHAN_SOFT_TRANSPORT=auto), and RC with it
# off (tcp: what two hosts would run); the file names carry the variant (rc, dc, rc-tcp).
for variant in rc dc rc-tcp; do
    mode=${variant%-tcp}
    transport=auto
    [ "$variant" = rc-tcp ] && transport=tcp
    for test in write read send; do
        RDMACHAN_SOFT_TRANSPORT=$transport taskset -c "$cpus" "$bench" -t "$test" -a -n "$latency_iterations" \
            -w "$latency_warmup" --mode "$mode" --format csv >"$csv_dir/$test-lat-$variant.csv"
        RDMACHAN_SOFT_TRANSPORT=$transport taskset -c "$cpus" "$bench" -t "$test" --bw -a -n "$bandwidth_iterations" \
            -w "$bandwidth_warmup" --window "$window" --mode "$mode" --format csv >"$csv_dir/$test-bw-$variant.csv"
    done
done
# Sends in DC mode go through engine-owned 16 KiB receive buffers: larger sends are refused by
# design (docs/ARCHITECTURE.md), so the DC send rows end at 16 KiB.

# One file with every row (the header once), kept beside the plot.
# Its first column says the path (same-host or tcp), which the bench's own columns do not.
{
    echo "path,$(head -n 1 "$csv_dir/write-lat-rc.csv")"
    for file in "$csv_dir"/*.csv; do
        path=same-host
        [[ $file == *-tcp.csv ]] && path=tcp
        tail -n +2 "$file" | sed "s/^/$path,/"
    done
} >"$output_dir/sweep.csv"

plot_lines() {  # plot_lines <kind> <column>: one line per test and mode
    local kind=$1 column=$2 separator=""
    for variant in rc dc rc-tcp; do
        for test in write read send; do
            printf '%s"%s" using 5:%s with linespoints title "%s %s"' "$separator" \
                "$csv_dir/$test-$kind-$variant.csv" "$column" "$test" "$(echo "$variant" | tr '[:lower:]' '[:upper:]' | sed 's/-TCP/, TCP path/')"
            separator=", "
        done
    done
}
gnuplot <<GNUPLOT
set terminal pngcairo size 1200,500 font "sans,10"
set output "$output_dir/sweep.png"
set datafile separator ","
set key autotitle columnhead
set logscale x 2
set xtics ("8 B" 8, "64 B" 64, "512 B" 512, "4 KiB" 4096, "32 KiB" 32768, "256 KiB" 262144, "1 MiB" 1048576)
set grid
set termoption noenhanced
set multiplot layout 1,2 title "rdmachan-bench on the software mlx5 device, 2 processes ($(uname -m), $(nproc) cores)"
set title "bandwidth (average)"
set xlabel "message size"
set ylabel "MB/s (10^6 bytes)"
set key top left
plot $(plot_lines bw 14)
set title "latency, typical (write, send: half the round trip; read: the round trip)"
set ylabel "microseconds"
set logscale y 10
set key top left
plot $(plot_lines lat 9)
unset multiplot
GNUPLOT

python3 - "$csv_dir" <<'PY'
import csv, os, sys
directory = sys.argv[1]
def rows(name):
    with open(os.path.join(directory, name)) as f:
        return {int(r["bytes"]): r for r in csv.DictReader(f)}
def size(b):
    return "%d MiB" % (b >> 20) if b >= 1 << 20 else "%d KiB" % (b >> 10) if b >= 1024 else "%d B" % b
for kind, title, column, unit in (("lat", "Latency, typical (median)", "t_typical_us", "us"),
                                  ("bw", "Bandwidth, average", "bw_average_mb_s", "MB/s")):
    tables = {(t, m): rows("%s-%s-%s.csv" % (t, kind, m)) for m in ("rc", "dc", "rc-tcp") for t in ("write", "read", "send")}
    sizes = sorted(set().union(*[set(t) for t in tables.values()]))
    print("%s (%s):" % (title, unit))
    print()
    if kind == "lat":
        # Measured as perftest does: a write or send latency is half a ping-pong's round trip,
        # a read's is the whole round trip (one request, one response).
        print("Write and send latency is one-way (half the ping-pong round trip); read latency is the full round trip.")
        print()
    def label(t, m):
        name = "%s %s" % (t, "RC, TCP path" if m == "rc-tcp" else m.upper())
        if kind != "lat": return name
        return "%s (%s)" % (name, "round trip" if t == "read" else "half round trip")
    print("| bytes | " + " | ".join(label(t, m) for (t, m) in tables) + " |")
    print("|---:|" + "---:|" * len(tables))
    for b in sizes:
        cells = ["%.1f" % float(tables[k][b][column]) if b in tables[k] else "-" for k in tables]
        print("| %s | %s |" % (size(b), " | ".join(cells)))
    print()
PY
