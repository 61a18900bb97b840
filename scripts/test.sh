#!/usr/bin/env bash
# Sets up, builds and runs the whole rdmachan test suite, each suite folder (tests/*) in one or two
# of three builds, so that none is compiled and run three times (two cores and CI's 20 minutes do
# not hold three builds of everything: they took 32.6 minutes at 5e5e0c5):
#
# | build | compiler, flags | test folders |
# |---|---|---|
# | main | GCC Release (-O3), the programs too | soft, channel, multi_channel, asio, mlx5, libmlx5, cuda, verbs (and the soft-RoCE VM), emulated_connectx, demo, bench, install, figures, layers, mutations |
# | ASan+UBSan | Clang Debug (-O0), no programs | soft, channel, multi_channel, asio, handshake, fault, pmix, verbs, emulated_connectx |
# | TSan | GCC -O1, no programs, no single-threaded checks | soft, channel, multi_channel, asio, handshake |
#
# Why this share: the software device, the channels and the Boost.Asio integration (every
# operation end to end between processes, the completion events) run in all three: the code
# users run at -O3, where a missing barrier between processes shows, and under both sanitizers.
# The handshake and its TCP, PMIx and etcd exchanges and fault injection run where memory and
# thread errors are found; the byte-level data-path checks (mlx5, libmlx5), the emulated ConnectX
# and the programs (rdmachan-demo, rdmachan-bench, examples) at -O3, and the emulated ConnectX
# and the verbs provider under ASan too. The mlx5 encoders' memory errors show under ASan through
# every channel suite, which drives them end to end.
# The main build also compiles the compile-only programs (the VM's verbs_rxe_test, the CUDA
# device object); the sanitizer builds leave them out (RDMACHAN_BUILD_COMPILE_ONLY_TESTS=OFF),
# and TSan the single-threaded checks (RDMACHAN_BUILD_SINGLE_THREADED_CHECKS=OFF: code that
# runs on one thread has no race to find). Every build compiles in unity batches of eight files
# (CMAKE_UNITY_BUILD); a user's build compiles each file alone, which the header check
# (rdmachan_test_headers) and the install test's consumer keep honest for the public headers.
# The handshake's libFuzzer targets run 20 s each beside the TSan tests' end.
# With --no-sanitizers there is one build, the main one, with every folder.
# In the optimised builds the suites' own code is compiled at -O0 (RDMACHAN_TEST_OPTIMIZATION,
# with its own precompiled header; the library, tools and benchmarks at the build's level).
# Each sanitizer build compiles at idle priority while the tests before it run (see
# start_background_build), so its build time overlaps them.
# Warnings are errors in all of them (RDMACHAN_WARNINGS_AS_ERRORS). At the end it prints where the
# time went: setup, each build's configure, compile and tests (with the slowest steps of each).
# It also writes build/test-summary.txt (the commit, each suite's counts, the fuzzers' figures and
# the timings), which scripts/reliability.sh turns into docs/RELIABILITY.md's figures.
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

