#!/usr/bin/env bash
# Fails when a generated block of figures is older than the code it measures.
#
# A generated block is the text from a line "<!-- generated: NAME -->" to a line
# "<!-- end: NAME -->" in a document below; its first line names the commit it was printed at
# ("_Printed by the command at commit ABC1234._", written by scripts/performance.sh, or
# "_Printed by `scripts/NAME.sh` at commit ABC1234._", by scale.sh, reliability.sh and mutations.sh). The code
# a block measures is the list of paths given for it here. The block is stale when the last
# commit that changed any of those paths (git log -1 -- PATHS) is not contained in the commit it
# was printed at (git merge-base --is-ancestor). A block also fails when it was printed from
# uncommitted code ("-dirty"), names no commit, names a commit this repository lacks or one
# outside HEAD's history (printed on another branch: its code is not the code here, even when
# that commit contains the last change to the paths), has no paths listed here, or has no end
# marker (a regenerator would find no block to replace).
#
#   scripts/check_figures.sh          (run from anywhere; checks the repository it lives in)
#
# Exit status: 0 all blocks current; 1 a block is stale or malformed; 77 the check cannot be
# made (not a git checkout, or a shallow clone whose history does not reach back to the
# commits involved: run `git fetch --unshallow`); CTest reports 77 as skipped, not passed.
set -euo pipefail

repository="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repository"

