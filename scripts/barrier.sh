#!/usr/bin/env bash
# Regenerates the barrier figures in docs/SCALE.md: the block between
# "<!-- generated: barrier -->" and "<!-- end: barrier -->" is replaced by what this prints.
# MultiChannel::barrier (dissemination: ceil(log2 N) RDMA writes per rank), RC and DC, and an
# all-to-all barrier on the public API (tests/multi_channel/barrier_benchmark), beside Open MPI's
# MPI_Barrier under mpirun (tests/multi_channel/mpi_barrier_benchmark), at 2 to 64 processes on
# this machine, in the same run. Each figure is the slowest rank's time per barrier.
#   scripts/barrier.sh [build-dir] [iterations]     (default: build-perf 200)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
iterations="${2:-200}"
case "$build_dir" in /*) ;; *) build_dir="$source_dir/$build_dir" ;; esac
document="$source_dir/docs/SCALE.md"
commit="$(git -C "$source_dir" rev-parse --short=7 HEAD)"
git -C "$source_dir" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude,glob)**/*.md' || commit="$commit-dirty"
worlds="2 4 8 16 32 64"

# MPI's headers, for the MPI side (mpirun comes with the test packages).
"$source_dir/scripts/setup.sh" libopenmpi-dev >/dev/null
"$source_dir/scripts/build_release.sh" "$build_dir" barrier_benchmark
"$source_dir/scripts/build_release.sh" "$build_dir" mpi_barrier_benchmark
ours="$build_dir/tests/multi_channel/barrier_benchmark"
theirs="$build_dir/tests/multi_channel/mpi_barrier_benchmark"

block="$(mktemp)"
runs="$(mktemp -d)"
trap 'rm -rf "$block" "$runs"' EXIT
for mode in rc dc; do
    # shellcheck disable=SC2086
    timeout 600 "$ours" --mode "$mode" --iterations "$iterations" $worlds >"$runs/$mode" 2>&1 ||
        echo "FAILED (exit $?)" >>"$runs/$mode"
done
for world in $worlds; do
    timeout 300 mpirun --allow-run-as-root --oversubscribe -np "$world" "$theirs" "$iterations" >>"$runs/mpi" 2>&1 ||
        echo "FAILED at $world ranks (exit $?)" >>"$runs/mpi"
done
{
    echo '```'
    echo "\$ scripts/barrier.sh    # $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ), $iterations barriers per figure"
    for mode in rc dc; do
        echo "\$ barrier_benchmark --mode $mode --iterations $iterations $worlds"
        cat "$runs/$mode"
    done
    echo "\$ mpirun --oversubscribe -np N mpi_barrier_benchmark $iterations    # N = $worlds; $(mpirun --version 2>&1 | head -1)"
    cat "$runs/mpi"
    echo '```'
    echo
    python3 - "$runs" <<'PY'
import os, re, sys
runs = sys.argv[1]
def ours(mode):
    figures = {}
    for line in open(os.path.join(runs, mode)):
        match = re.match(r"\s*(\d+)\s+([\d.]+)\s+(\d+) \((\d+)\)\s+([\d.]+)", line)
        if match:
            figures[int(match.group(1))] = (float(match.group(2)), int(match.group(3)), float(match.group(5)))
    return figures
rc, dc = ours("rc"), ours("dc")
mpi = {}
for line in open(os.path.join(runs, "mpi")):
    match = re.match(r"mpi_barrier ranks=(\d+) us_per_barrier=([\d.]+)", line)
    if match:
        mpi[int(match.group(1))] = float(match.group(2))
print("| N | messages per rank | RC, us | DC, us | all-to-all (RC), us | MPI_Barrier, us | RC / MPI |")
print("|---:|---:|---:|---:|---:|---:|---:|")
for world in sorted(set(rc) | set(dc) | set(mpi)):
    def cell(table, index):
        return "%.1f" % table[world][index] if world in table else "-"
    ratio = "%.2fx" % (rc[world][0] / mpi[world]) if world in rc and world in mpi and mpi[world] > 0 else "-"
    rounds = str(rc[world][1]) if world in rc else "-"
    print("| %d | %s | %s | %s | %s | %s | %s |" % (world, rounds, cell(rc, 0), cell(dc, 0), cell(rc, 2),
                                                 "%.1f" % mpi[world] if world in mpi else "-", ratio))
PY
} >"$block"
cat "$block"
"$source_dir/scripts/replace_block.py" "$document" barrier "$block" "_Printed by \`scripts/barrier.sh\` at commit $commit._"
echo "barrier: $document regenerated" >&2