# The code these results belong to ("-dirty": uncommitted changes outside docs/).
commit="$(git -C "$root" rev-parse --short=7 HEAD 2>/dev/null || echo unknown)"
[ "$commit" = unknown ] || git -C "$root" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude,glob)**/*.md' || commit="$commit-dirty"
summary_lines=()

setup_started=$(date +%s.%N)
"$root/scripts/setup.sh"
setup_finished=$(date +%s.%N)

jobs=$(nproc)
failed=()
total_passed=0
total_failed=0
log=$(mktemp)

# Where the time goes: one line per phase, printed again at the end.
timings=()
phase_started=0
start_phase() { phase_started=$(date +%s.%N); }
end_phase() {
    local seconds
    seconds=$(awk -v from="$phase_started" -v to="$(date +%s.%N)" 'BEGIN { print to - from }')
    timings+=("$(printf '%7.1f s  %s' "$seconds" "$1")")
}
timings+=("$(printf '%7.1f s  %s' "$(awk -v from="$setup_started" -v to="$setup_finished" 'BEGIN { print to - from }')" "setup (packages)")")

# The slowest compile and link steps of the build just run, from ninja's log (one line per
# step: start ms, end ms, mtime, output, hash); `first` is the line count before the build.
# The top five are cut by awk, which reads to the end: `head` would close the pipe early and,
# under pipefail, sort's SIGPIPE would end this script (it did, once the list was long enough);
# and grep finding no line (nothing rebuilt) would too.
report_slowest_steps() {
    local directory=$1 first=$2
    tail -n +"$((first + 1))" "$directory/.ninja_log" |
        awk '!/^#/ { printf "%6.1f s  %s\n", ($2 - $1) / 1000, $4 }' | sort -rn | awk 'NR <= 5 { print "    " $0 }'
}

# Compiling is CPU-bound and the tests mostly wait (deadlines, processes talking over sockets:
# the main build's tests used 37 s of CPU in 167 s). So each sanitizer build compiles while the
# tests before it run, at idle priority (SCHED_IDLE, or nice 19 where that is refused): it gets
# only the CPU time the tests leave, and a test's thread that wakes takes the CPU from it at once.
if chrt --idle 0 true 2>/dev/null; then
    idle_priority=(chrt --idle 0)
else
    idle_priority=(nice -n 19)
fi
background_pid=""
trap 'rm -f "$log"; [ -z "$background_pid" ] || kill "$background_pid" 2>/dev/null || true' EXIT

configure_suite() {
    local name=$1 directory=$2
    shift 2
    echo "=== $name: configure ($directory)"
    start_phase
    cmake -S "$root" -B "$directory" -G Ninja -DRDMACHAN_WARNINGS_AS_ERRORS=ON "$@" >/dev/null
    end_phase "$name: configure"
}

build_suite() {
    local name=$1 directory=$2
    echo "=== $name: build"
    local logged=0
    [ -f "$directory/.ninja_log" ] && logged=$(wc -l <"$directory/.ninja_log")
    start_phase
    cmake --build "$directory" -j "$jobs"
    end_phase "$name: build ($(($(wc -l <"$directory/.ninja_log") - logged)) steps)"
    echo "--- slowest build steps:"
    report_slowest_steps "$directory" "$logged"
}

# Starts the build at idle priority; finish_background_build waits for it. Its output goes to
# DIRECTORY/build-output.log (printed when it is waited for), its status and times to
# DIRECTORY/build-result.
start_background_build() {
    local name=$1 directory=$2
    echo "=== $name: build started at idle priority beside the tests before it"
    local logged=0
    [ -f "$directory/.ninja_log" ] && logged=$(wc -l <"$directory/.ninja_log")
    echo "$logged" >"$directory/build-ninja-start"
    rm -f "$directory/build-result"
    (
        started=$(date +%s.%N)
        status=0
        "${idle_priority[@]}" cmake --build "$directory" -j "$jobs" >"$directory/build-output.log" 2>&1 || status=$?
        echo "$status $started $(date +%s.%N)" >"$directory/build-result"
    ) &
    background_pid=$!
}

finish_background_build() {
    local name=$1 directory=$2
    echo "=== $name: build (waiting for it)"
    start_phase
    wait "$background_pid" || true
    background_pid=""
    end_phase "$name: build, the wait after the tests before it"
    local status=1 started=0 finished=0 logged
    [ -f "$directory/build-result" ] && read -r status started finished <"$directory/build-result"
    logged=$(cat "$directory/build-ninja-start")
    if [ "$status" -ne 0 ]; then
        cat "$directory/build-output.log"
        echo "test: the $name failed to build (output above)" >&2
        exit 1
    fi
    tail -n 1 "$directory/build-output.log"
    timings+=("$(printf '%7.1f s  %s' "$(awk -v from="$started" -v to="$finished" 'BEGIN { print to - from }')" \
        "$name: build ($(($(wc -l <"$directory/.ninja_log") - logged)) steps, at idle priority beside the tests before it)")")
    echo "--- slowest build steps:"
    report_slowest_steps "$directory" "$logged"
}

test_suite() {
    local name=$1 directory=$2 exclude=$3
    echo "=== $name: run"
    local exclude_arguments=()
    [ -n "$exclude" ] && exclude_arguments=(-LE "$exclude")
    local status=0
    start_phase
    # pipefail (set above) makes a failing ctest fail this pipeline.
    ctest --test-dir "$directory" --output-on-failure -j "$jobs" "${exclude_arguments[@]}" | tee "$log" || status=1
    end_phase "$name: tests"
    echo "--- slowest tests:"
    { grep -E 'Test +#[0-9]+:' "$log" || true; } | sed -E 's/.*Test +#[0-9]+: ([^ ]+) .* ([0-9.]+) sec$/\2 \1/' |
        sort -rn | awk 'NR <= 5 { printf "    %6.1f s  %s\n", $1, $2 }'
    # ctest's summary: "NN% tests passed, F tests failed out of T".
    local summary
    summary=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1 || true)
    if [ -n "$summary" ]; then
        local suite_failed suite_total
        suite_failed=$(echo "$summary" | sed -E 's/.* ([0-9]+) tests? failed out of ([0-9]+).*/\1/')
        suite_total=$(echo "$summary" | sed -E 's/.* failed out of ([0-9]+).*/\1/')
        total_passed=$((total_passed + suite_total - suite_failed))
        total_failed=$((total_failed + suite_failed))
        summary_lines+=("suite	$name	$((suite_total - suite_failed))	$suite_failed")
    else
        status=1
    fi
    [ "$status" -eq 0 ] || failed+=("$name")
}

