#!/usr/bin/env bash
# Sets up, builds and runs the whole rdmachan test suite:
#   1. a RelWithDebInfo build: every suite, the golden-vector checks, the install test and the
#      soft-RoCE VM tests (label "vm");
#   2. an AddressSanitizer + UndefinedBehaviorSanitizer build: every suite except the VM tests;
#   3. a ThreadSanitizer build: every suite except the VM tests;
#   4. the handshake's libFuzzer targets, 30 s each (with the sanitizer builds).
# Usage: scripts/test.sh [--no-sanitizers] [--no-vm]
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"

sanitizers=1
vm=1
for argument in "$@"; do
    case "$argument" in
        --no-sanitizers) sanitizers=0 ;;
        --no-vm) vm=0 ;;
        *) echo "test: unknown option $argument" >&2; exit 2 ;;
    esac
done

"$root/scripts/setup.sh"

jobs=$(nproc)
failed=()
total_passed=0
total_failed=0
log=$(mktemp)
trap 'rm -f "$log"' EXIT

run_suite() {
    local name=$1 directory=$2 exclude=$3
    shift 3
    echo "=== $name: configure and build ($directory)"
    cmake -S "$root" -B "$directory" -G Ninja "$@" >/dev/null
    cmake --build "$directory" -j "$jobs"
    echo "=== $name: run"
    local exclude_arguments=()
    [ -n "$exclude" ] && exclude_arguments=(-LE "$exclude")
    local status=0
    # pipefail (set above) makes a failing ctest fail this pipeline.
    ctest --test-dir "$directory" --output-on-failure -j "$jobs" "${exclude_arguments[@]}" | tee "$log" || status=1
    # ctest's summary: "NN% tests passed, F tests failed out of T".
    local summary
    summary=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
    if [ -n "$summary" ]; then
        local suite_failed suite_total
        suite_failed=$(echo "$summary" | sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/')
        suite_total=$(echo "$summary" | sed -E 's/.* failed out of ([0-9]+).*/\1/')
        total_passed=$((total_passed + suite_total - suite_failed))
        total_failed=$((total_failed + suite_failed))
    else
        status=1
    fi
    [ "$status" -eq 0 ] || failed+=("$name")
}

main_exclude=""
[ "$vm" -eq 0 ] && main_exclude="vm"
run_suite "main build" "$root/build/test-main" "$main_exclude" -DCMAKE_BUILD_TYPE=RelWithDebInfo
if [ "$sanitizers" -eq 1 ]; then
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        run_suite "ASan+UBSan build" "$root/build/test-asan" "vm|install" \
        -DCMAKE_BUILD_TYPE=Debug -DRDMACHAN_SANITIZE_ADDRESS=ON
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
        run_suite "TSan build" "$root/build/test-tsan" "vm|install" \
        -DCMAKE_BUILD_TYPE=Debug -DRDMACHAN_SANITIZE_THREAD=ON
fi

if [ "$sanitizers" -eq 1 ]; then
    # The handshake's libFuzzer targets (endpoint parser, frame decoder), 30 s each.
    echo "=== fuzzers: build and run"
    if "$root/tests/handshake/run_fuzzers.sh" "$root/build/test-fuzz" 30; then
        total_passed=$((total_passed + 1))
    else
        total_failed=$((total_failed + 1))
        failed+=("fuzzers")
    fi
fi

if [ "${#failed[@]}" -gt 0 ]; then
    echo "test: FAILED in: ${failed[*]}" >&2
    echo "tests: $total_passed passed, $total_failed failed"
    exit 1
fi
echo "tests: $total_passed passed, $total_failed failed"
