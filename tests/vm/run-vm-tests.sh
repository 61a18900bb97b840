#!/bin/bash
# run-vm-tests.sh — build the in-VM test programs, boot the soft-RoCE VM once, run them all
# inside, and exit non-zero if any failed or the VM could not run them (never a silent skip).
#
# Usage:
#   run-vm-tests.sh [--build-dir DIR] [--no-build] [--work-dir DIR] [--timeout S] [program...]
#   --build-dir DIR  CMake build directory (default: build-vm beside this repository's root).
#                    Unless --no-build, it is configured if needed and the programs' targets
#                    are built with -j2. Without programs: DIR/tests/verbs/verbs_rxe_test.
#   --no-build       take the programs as given (CTest passes the built files this way).
#   --work-dir DIR   read-write directory shared with the guest (logs, runner); default
#                    DIR/vm-work. The programs themselves are read through the host root.
#   --timeout S      limit for the whole VM run (default 600).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
source_dir=$(cd "$here/../.." && pwd)
build_dir=$source_dir/build-vm
build=1
work_dir=
timeout_seconds=600
programs=()
while [ $# -gt 0 ]; do
    case $1 in
        --build-dir) build_dir=$(realpath -m "$2"); shift 2 ;;
        --no-build) build=0; shift ;;
        --work-dir) work_dir=$(realpath -m "$2"); shift 2 ;;
        --timeout) timeout_seconds=$2; shift 2 ;;
        -*) echo "run-vm-tests: unknown option $1" >&2; exit 2 ;;
        *) programs+=("$(realpath -m "$1")"); shift ;;
    esac
done
[ ${#programs[@]} -gt 0 ] || programs=("$build_dir/tests/verbs/verbs_rxe_test")
work_dir=${work_dir:-$build_dir/vm-work}

if [ "$build" = 1 ]; then
    if [ ! -f "$build_dir/build.ninja" ] && [ ! -f "$build_dir/Makefile" ]; then
        generator=()
        command -v ninja >/dev/null && generator=(-G Ninja)
        cmake -S "$source_dir" -B "$build_dir" "${generator[@]}" >&2
    fi
    targets=()
    for program in "${programs[@]}"; do targets+=(--target "$(basename "$program")"); done
    cmake --build "$build_dir" "${targets[@]}" -j2 >&2
fi

for program in "${programs[@]}"; do
    [ -x "$program" ] || { echo "run-vm-tests: FAILED: $program does not exist or is not executable" >&2; exit 1; }
done
# The guest sees the host's / read-only but not its /tmp. A checkout or build under /tmp (as a
# CI clone may be) is staged: the work directory moves under the cache, and the programs and
# the libraries they load from /tmp are copied there (the runner puts lib/ first).
stage_root=${RDMACHAN_VM_WORK:-${HOME:-/root}/.cache/rdmachan/vm-work}
case "$work_dir" in
    /tmp/*) work_dir="$stage_root/$(printf '%s' "$work_dir" | md5sum | cut -c1-12)" ;;
esac
mkdir -p "$work_dir"
rm -f "$work_dir"/result-*
staged=()
for program in "${programs[@]}"; do
    case "$program" in
        /tmp/*)
            mkdir -p "$work_dir/bin" "$work_dir/lib"
            cp -f "$program" "$work_dir/bin/"
            while read -r library; do
                cp -fL "$library" "$work_dir/lib/$(basename "$library")"
            done < <(ldd "$program" | awk '$3 ~ /^\/tmp\// {print $3}')
            staged+=("$work_dir/bin/$(basename "$program")")
            ;;
        *) staged+=("$program") ;;
    esac
done
programs=("${staged[@]}")

# The guest runs each program, keeps going after a failure so one boot reports everything,
# and writes one result file per program for the summary below.
cat >"$work_dir/guest-runner.sh" <<'RUNNER'
export LD_LIBRARY_PATH="$PWD/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
status=0
number=0
for program in "$@"; do
    number=$((number + 1))
    echo "=== run-vm-tests: $program"
    "$program"
    code=$?
    echo "$code $program" >"result-$number"
    [ "$code" = 0 ] || status=1
done
exit $status
RUNNER

set +e
"$here/rxe-vm.sh" --timeout "$timeout_seconds" --share "$work_dir" --log "$work_dir/console.log" -- \
    /bin/sh "$work_dir/guest-runner.sh" "${programs[@]}"
vm_status=$?
set -e

echo "--- run-vm-tests summary"
number=0
for program in "${programs[@]}"; do
    number=$((number + 1))
    if [ -f "$work_dir/result-$number" ]; then
        read -r code _ <"$work_dir/result-$number"
        [ "$code" = 0 ] && echo "passed  $program" || echo "FAILED  $program (exit $code)"
    else
        echo "NOT RUN $program"
    fi
done
case $vm_status in
    0) echo "run-vm-tests: all passed inside the VM" ;;
    124) echo "run-vm-tests: FAILED: the VM run exceeded ${timeout_seconds} s" ;;
    125) echo "run-vm-tests: FAILED: the VM could not run the tests (reason above; console log: $work_dir/console.log)" ;;
    *) echo "run-vm-tests: FAILED: a test failed inside the VM (exit $vm_status)" ;;
esac
exit $vm_status