main_name="main build (GCC, Release)"
asan_name="ASan+UBSan build (Clang, Debug)"
tsan_name="TSan build (GCC, -O1)"
main_exclude=""
# What the sanitizer runs leave out: the VM (a kernel's code, not ours, runs there), the install
# test (packaging), the figures' and the layers' checks (shell, git and Python only; label
# "layers": includes against docs/ARCHITECTURE.md's layer table), the "scale" variants (16 mpirun
# ranks, 256 rendezvous clients: the code of their smaller variants, in more processes) and the
# "repeat" ones (a PMIx rank replaced twice: the code of one replacement, run again), and the
# mutations' CI subset (label "mutations": it builds its own unsanitized Debug copy of HEAD).
sanitizer_exclude="vm|install|figures|layers|scale|repeat|mutations"
# Every build compiles in unity batches (cmake/CompileSpeed.cmake); the sanitizer builds leave
# out the compile-only programs and the programs (rdmachan-demo, rdmachan-bench, examples), which
# the main build compiles and runs.
unity=(-DCMAKE_UNITY_BUILD=ON -DCMAKE_UNITY_BUILD_BATCH_SIZE=8)
sanitizer_options=("${unity[@]}" -DRDMACHAN_BUILD_COMPILE_ONLY_TESTS=OFF -DRDMACHAN_BUILD_TOOLS=OFF)
# The folders each build compiles (the table at the top says why).
main_folders="all"
[ "$sanitizers" -eq 1 ] && main_folders="soft;channel;multi_channel;asio;mlx5;libmlx5;cuda;verbs;emulated_connectx;demo;bench;install;figures;layers;mutations"
asan_folders="soft;channel;multi_channel;asio;handshake;fault;pmix;verbs;emulated_connectx"
tsan_folders="soft;channel;multi_channel;asio;handshake"
[ "$vm" -eq 0 ] && main_exclude="vm"
# Line tables only (-g1) in every build: failures and sanitizer reports still name file and
# line, and an optimised build takes a quarter less time than with full debug information
# (measured on the slowest file: 15.6 s with -g, 11.6 s with -g1).
configure_suite "$main_name" "$root/build/test-main" \
    -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=Release -DCMAKE_CXX_FLAGS=-g1 "${unity[@]}" \
    "-DRDMACHAN_TEST_FOLDERS=$main_folders"
build_suite "$main_name" "$root/build/test-main"
if [ "$sanitizers" -eq 1 ]; then
    # The builds also cover the compilers users pick, so a new warning fails here rather than in
    # a user's build: GCC at -O3 (main, Release), Clang at -O0 (ASan+UBSan, Debug), GCC at -O1
    # (TSan: the level ThreadSanitizer needs at least; the CI's whole run must stay under 20
    # minutes on two cores, and at -O2 this build alone took 8.7 of them). Clang's warnings do
    # not depend on the optimisation level.
    configure_suite "$asan_name" "$root/build/test-asan" \
        -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=Debug -DCMAKE_CXX_FLAGS_DEBUG=-g1 -DRDMACHAN_SANITIZE_ADDRESS=ON \
        "${sanitizer_options[@]}" "-DRDMACHAN_TEST_FOLDERS=$asan_folders"
    start_background_build "$asan_name" "$root/build/test-asan"