# The code each block measures: the measuring script, the benchmark, every layer the measured
# calls run through, and what decides how they are compiled: the top-level CMakeLists.txt and
# cmake/ (flags, optimisation levels, precompiled headers), the CMakeLists.txt of every folder
# on the way to a benchmark under tests/, and scripts/build_release.sh (the Release
# configuration every measuring script builds with). scripts/performance.sh runs the measuring
# scripts of its blocks and chooses their build folder. scripts/setup.sh only installs
# packages, so it is not listed.
release_build="CMakeLists.txt cmake scripts/build_release.sh"
declare -A measured_paths=(
    [instruction-counts]="scripts/performance.sh scripts/instruction_counts.sh tests/mlx5/data_path_benchmark.cpp tests/mlx5/compressed_poll_benchmark.cpp tests/mlx5/data_path_fixture.hpp tests/mlx5/send_reference.hpp tests/mlx5/CMakeLists.txt tests/channel/channel_instruction_benchmark.cpp tests/channel/CMakeLists.txt tests/CMakeLists.txt tests/libmlx5 transport/mlx5 transport/provider transport/soft transport/device_interface.hpp transport common src include/rdmachan $release_build"
    [sweep]="scripts/performance.sh scripts/bench_sweep.sh tools/bench transport common src include/rdmachan handshake $release_build"
    [ucx]="scripts/performance.sh scripts/compare_ucx.sh tools/bench transport common src include/rdmachan handshake $release_build"
    [wait-modes]="scripts/performance.sh scripts/wait_modes.sh tests/channel/idle_wake_benchmark.cpp tests/channel/process_pair_settings.hpp tests/channel/CMakeLists.txt tests/CMakeLists.txt tools/bench transport common src include/rdmachan handshake $release_build"
    [asio-instructions]="scripts/performance.sh scripts/asio_instructions.sh tests/asio/asio_instruction_benchmark.cpp tests/asio/asio_test_support.hpp tests/asio/CMakeLists.txt tests/mlx5/measured_function.hpp tests/CMakeLists.txt transport common src include/rdmachan $release_build"
    [demo]="scripts/performance.sh scripts/demo_throughput.sh examples transport common src include/rdmachan handshake $release_build"
    [scale]="scripts/scale.sh scripts/pmix_exchange_benchmark.sh tests/handshake/rendezvous_benchmark.cpp tests/handshake/CMakeLists.txt tests/multi_channel/peer_cost_benchmark.cpp tests/multi_channel/CMakeLists.txt tests/pmix/pmix_exchange_benchmark.cpp tests/pmix/CMakeLists.txt tests/CMakeLists.txt handshake common src include/rdmachan transport $release_build"
    [membership]="scripts/membership.sh examples transport common src include/rdmachan handshake $release_build"
    [barrier]="scripts/barrier.sh tests/multi_channel/barrier_benchmark.cpp tests/multi_channel/mpi_barrier_benchmark.cpp tests/multi_channel/shared_exchange.hpp tests/multi_channel/CMakeLists.txt tests/CMakeLists.txt transport common src include/rdmachan handshake $release_build"
    # What CI's command runs: all the code, its tests and the scripts that build and run them.
    [reliability]="common src include transport handshake tests tools examples scripts cmake CMakeLists.txt .ci"
    # The mutations: the patches and their script, the code they mutate (the mlx5 layer, the
    # software device, the verbs binding, the channel core) and the tests they name, with what
    # builds those (the copy is configured from the top-level CMakeLists.txt and cmake/).
    [mutations]="scripts/mutations.sh tests/mutations transport/mlx5 transport/soft transport/verbs common src include tests/libmlx5 tests/mlx5 tests/soft tests/fault tests/test_main.cpp tests/CMakeLists.txt cmake CMakeLists.txt"
    # The soak: the suites it repeats (tests), what they run (the library, the demo) and its
    # script, which configures its own build.
    [soak]="scripts/soak.sh common src include transport handshake tests examples cmake CMakeLists.txt"
)
# Records of a run rather than figures of the current code: the soak runs for hours, and the
# mutations rebuild a whole Debug copy and then part of it once per patch, more than a change can
# wait for (CI runs the mutations' fast subset on every run instead). Such a block must name a
# known commit and clean code like any other; when its code has changed since, that is said, not
# failed, and the document says the figure is of that commit.
declare -A record_of_a_run=([soak]=1 [mutations]=1)
documents="README.md docs/PERFORMANCE.md docs/SCALE.md docs/RELIABILITY.md"
declare -A regenerated_by=(
    [instruction-counts]=scripts/performance.sh [sweep]=scripts/performance.sh [ucx]=scripts/performance.sh
    [wait-modes]=scripts/performance.sh [asio-instructions]=scripts/performance.sh
    [demo]=scripts/performance.sh
    [scale]=scripts/scale.sh [membership]=scripts/membership.sh [barrier]=scripts/barrier.sh [reliability]=scripts/reliability.sh [soak]=scripts/soak.sh
    [mutations]="scripts/mutations.sh --write"
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
    while IFS=$'\t' read -r kind name stamp; do
        checked=$((checked + 1))
        if [ "$kind" = malformed ]; then
            echo "$document: $name"; failed=1; continue
        fi
        paths=${measured_paths[$name]:-}
        if [ -z "$paths" ]; then
            echo "$document: block '$name': no paths listed in scripts/check_figures.sh"; failed=1; continue
        fi
        # shellcheck disable=SC2016  # the backquotes are the stamp's Markdown
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
        if ! git merge-base --is-ancestor "$commit" HEAD; then
            if [ "$shallow" = true ]; then
                echo "check_figures: shallow clone: cannot tell whether $commit (block '$name') is in HEAD's history; run 'git fetch --unshallow'"
                exit 77
            fi
            echo "$document: block '$name' names commit $commit, which is not in HEAD's history (printed on another branch?)"
            failed=1; continue
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
# One line per block: "block NAME FIRST-LINE", or "malformed WHAT" for a marker out of place.
# Markers are whole lines, as the regenerators write them; a block runs to the first end marker,
# so a block whose end marker was lost is reported, not merged into the next one of its name.
import re, sys
start, end = re.compile(r"<!-- generated: ([\w-]+) -->"), re.compile(r"<!-- end: ([\w-]+) -->")
name = None
for number, line in enumerate(open(sys.argv[1]).read().splitlines(), 1):
    line = line.rstrip()
    opened, closed = start.fullmatch(line), end.fullmatch(line)
    if opened:
        if name is not None:
            print("malformed\tblock '%s' (line %d) has no '<!-- end: %s -->' before the next block, at line %d" % (name, begun, name, number))
        name, begun, first = opened.group(1), number, None
    elif closed:
        if name is None:
            print("malformed\tline %d: '%s' ends no block" % (number, line))
        elif closed.group(1) != name:
            print("malformed\tblock '%s' (line %d) ends with '%s' at line %d" % (name, begun, line, number))
        else:
            print("block\t%s\t%s" % (name, first or ""))
        name = None
    elif name is not None and first is None:
        first = line
if name is not None:
    print("malformed\tblock '%s' (line %d) has no '<!-- end: %s -->' before the end of the document" % (name, begun, name))
PY
)
done
if [ "$checked" -eq 0 ]; then echo "check_figures: no generated block found in $documents"; exit 1; fi
exit $failed
