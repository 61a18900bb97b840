#!/usr/bin/env bash
# Instruction counts of the mlx5 data path (issue 9): builds the benchmark in a Release (-O3)
# build directory, runs it under callgrind counting only the measured post and poll calls, and
# prints the markdown table that docs/PERFORMANCE.md quotes.
#   scripts/instruction_counts.sh [build-dir]     (default: build-perf-o3)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf-o3}"
operations="${OPERATIONS:-1000000}"

"$source_dir/scripts/setup.sh" >/dev/null  # valgrind among the rest

"$source_dir/scripts/build_release.sh" "$build_dir" mlx5_data_path_benchmark
benchmark="$build_dir/tests/mlx5/mlx5_data_path_benchmark"

out_dir="$(mktemp -d)"
trap 'rm -rf "$out_dir"' EXIT
# Collection is off except inside the measured_* functions (one post or poll call each); the
# benchmark dumps the counters after each row.
valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*' \
    --callgrind-out-file="$out_dir/callgrind.out" "$benchmark" --operations "$operations" \
    2>"$out_dir/valgrind.log" || { cat "$out_dir/valgrind.log" >&2; exit 1; }

echo "compiler: $(${CXX:-c++} --version | head -n 1); build type Release ($(grep -m1 '^CMAKE_CXX_FLAGS_RELEASE' "$build_dir/CMakeCache.txt" | cut -d= -f2)); $(valgrind --version)"
echo
"$benchmark" --table "$out_dir/callgrind.out"
