#!/usr/bin/env bash
# Builds the handshake's libFuzzer targets with clang in their own build directory and runs each
# for a bounded time. Exits non-zero if a fuzzer finds a crash, leak or sanitizer report.
# Usage: tests/handshake/run_fuzzers.sh [build-dir] [seconds-per-target] [all|build|run]
# (build: only build them, e.g. beside other work; run: only run what build built).
set -euo pipefail
source_dir="$(cd "$(dirname "$0")/../.." && pwd)"
build_dir="${1:-$source_dir/../build-handshake-fuzz}"
seconds="${2:-30}"
steps="${3:-all}"
case "$steps" in all | build | run) ;; *) echo "run_fuzzers: the third argument is all, build or run, not '$steps'" >&2; exit 2 ;; esac
if [ "$steps" != run ]; then
    # Line tables only (-g1): a finding's stack still names file and line. -O1, as libFuzzer's
    # documentation builds its targets: the parsers' files (nlohmann/json's templates under ASan,
    # UBSan and coverage instrumentation) compile in about half the time they took at -O2, for
    # about the same inputs per second.
    CC=clang CXX=clang++ cmake -S "$source_dir" -B "$build_dir" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
        "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
        -DRDMACHAN_FUZZ=ON -DRDMACHAN_BUILD_TOOLS=OFF -DRDMACHAN_WARNINGS_AS_ERRORS=ON >/dev/null
    cmake --build "$build_dir" -j2 --target handshake_fuzz_endpoint handshake_fuzz_frame handshake_fuzz_table
fi
[ "$steps" = build ] && exit 0
# Each fuzzer uses one core: all run at once, so the run takes `seconds`, not three times that.
pids=()
for target in endpoint frame table; do
    work="$build_dir/fuzz-$target"
    mkdir -p "$work/corpus"
    echo "fuzzing $target for ${seconds}s"
    "$build_dir/tests/handshake/handshake_fuzz_$target" -max_total_time="$seconds" \
        -artifact_prefix="$work/" "$work/corpus" "$source_dir/tests/handshake/corpus/$target" \
        >"$work/log.txt" 2>&1 &
    pids+=($!)
done
status=0
index=0
for target in endpoint frame table; do
    work="$build_dir/fuzz-$target"
    if wait "${pids[$index]}"; then
        # libFuzzer's last status line: "#RUNS DONE cov: EDGES ft: ...", then "Done RUNS runs in S second(s)".
        runs=$(sed -n 's/^Done \([0-9]*\) runs in \([0-9]*\) second.*/\1 inputs in \2 s/p' "$work/log.txt")
        edges=$(sed -n 's/^#[0-9]*[[:space:]]*DONE[[:space:]]*cov: \([0-9]*\).*/\1/p' "$work/log.txt" | tail -1)
        echo "fuzzer $target: ${runs:-? inputs}, ${edges:-?} coverage edges"
    else
        tail -40 "$work/log.txt"
        echo "fuzzer $target found a problem"
        status=1
    fi
    index=$((index + 1))
done
exit "$status"
