#!/usr/bin/env bash
# A failed test keeps its flight record: runs flight_recorder_test's demonstration
# case, which fails on purpose through a corrupted rkey, and checks that the run failed, that
# its output names the folder and files it kept, and that those hold the failed test's record
# (the test case's name, the error completion, the responder's refusal) and the automatic dump
# of the error completion.
#   flight_record_kept_test.sh PATH-OF-flight_recorder_test
set -euo pipefail
test_program="$1"
folder="$(mktemp -d)"
trap 'rm -rf "$folder"' EXIT

status=0
RDMACHAN_FLIGHT_RECORD_DIR="$folder" "$test_program" --no-skip --test-case='demonstration*' >"$folder/output" 2>&1 || status=$?
fail() { echo "flight_record_kept_test: $1"; echo "--- output of the demonstration:"; cat "$folder/output"; exit 1; }
[ "$status" -ne 0 ] || fail "the demonstration passed; it must fail (corrupted rkey)"
grep -q "flight records of this failed run (2 files) kept in $folder" "$folder/output" || fail "no line naming the kept files"
grep -q 'flight record of the failed test case "demonstration: a write through a corrupted rkey' "$folder/output" ||
    fail "no line naming the failed case's record"
grep -q "rdmachan: flight record (error completion on QP 0x[0-9a-f]*: remote access error (syndrome 0x13)) written to $folder/" \
    "$folder/output" || fail "no line naming the error completion's record"
mapfile -t kept < <(find "$folder" -name 'flight-*.txt' | sort)
[ "${#kept[@]}" -eq 2 ] || fail "expected 2 flight records in $folder, found ${#kept[@]}"
case_record=$(grep -l 'test case "demonstration: a write through a corrupted rkey fails this test on purpose" failed' "${kept[@]}") ||
    fail "no record of the failed test case"
for expected in 'channel.post_send' 'opcode=rdma_write ' 'nak_syndrome=0x13' 'status=remote_access_error' 'soft.qp_error' \
    'test.marker a=0 b=0 what="demonstration' 'end of flight record'; do
    grep -qF -- "$expected" "$case_record" || fail "the failed case's record lacks '$expected'"
done
echo "flight_record_kept_test: the failed run kept ${#kept[@]} records in its folder, the failed case's has its error"
