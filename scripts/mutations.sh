#!/usr/bin/env bash
# Applies each mutation kept in tests/mutations (a small patch whose header names the test that
# must catch it), rebuilds only that test, runs it, and prints a table: mutation, test, caught or
# not. The claims "a mutation ... fails test X" in the documents and commit messages are these
# patches, so each can be shown again.
#
# The patches never touch the working tree others edit: they are applied to a scratch copy of
# HEAD (a `git clone --shared` inside the folder, checked out at HEAD's commit; uncommitted
# changes are not in it) with its own build folder, and each is reverted after its test (also on
# failure or interrupt; the next run resets the copy to HEAD first in any case). The copy and its
# build are kept between runs, so a run rebuilds only what changed since the last one.
#
# A patch file: header lines, then the `git diff` the mutation is:
#   Mutation: what the patch breaks, in words
#   Caught by: TARGET [ARGUMENT]   the test program (a CMake target) and one optional argument
#                                  (a doctest filter such as --test-case=NAME*)
#   Claimed in: where the claim is made
#   Subset: ci                     optional: in CI's fast subset (CTest mutations_ci_test)
# A mutation is caught when its test exits non-zero. Before any mutation, each test named is run
# unmutated and must pass (else its rows say so and count as not shown); --no-baseline skips that
# (CTest's own run of the suite is the baseline in CI).
#
#   scripts/mutations.sh [--subset ci] [--folder DIR] [--no-baseline] [--write] [NAME ...]
#     --subset ci  only the patches marked "Subset: ci"
#     --folder     where the copy and its build live (default build/mutations)
#     --write      also replace docs/RELIABILITY.md's "mutations" block with the table
#     NAME         only these patches (file names without .patch); the table lists the others
#                  as not run
# Exit status: 0 every mutation run was caught; 1 one was not, or did not apply or build, or a
# baseline failed; 77 not a git checkout (the copy cannot be made).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
folder="$root/build/mutations"
subset=""
baseline=1
write=0
names=()
while [ $# -gt 0 ]; do
    case "$1" in
        --subset) subset=${2:?--subset needs a name}; shift 2 ;;
        --folder) folder=${2:?--folder needs a path}; shift 2 ;;
        --no-baseline) baseline=0; shift ;;
        --write) write=1; shift ;;
        -*) echo "mutations: unknown option $1" >&2; exit 2 ;;
        *) names+=("$1"); shift ;;
    esac
done

if ! git -C "$root" rev-parse --git-dir >/dev/null 2>&1; then
    echo "mutations: $root is not a git checkout: no copy of HEAD can be made" >&2
    exit 77
fi
head=$(git -C "$root" rev-parse HEAD)
# The code the table belongs to: HEAD's commit, always, since the copy is made from HEAD alone
# (uncommitted changes in the working tree are in neither the copy nor the table).
commit=$(git -C "$root" rev-parse --short=7 HEAD)

folder=$(realpath -m "$folder")  # the test programs are run from their own folders
copy="$folder/source"
build="$folder/build"
jobs=${RDMACHAN_MUTATION_JOBS:-$(nproc)}
mkdir -p "$folder"

# The copy: a clone sharing the repository's objects (nothing is written to the repository
# itself), reset to HEAD. `checkout -f` rewrites only the files that differ, so the build stays
# warm; `clean` drops whatever an interrupted run left.
if [ ! -d "$copy/.git" ]; then
    git clone -q --shared --no-checkout "$root" "$copy"
fi
git -C "$copy" checkout -q -f --detach "$head"
git -C "$copy" clean -q -f -d

# Whatever happens from here on, the copy ends as HEAD.
revert_copy() { git -C "$copy" checkout -q -f --detach "$head" 2>/dev/null || true; }
trap revert_copy EXIT
trap 'revert_copy; exit 130' INT TERM

if [ ! -f "$build/build.ninja" ]; then
    cmake -S "$copy" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Debug -DRDMACHAN_WARNINGS_AS_ERRORS=ON >"$folder/configure.log" 2>&1 ||
        { cat "$folder/configure.log" >&2; echo "mutations: the copy's configure failed" >&2; exit 1; }
fi

# header FILE FIELD: the value of the header line "FIELD: value".
header() { sed -n "s/^$2: //p" "$1" | head -n 1; }

