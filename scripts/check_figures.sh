#!/usr/bin/env bash
# Fails when a generated block of figures is older than the code it measures (issue 22).
#
# A generated block is the text between "<!-- generated: NAME -->" and "<!-- end: NAME -->" in
# a document below; its first line names the commit it was printed at
# ("_Printed by the command at commit ABC1234._", written by scripts/performance.sh, or
# "_Printed by `scripts/NAME.sh` at commit ABC1234._", by scale.sh and reliability.sh). The code
# a block measures is the list of paths given for it here. The block is stale when the last
# commit that changed any of those paths (git log -1 -- PATHS) is not contained in the commit it
# was printed at (git merge-base --is-ancestor). A block printed from uncommitted code
# ("-dirty"), with no commit, at an unknown commit, or with no paths listed here also fails.
#
#   scripts/check_figures.sh          (run from anywhere; checks the repository it lives in)
#
# Exit status: 0 all blocks current; 1 a block is stale or malformed; 77 the check cannot be
# made (not a git checkout, or a shallow clone whose history does not reach back to the
# commits involved: run `git fetch --unshallow`); CTest reports 77 as skipped, not passed.
set -euo pipefail

repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repository"

# The code each block measures: the measuring script, the benchmark, and every layer the
# measured calls run through.
declare -A measured_paths=(
    [instruction-counts]="scripts/instruction_counts.sh tests/mlx5/data_path_benchmark.cpp tests/mlx5/data_path_fixture.hpp tests/mlx5/send_reference.hpp tests/channel/channel_instruction_benchmark.cpp tests/libmlx5 transport/mlx5 transport/provider transport/soft transport/device_interface.hpp src include/rdmachan"
    [sweep]="scripts/bench_sweep.sh tools/bench transport src include/rdmachan handshake"
    [ucx]="scripts/compare_ucx.sh tools/bench transport src include/rdmachan handshake"
    [demo]="scripts/demo_throughput.sh examples transport src include/rdmachan handshake"
    [scale]="scripts/scale.sh scripts/build_release.sh scripts/pmix_exchange_benchmark.sh tests/handshake/rendezvous_benchmark.cpp tests/multi_channel/peer_cost_benchmark.cpp tests/pmix/pmix_exchange_benchmark.cpp handshake src include/rdmachan transport"
    # What CI's command runs: all the code, its tests and the scripts that build and run them.
    [reliability]="src include transport handshake tests tools examples scripts cmake CMakeLists.txt .ci"
    # The soak: the suites it repeats (tests), what they run (the library, the demo) and its script.
    [soak]="scripts/soak.sh src include transport handshake tests examples cmake CMakeLists.txt"
)
# Records of a run rather than figures of the current code: the soak runs for up to hours (200
# rounds took about two hours on this machine at 5723286), more than a change can wait for. Its
# block must name a known commit and clean code like any other; when its code has changed
# since, that is said, not failed, and the document says the figure is of that commit.
declare -A record_of_a_run=([soak]=1)
documents="README.md docs/PERFORMANCE.md docs/SCALE.md docs/RELIABILITY.md"
declare -A regenerated_by=(
    [instruction-counts]=scripts/performance.sh [sweep]=scripts/performance.sh [ucx]=scripts/performance.sh
    [demo]=scripts/performance.sh
    [scale]=scripts/scale.sh [reliability]=scripts/reliability.sh [soak]=scripts/soak.sh
)

if ! git rev-parse --git-dir >/dev/null 2>&1; then
    echo "check_figures: $repository is not a git checkout: the figures' commits cannot be checked"
    exit 77
fi
shallow=$(git rev-parse --is-shallow-repository)

failed=0
checked=0
for document in $documents; do
    if [ ! -f "$document" ]; then echo "check_figures: $document is missing"; failed=1; continue; fi
    while IFS=$'\t' read -r name stamp; do
        checked=$((checked + 1))
        paths=${measured_paths[$name]:-}
        if [ -z "$paths" ]; then
            echo "$document: block '$name': no paths listed in scripts/check_figures.sh"; failed=1; continue
        fi
        commit=$(sed -n 's/^_Printed by \(the command\|`[^`]*`\) at commit \([0-9a-f]*\)\(-dirty\)\{0,1\}\._$/\2\3/p' <<<"$stamp")
        if [ -z "$commit" ]; then
            echo "$document: block '$name': its first line names no commit: '$stamp'"; failed=1; continue
        fi
        if [[ $commit == *-dirty ]]; then
            echo "$document: block '$name' was printed from uncommitted code ($commit)"; failed=1; continue
        fi
        # Markdown beside the code (a folder's README) is not code: it cannot change a figure.
        # shellcheck disable=SC2086  # the path list is split on purpose
        last=$(git log -1 --format=%H -- $paths ':(exclude,glob)**/*.md')
        if ! git cat-file -e "$commit^{commit}" 2>/dev/null; then
            if [ "$shallow" = true ]; then
                echo "check_figures: shallow clone: commit $commit (block '$name') is not in the history here; run 'git fetch --unshallow'"
                exit 77
            fi
            echo "$document: block '$name' names commit $commit, which is not in this repository"; failed=1; continue
        fi
        if git merge-base --is-ancestor "$last" "$commit"; then
            echo "$document: block '$name' printed at $commit: current (last change to its code: $(git rev-parse --short=7 "$last"))"
        elif [ "$shallow" = true ]; then
            echo "check_figures: shallow clone: cannot tell whether $commit (block '$name') contains $last; run 'git fetch --unshallow'"
            exit 77
        elif [ -n "${record_of_a_run[$name]:-}" ]; then
            echo "$document: block '$name' is a record of a run at $commit; its code has changed since (at $(git rev-parse --short=7 "$last")): the figure is of $commit"
        else
            echo "$document: block '$name' is STALE: printed at $commit, but its code changed at $(git log -1 --format='%h (%s)' "$last" | cut -c1-100)"
            echo "  regenerate it: ${regenerated_by[$name]:-?} (paths: $paths)"
            failed=1
        fi
    done < <(python3 - "$document" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
for match in re.finditer(r"<!-- generated: ([\w-]+) -->\n(.*?)\n.*?<!-- end: \1 -->", text, re.S):
    print("%s\t%s" % (match.group(1), match.group(2)))
PY
)
done
if [ "$checked" -eq 0 ]; then echo "check_figures: no generated block found in $documents"; exit 1; fi
exit $failed
