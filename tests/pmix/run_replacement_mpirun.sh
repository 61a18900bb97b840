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
    "$program" "$@" --results "$results" >"$output" 2>&1 &
launcher=$!
# A run takes about a second; one still going after 150 s (ctest stops it at 180) is stuck: what
# each process of the job is doing is printed (every thread's kernel wait channel and state),
# with the output so far, before it is stopped, so a hang leaves a record to find its cause.
waited=0
while kill -0 "$launcher" 2>/dev/null && [ "$waited" -lt 1500 ]; do
    sleep 0.1
    waited=$((waited + 1))
done
if kill -0 "$launcher" 2>/dev/null; then
    echo "run_replacement_mpirun: mpirun still running after 150 s; the job's processes:" >&2
    for pid in $( (pgrep -f "$(basename "$program")"; pgrep -x prted; echo "$launcher") | sort -un); do
        [ "$pid" != "$$" ] && [ -d "/proc/$pid" ] || continue
        echo "  process $pid: $(tr '\0' ' ' <"/proc/$pid/cmdline" | cut -c1-160)" >&2
        for task in /proc/"$pid"/task/*; do
            echo "    thread ${task##*/} ($(cat "$task/comm" 2>/dev/null)): state $(awk '{print $3}' "$task/stat" 2>/dev/null), waiting in $(cat "$task/wchan" 2>/dev/null)" >&2
        done
        # The kernel's wait channel says that a thread waits, not for what: with gdb at hand, the
        # user-space stacks of the job's own processes too.
        if command -v gdb >/dev/null && [ "$pid" != "$launcher" ] && grep -q "$(basename "$program")" "/proc/$pid/cmdline" 2>/dev/null; then
            timeout 60 gdb -batch -nx -p "$pid" -ex "thread apply all bt 30" 2>/dev/null | grep -E '^(Thread|#)' | sed 's/^/      /' >&2
        fi
    done
    # mpirun's side: the descriptors each of its epoll sets watches, and its sockets' queues
    # (a request that sits unread on a socket no set watches: handshake/README.md, "A launcher
    # that never answers").
    for info in /proc/"$launcher"/fdinfo/*; do
        grep -q '^tfd' "$info" 2>/dev/null && echo "  mpirun epoll set ${info##*/} watches:$(grep -o 'tfd: *[0-9]*' "$info" | tr -s ' ' | cut -d' ' -f2 | tr '\n' ' ')" >&2
    done
    command -v ss >/dev/null && ss -tanp 2>/dev/null | grep "pid=$launcher," | sed 's/^/  /' >&2
    ls "$results" >&2
    kill -TERM "$launcher" 2>/dev/null
    sleep 2
    kill -KILL "$launcher" 2>/dev/null
    for pid in $(pgrep -f "$(basename "$program")"); do
        [ "$pid" != "$$" ] && kill -KILL "$pid" 2>/dev/null
    done
fi
wait "$launcher"
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
