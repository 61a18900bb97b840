#!/usr/bin/env bash
# scripts/check_figures.sh can fail: in a scratch repository with its layout (README.md and the
# three documents, both stamp forms), a block printed at a commit passes (still current after a
# README beside the code changed); a later change to the code it measures makes it fail naming
# the block, and so does a change to what builds that code (CMakeLists.txt, cmake/,
# scripts/build_release.sh, tests/CMakeLists.txt); a block printed from uncommitted code fails;
# reprinting at the new commit passes again; a block printed at a commit of another branch fails
# even though that commit contains the code; a block that lost its end marker fails, whether
# another block follows it or the document ends; a shallow clone is reported as not checkable
# (77), not as passed.
set -euo pipefail
script=${1:?usage: check_figures_test.sh SCRIPTS/CHECK_FIGURES.SH}
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
repo=$work/repo
mkdir -p "$repo/scripts" "$repo/docs" "$repo/transport/mlx5" "$repo/cmake" "$repo/tests"
cp "$script" "$repo/scripts/check_figures.sh"
cd "$repo"
git init -q . && git config user.email test@example.invalid && git config user.name test
echo "v1" >transport/mlx5/send_queue.hpp
echo "project(scratch)" >CMakeLists.txt
echo "set(flags -O3)" >cmake/Flags.cmake
echo "cmake -DCMAKE_BUILD_TYPE=Release" >scripts/build_release.sh
echo "add_subdirectory(handshake)" >tests/CMakeLists.txt
block() {  # block COMMIT [SOAK-COMMIT]: the three documents, every block printed at COMMIT (the soak's record at SOAK-COMMIT), in both stamp forms
    for name in instruction-counts sweep ucx; do
        printf '<!-- generated: %s -->\n_Printed by the command at commit %s._\n\n| figure |\n<!-- end: %s -->\n\n' "$name" "$1" "$name"
    done >docs/PERFORMANCE.md
    printf '# project\n\n<!-- generated: demo -->\n_Printed by the command at commit %s._\n\n| figure |\n<!-- end: demo -->\n' "$1" >README.md
    # shellcheck disable=SC2016  # the backquotes are the stamp's Markdown
    printf '<!-- generated: scale -->\n_Printed by `scripts/scale.sh` at commit %s._\n<!-- end: scale -->\n' "$1" >docs/SCALE.md
    # shellcheck disable=SC2016
    printf '<!-- generated: reliability -->\n_Printed by `scripts/reliability.sh` at commit %s._\n<!-- end: reliability -->\n' "$1" >docs/RELIABILITY.md
    # shellcheck disable=SC2016
    printf '<!-- generated: soak -->\n_Printed by `scripts/soak.sh` at commit %s._\n<!-- end: soak -->\n' "${2:-$1}" >>docs/RELIABILITY.md
}
git add -A && git commit -qm code
block "$(git rev-parse --short=7 HEAD)"; git add -A && git commit -qm figures
expect() {  # expect STATUS TEXT...: run the check, compare its exit status, grep its output for each TEXT
    local status=0 output expected=$1 text
    output=$(scripts/check_figures.sh 2>&1) || status=$?
    shift
    for text in "$@"; do
        if [ "$status" != "$expected" ] || ! grep -q -- "$text" <<<"$output"; then
            echo "check_figures_test: expected status $expected and '$text', got $status:"; echo "$output"; exit 1
        fi
    done
}
expect 0 "block 'instruction-counts' printed at"
echo "notes" >transport/mlx5/README.md; git add -A && git commit -qm "a README beside the code"
expect 0 "block 'instruction-counts' printed at"  # Markdown is not code: still current
echo "v2" >transport/mlx5/send_queue.hpp; git commit -qam "change the measured code"
expect 1 "block 'instruction-counts' is STALE"
expect 1 "block 'scale' is STALE"
expect 1 "block 'reliability' is STALE"
expect 1 "README.md: block 'demo' is STALE"
block "$(git rev-parse --short=7 HEAD)-dirty"; expect 1 "printed from uncommitted code"
block "$(git rev-parse --short=7 HEAD)" "$(git rev-parse --short=7 HEAD~1)"; git commit -qam "figures reprinted"
expect 0 "block 'ucx' printed at"
# The soak's block is the record of a run: older than its code, it is said, not failed; but it
# must still name a known commit and clean code.
expect 0 "block 'soak' is a record of a run at"
block "$(git rev-parse --short=7 HEAD)" 0000000; expect 1 "block 'soak' names commit 0000000"
block "$(git rev-parse --short=7 HEAD)" "$(git rev-parse --short=7 HEAD)-dirty"; expect 1 "block 'soak' was printed from uncommitted code"
block "$(git rev-parse --short=7 HEAD)"; git commit -qam "figures reprinted, soak too"
expect 0 "block 'soak' printed at"
# What builds the measured code is part of it: the compiler's flags change the figures.
printed() { block "$(git rev-parse --short=7 HEAD)"; git commit -qam "figures reprinted"; }
echo "project(scratch) # -O2" >CMakeLists.txt; git commit -qam "top-level CMake changed"
expect 1 "block 'instruction-counts' is STALE" "block 'sweep' is STALE" "block 'ucx' is STALE" "block 'demo' is STALE" "block 'scale' is STALE"
printed; echo "set(flags -O2)" >cmake/Flags.cmake; git commit -qam "cmake/ changed"
expect 1 "block 'instruction-counts' is STALE" "block 'sweep' is STALE" "block 'ucx' is STALE" "block 'demo' is STALE" "block 'scale' is STALE"
printed; echo "cmake -DCMAKE_BUILD_TYPE=Debug" >scripts/build_release.sh; git commit -qam "build_release.sh changed"
expect 1 "block 'instruction-counts' is STALE" "block 'sweep' is STALE" "block 'ucx' is STALE" "block 'demo' is STALE"
printed; echo "add_compile_options(-O0)" >>tests/CMakeLists.txt; git commit -qam "tests/CMakeLists.txt changed"
expect 1 "block 'instruction-counts' is STALE" "block 'scale' is STALE"
printed
expect 0 "block 'scale' printed at"
# A commit of another branch that contains every change to the code is still not this code.
git checkout -q -b elsewhere && echo "elsewhere" >notes.txt && git add notes.txt && git commit -qm "another branch"
elsewhere=$(git rev-parse --short=7 HEAD)
git checkout -q -
block "$elsewhere"
expect 1 "block 'instruction-counts' names commit $elsewhere, which is not in HEAD's history" \
    "block 'soak' names commit $elsewhere, which is not in HEAD's history"
# A block without its end marker: before the next block, and at the end of the document.
block "$(git rev-parse --short=7 HEAD)"
sed -i '/<!-- end: sweep -->/d' docs/PERFORMANCE.md
expect 1 "block 'sweep' (line 7) has no '<!-- end: sweep -->' before the next block, at line 12" "block 'ucx' printed at"
block "$(git rev-parse --short=7 HEAD)"
sed -i '/<!-- end: ucx -->/d' docs/PERFORMANCE.md
expect 1 "block 'ucx' (line 13) has no '<!-- end: ucx -->' before the end of the document"
git checkout -q -- docs README.md
expect 0 "block 'ucx' printed at"
git clone -q --depth 1 "file://$repo" "$work/shallow"
echo "v3" >transport/mlx5/send_queue.hpp; git commit -qam "another change"
cd "$work/shallow"
git pull -q --depth 1 2>/dev/null || true
status=0; output=$(scripts/check_figures.sh 2>&1) || status=$?
if [ "$status" != 77 ]; then echo "check_figures_test: a shallow clone gave status $status:"; echo "$output"; exit 1; fi
echo "check_figures_test: ok"