patches=()
left_out=()  # named runs: the patches not named, listed as not run
for patch in "$root"/tests/mutations/*.patch; do
    name=$(basename "$patch" .patch)
    if [ ${#names[@]} -gt 0 ] && [[ ! " ${names[*]} " == *" $name "* ]]; then left_out+=("$patch"); continue; fi
    if [ -n "$subset" ] && [ "$(header "$patch" Subset)" != "$subset" ]; then continue; fi
    patches+=("$patch")
done
[ ${#patches[@]} -gt 0 ] || { echo "mutations: no patch selected" >&2; exit 1; }

log="$folder/last-run.log"
: >"$log"
# build_target TARGET: false when it does not compile (its output goes to the log).
build_target() { cmake --build "$build" --target "$1" -j "$jobs" >>"$log" 2>&1; }
# run_test TARGET [ARGUMENT]: the test's exit status, in its own folder, bounded in time.
run_test() {
    local program
    program=$(find "$build" -name "$1" -type f -perm -u+x -not -path '*/CMakeFiles/*' | head -n 1)
    [ -n "$program" ] || { echo "mutations: no program $1 in $build" >>"$log"; return 125; }
    local status=0
    (cd "$(dirname "$program")" && timeout 300 "$program" ${2:+"$2"}) >>"$log" 2>&1 || status=$?
    return "$status"
}

declare -A baseline_result=()
rows=()
all_caught=1
started=$(date +%s)
for patch in "${patches[@]}"; do
    name=$(basename "$patch" .patch)
    what=$(header "$patch" Mutation)
    caught_by=$(header "$patch" "Caught by")
    target=${caught_by%% *}
    argument=""
    [ "$target" = "$caught_by" ] || argument=${caught_by#* }
    test_label="\`$target\`${argument:+ ($argument)}"
    echo "mutations: $name -> $caught_by" >&2
    echo "=== $name: $caught_by" >>"$log"
    if [ "$baseline" -eq 1 ] && [ -z "${baseline_result[$caught_by]:-}" ]; then
        if build_target "$target" && run_test "$target" "$argument"; then
            baseline_result[$caught_by]=passes
        else
            baseline_result[$caught_by]=fails
        fi
    fi
    result=""
    if [ "${baseline_result[$caught_by]:-passes}" = fails ]; then
        result="not shown: the test fails unmutated"
    elif ! git -C "$copy" apply "$patch" >>"$log" 2>&1; then
        result="not shown: the patch does not apply to HEAD"
    else
        if ! build_target "$target"; then
            result="not shown: the mutated code does not build"
        elif run_test "$target" "$argument"; then
            result="**NOT caught**"
        else
            status=$?
            case "$status" in
                124) result="caught (timed out after 300 s)" ;;
                125) result="not shown: no test program $target in the build" ;;
                *) result="caught (exit $status)" ;;
            esac
        fi
        git -C "$copy" apply -R "$patch" >>"$log" 2>&1 || revert_copy
    fi
    [[ $result == caught* ]] || all_caught=0
    rows+=("| \`$name\` | $what | $test_label | $result |")
    echo "mutations: $name: $result" >&2
done
seconds=$(($(date +%s) - started))
for patch in "${left_out[@]}"; do
    caught_by=$(header "$patch" "Caught by")
    rows+=("| \`$(basename "$patch" .patch)\` | $(header "$patch" Mutation) | \`${caught_by%% *}\` | not run: left out of this run |")
done

table=$(
    echo "| mutation | what it breaks | test | result |"
    echo "|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
)
caught_count=$(printf '%s\n' "${rows[@]}" | grep -c '| caught' || true)
summary="${caught_count} of ${#patches[@]} mutations run caught${left_out:+, ${#left_out[@]} not run}; $(date -u +%Y-%m-%dT%H:%MZ), $(nproc) cores, ${seconds} s including the builds (Debug)."
echo "$summary"
echo
echo "$table"

if [ "$write" -eq 1 ]; then
    python3 - "$root/docs/RELIABILITY.md" "$commit" "$summary" "$table" <<'PY'
import re, sys
document, commit, summary, table = sys.argv[1:5]
body = "_Printed by `scripts/mutations.sh` at commit %s._\n\n`scripts/mutations.sh --write`: %s\n\n%s" % (commit, summary, table)
text = open(document).read()
pattern = re.compile(r"(<!-- generated: mutations -->\n).*?(<!-- end: mutations -->)", re.S)
if not pattern.search(text):
    sys.exit("mutations: %s has no block named mutations" % document)
open(document, "w").write(pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text))
PY
    echo "mutations: docs/RELIABILITY.md's block rewritten" >&2
fi
[ "$all_caught" -eq 1 ]
