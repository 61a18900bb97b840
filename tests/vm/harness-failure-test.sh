#!/bin/bash
# harness-failure-test.sh WORK_DIR — the VM harness must FAIL, with a reason, when the VM
# cannot start; a test run that silently passes or skips would hide a broken CI machine.
# Forces the failure with a kernel package that does not exist (no boot needed).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
work_dir=$1
rm -rf "$work_dir" && mkdir -p "$work_dir/cache"
echo linux-image-0.0.0-rdmachan-no-such-kernel >"$work_dir/cache/kernel-package"
export RDMACHAN_VM_CACHE=$work_dir/cache
failures=0
expect() {  # expect DESCRIPTION CONDITION...
    local description=$1; shift
    if "$@"; then echo "ok: $description"; else echo "FAILED: $description"; failures=$((failures + 1)); fi
}

"$here/rxe-vm.sh" --timeout 60 -- /bin/true >"$work_dir/vm.out" 2>"$work_dir/vm.err"
status=$?
expect "rxe-vm.sh exits 125 when the VM cannot start (got $status)" test "$status" = 125
expect "rxe-vm.sh names the reason" grep -q "cannot start the VM: apt-get download linux-image-0.0.0" "$work_dir/vm.err"

"$here/run-vm-tests.sh" --no-build --work-dir "$work_dir/share" /bin/true >"$work_dir/run.out" 2>&1
status=$?
expect "run-vm-tests.sh fails when the VM cannot start (got $status)" test "$status" != 0
expect "run-vm-tests.sh reports the program as not run" grep -q "NOT RUN .*/true" "$work_dir/run.out"
expect "run-vm-tests.sh says the VM could not run the tests" \
    grep -q "FAILED: the VM could not run the tests" "$work_dir/run.out"

if [ "$failures" != 0 ]; then
    echo "--- rxe-vm.sh stderr:"; cat "$work_dir/vm.err"
    echo "--- run-vm-tests.sh output:"; cat "$work_dir/run.out"
    exit 1
fi