fi
test_suite "$main_name" "$root/build/test-main" "$main_exclude"
if [ "$sanitizers" -eq 1 ]; then
    finish_background_build "$asan_name" "$root/build/test-asan"
    configure_suite "$tsan_name" "$root/build/test-tsan" \
        -DCMAKE_CXX_COMPILER=g++ -DCMAKE_BUILD_TYPE=RelWithDebInfo "-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG" \
        -DRDMACHAN_SANITIZE_THREAD=ON -DRDMACHAN_BUILD_SINGLE_THREADED_CHECKS=OFF \
        "${sanitizer_options[@]}" "-DRDMACHAN_TEST_FOLDERS=$tsan_folders"
    start_background_build "$tsan_name" "$root/build/test-tsan"
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1 \
        test_suite "$asan_name" "$root/build/test-asan" "$sanitizer_exclude"
    finish_background_build "$tsan_name" "$root/build/test-tsan"
    # The fuzzers build beside the TSan tests, like the sanitizer builds beside the tests before
    # them.
    echo "=== fuzzers: build started at idle priority beside the tests before it"
    ("${idle_priority[@]}" "$root/tests/handshake/run_fuzzers.sh" "$root/build/test-fuzz" 0 build \
        >"$root/build/fuzz-build.log" 2>&1) &
    fuzz_build_pid=$!
    TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1:suppressions=$root/tests/tsan.supp \
        test_suite "$tsan_name" "$root/build/test-tsan" "$sanitizer_exclude"
fi

if [ "$sanitizers" -eq 1 ]; then
    # The handshake's libFuzzer targets (endpoint parser, frame decoder, table), 20 s each, all
    # at once.
    echo "=== fuzzers: the rest of their build, and their run"
    start_phase
    fuzz_log=$(mktemp)
    fuzz_built=0
    wait "$fuzz_build_pid" && fuzz_built=1
    [ "$fuzz_built" -eq 1 ] || cat "$root/build/fuzz-build.log"
    if [ "$fuzz_built" -eq 1 ] && "$root/tests/handshake/run_fuzzers.sh" "$root/build/test-fuzz" 20 run | tee "$fuzz_log"; then
        total_passed=$((total_passed + 1))
        summary_lines+=("suite	fuzzers (libFuzzer, ASan+UBSan)	1	0")
    else
        total_failed=$((total_failed + 1))
        failed+=("fuzzers")
        summary_lines+=("suite	fuzzers (libFuzzer, ASan+UBSan)	0	1")
    fi
    # run_fuzzers.sh's "fuzzer TARGET: N inputs in S s, E coverage edges" lines.
    while IFS= read -r line; do summary_lines+=("fuzzer	${line#fuzzer }"); done < <(grep -E '^fuzzer [a-z]+: [0-9]+ inputs' "$fuzz_log" || true)
    rm -f "$fuzz_log"
    end_phase "fuzzers: the rest of their build, and their run"
fi

echo "=== where the time went"
printf '%s\n' "${timings[@]}"
printf '%7.1f s  total\n' "$(awk -v from="$setup_started" -v to="$(date +%s.%N)" 'BEGIN { print to - from }')"

total_seconds=$(awk -v from="$setup_started" -v to="$(date +%s.%N)" 'BEGIN { print to - from }')
{
    echo "commit	$commit"
    echo "date	$(date -u +%Y-%m-%dT%H:%MZ)"
    echo "machine	$(nproc) cores, $(uname -r)"
    echo "options	sanitizers=$sanitizers vm=$vm"
    printf '%s\n' "${summary_lines[@]}"
    for line in "${timings[@]}"; do echo "time	$line"; done
    echo "total	$total_seconds"
} >"$root/build/test-summary.txt"

if [ "${#failed[@]}" -gt 0 ]; then
    echo "test: FAILED in: ${failed[*]}" >&2
    echo "tests: $total_passed passed, $total_failed failed"
    exit 1
fi
echo "tests: $total_passed passed, $total_failed failed"
