#!/usr/bin/env bash
# What rdmachan::asio adds over a blocking wait, in instructions per operation (docs/PERFORMANCE.md,
# block "asio-instructions"): tests/asio/asio_instruction_benchmark under callgrind, counting only
# its measured_* functions on the calling thread, as scripts/instruction_counts.sh counts the other
# API rows. The completion is already there in every mode (the file's header says what each
# counts). Prints each mode's count, async_wait's excess over wait() against the target (<= 150),
# and where the excess goes: the functions of the initiate mode with the largest inclusive counts,
# read from the same callgrind output.
#   scripts/asio_instructions.sh [build-dir]      (default: build-perf)
# Environment: OPERATIONS (default 2000).
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
operations="${OPERATIONS:-2000}"
"$source_dir/scripts/setup.sh" valgrind >&2
"$source_dir/scripts/build_release.sh" "$build_dir" asio_instruction_benchmark >&2
benchmark="$build_dir/tests/asio/asio_instruction_benchmark"

out_dir="$(mktemp -d)"
trap 'rm -rf "$out_dir"' EXIT
declare -A per_operation=()
for mode in wait initiate round; do
    valgrind --tool=callgrind --collect-atstart=no --toggle-collect='*measured_*' \
        --callgrind-out-file="$out_dir/$mode.out" "$benchmark" --mode "$mode" --operations "$operations" \
        >"$out_dir/$mode.log" 2>&1 || { cat "$out_dir/$mode.log" >&2; exit 1; }
    total=$(callgrind_annotate "$out_dir/$mode.out" 2>/dev/null | awk '/PROGRAM TOTALS/ && !found { gsub(",", "", $1); print $1; found = 1 }')
    per_operation[$mode]=$(awk -v t="$total" -v n="$operations" 'BEGIN { printf "%.1f", t / n }')
done

boost=$(awk '/^#define BOOST_LIB_VERSION/ { gsub("\"", "", $3); print $3 }' /usr/include/boost/version.hpp)
echo "valgrind --tool=callgrind --toggle-collect='*measured_*' asio_instruction_benchmark --mode MODE --operations $operations"
echo "($(${CXX:-c++} --version | head -n 1); Boost ${boost/_/.}; Release build)"
echo
excess=$(awk -v a="${per_operation[initiate]}" -v w="${per_operation[wait]}" 'BEGIN { printf "%.1f", a - w }')
verdict=$(awk -v e="$excess" 'BEGIN { if (e <= 150) print "met"; else printf "missed, %.1fx the target", e / 150 }')
echo "| instructions per operation, completion already there | count | over wait() | target |"
echo "|---|---:|---:|---|"
echo "| PendingWork::wait() | ${per_operation[wait]} | - | - |"
echo "| AsyncChannel::async_wait inside run(): poll and post of the handler | ${per_operation[initiate]} | $excess | <= 150: $verdict |"
echo "| async_wait, restart() and run() from outside run(), until the handler ran | ${per_operation[round]} | $(awk -v a="${per_operation[round]}" -v w="${per_operation[wait]}" 'BEGIN { printf "%.1f", a - w }') | - |"
echo
# Where the initiate mode's instructions go: the largest inclusive costs below the measured
# function, per operation (a callee's count includes its own callees').
echo "Largest inclusive counts inside the measured async_wait, per operation:"
echo
echo "| function | instructions per operation |"
echo "|---|---:|"
# Callers of the measured function are listed with its count or more: only what it calls is kept.
# awk reads to the end: leaving early would end callgrind_annotate by SIGPIPE, failing the pipe.
callgrind_annotate --inclusive=yes "$out_dir/initiate.out" 2>/dev/null |
    awk -v n="$operations" '
        /^ *[0-9,]+ +/ && !done {
            count = $1; gsub(",", "", count); count += 0
            # "COUNT (PERCENT)  FILE:FUNCTION [OBJECT]", FILE "???" where there are no line tables.
            name = $0; sub(/^ *[0-9,]+ +\( *[0-9.]+%\) +/, "", name); sub(/ \[\/.*$/, "", name); sub(/^[^:]*:/, "", name)
            if (name ~ /PROGRAM TOTALS/ || count == 0) next
            if (name ~ /measured_async_wait/) { measured = count; next }
            if (measured == 0 || count >= measured) next
            gsub(/\|/, "\\|", name)
            if (length(name) > 110) name = substr(name, 1, 107) "..."
            printf "| `%s` | %.1f |\n", name, count / n
            if (++shown == 10) done = 1
        }'
