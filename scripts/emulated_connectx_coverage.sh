#!/usr/bin/env bash
# Coverage of the mlx5 binding and the DC control plane when the suites run on the emulated
# ConnectX: builds build/coverage with those three files instrumented for gcov, runs
# the emulated_connectx CTest label, and prints, per file, every function with its line
# coverage and every line left unexecuted. Exit status 1 if a function was never entered.
#
#   scripts/emulated_connectx_coverage.sh [build-dir]    (default build/coverage)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build/coverage}
files=(transport/verbs/mlx5_binding.cpp transport/verbs/mlx5_dc.cpp transport/provider/mlx5_dc_provider.cpp)

cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DRDMACHAN_EMULATED_COVERAGE=ON \
    ${CMAKE_CXX_COMPILER_LAUNCHER:+-DCMAKE_CXX_COMPILER_LAUNCHER=$CMAKE_CXX_COMPILER_LAUNCHER} >/dev/null
cmake --build "$build" -j"${JOBS:-2}" --target rdmachan_emulated_connectx emulated_connectx_refusal_test emulated_binding_test verbs_unit_test channel_test \
    channel_processes_test multi_channel_test multi_channel_processes_test multi_channel_dc_test demo_test \
    rdmachan-demo rdmachan-bench >/dev/null
objects="$build/CMakeFiles/rdmachan.dir"
find "$objects" -name '*.gcda' -delete
# The emulated suites, and verbs_unit_test (the ring mapping's refusals of layouts no device,
# real or emulated, hands out: it feeds filled-in mlx5dv structs).
ctest --test-dir "$build" -R '^verbs_unit_test$|emulated_connectx|emulated_binding' --output-on-failure \
    >"$build/emulated-coverage-ctest.log" 2>&1 || {
    echo "the emulated_connectx suites failed; see $build/emulated-coverage-ctest.log" >&2
    exit 2
}

report=$(mktemp -d)
trap 'rm -rf "$report"' EXIT
cd "$report"
status=0
for file in "${files[@]}"; do
    gcov --json-format --stdout -o "$objects/$file.o" "$root/$file" 2>/dev/null >"$report/coverage.json"
    # The file's own functions (not the header templates instantiated in it) and its lines.
    python3 - "$root/$file" "$file" "$report/coverage.json" <<'PY' || status=1
import json, sys
source_path, name, report = sys.argv[1], sys.argv[2], sys.argv[3]
source = open(source_path).read().splitlines()
functions, lines = [], {}
for document in (json.loads(line) for line in open(report) if line.strip()):
    for entry in document["files"]:
        if not entry["file"].endswith(name):
            continue
        functions += entry["functions"]
        for line in entry["lines"]:
            number = line["line_number"]
            lines[number] = lines.get(number, 0) + line["count"]
print(f"== {name}")
# GCC emits several symbols for one source function (complete and deleting destructors, ...):
# a function counts as entered when any of them was.
merged = {}
for function in functions:
    key = (function["start_line"], function["demangled_name"])
    merged[key] = merged.get(key, 0) + function["execution_count"]
never = 0
for (start_line, demangled), count in sorted(merged.items()):
    never += count == 0
    print(f"  {'ok   ' if count else 'NEVER'} {count:>8}x  line {start_line:>4}  {demangled}")
functions = list(merged)
unexecuted = sorted(number for number, count in lines.items() if count == 0)
print(f"  {len(functions) - never}/{len(functions)} functions entered; {len(lines) - len(unexecuted)}/{len(lines)} lines executed"
      + ("; not executed:" if unexecuted else ""))
for number in unexecuted:
    print(f"    {number:>4}: {source[number - 1].strip()}")
sys.exit(1 if never else 0)
PY
done
exit $status
