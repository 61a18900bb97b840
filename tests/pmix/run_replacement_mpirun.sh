#!/usr/bin/env bash
# One scenario of tests/pmix/pmix_replacement_program.cpp under mpirun --enable-recovery:
#   run_replacement_mpirun.sh MPIRUN PROGRAM RANKS EXPECTED_VERDICTS SCENARIO [options...]
# With --enable-recovery mpirun outlives a killed rank and exits 0 whatever its ranks return,
# so every process writes its verdict into a results folder: the run passes when no verdict
# failed and EXPECTED_VERDICTS processes (survivors and replacements) said ok.
set -uo pipefail
mpirun=$1 program=$2 ranks=$3 expected=$4
shift 4
results=$(mktemp -d)
output=$(mktemp)
trap 'rm -rf "$results" "$output"' EXIT
env -u RDMACHAN_BOOTSTRAP "$mpirun" --allow-run-as-root --oversubscribe --enable-recovery -np "$ranks" \
    "$program" "$@" --results "$results" >"$output" 2>&1
status=$?
cat "$output"
failed=0
for verdict in "$results"/*.failed; do
    [ -e "$verdict" ] || continue
    echo "run_replacement_mpirun: $(basename "$verdict"): $(cat "$verdict")" >&2
    failed=1
done
# A sanitizer's report at a process's exit comes after its verdict, and mpirun does not pass on
# the exit status it causes: the output is searched for one.
if grep -E -q "WARNING: ThreadSanitizer|ERROR: AddressSanitizer|ERROR: LeakSanitizer|runtime error:" "$output"; then
    echo "run_replacement_mpirun: a sanitizer reported an error (above)" >&2
    failed=1
fi
ok=$(find "$results" -name '*.ok' | wc -l)
echo "run_replacement_mpirun: mpirun exited with $status; $ok of $expected verdicts ok: $(cd "$results" && ls | tr '\n' ' ')"
if [ "$failed" -ne 0 ] || [ "$ok" -ne "$expected" ]; then exit 1; fi
