#!/usr/bin/env bash
# Regenerates every figure in docs/PERFORMANCE.md, in one run on this machine. Each
# block of the document between "<!-- generated: NAME -->" and "<!-- end: NAME -->" is replaced
# by what its command prints; the prose around the blocks holds no figure of its own.
#   instruction-counts   scripts/instruction_counts.sh   (callgrind, Release -O3)
#   sweep                scripts/bench_sweep.sh          (also docs/performance/sweep.png, .csv)
#   ucx                  scripts/compare_ucx.sh          (rdmachan-bench against ucx_perftest)
#   wait-modes           scripts/wait_modes.sh           (idle wake and CPU per wait mode, busy latency)
#   asio-instructions    scripts/asio_instructions.sh    (callgrind: what async_wait adds over wait())
#   demo                 scripts/demo_throughput.sh      (the demo's aggregate throughput)
#   scripts/performance.sh [build-dir]                   (default: build-perf)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
document="$source_dir/docs/PERFORMANCE.md"
# Taken before anything is written: the code the figures belong to ("-dirty": uncommitted changes
# outside docs/, which this command rewrites).
commit="$(git -C "$source_dir" rev-parse --short=7 HEAD)"
git -C "$source_dir" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude,glob)**/*.md' || commit="$commit-dirty"

# Each script installs what it measures with (setup.sh and its extra packages).
# The blocks, one file each, all of docs/PERFORMANCE.md.
blocks="$(mktemp -d)"
trap 'rm -rf "$blocks"' EXIT
mkdir "$blocks/performance"
echo "performance: instruction counts (callgrind)" >&2
"$source_dir/scripts/instruction_counts.sh" "$build_dir" >"$blocks/performance/instruction-counts"
echo "performance: rdmachan-bench size sweep" >&2
"$source_dir/scripts/bench_sweep.sh" "$build_dir" "$source_dir/docs/performance" >"$blocks/performance/sweep"
echo "performance: rdmachan against ucx_perftest" >&2
"$source_dir/scripts/compare_ucx.sh" "$build_dir" >"$blocks/performance/ucx"
echo "performance: the wait modes" >&2
"$source_dir/scripts/wait_modes.sh" "$build_dir" >"$blocks/performance/wait-modes"
"$source_dir/scripts/asio_instructions.sh" "$build_dir" >"$blocks/performance/asio-instructions"
echo "performance: rdmachan-demo's aggregate throughput" >&2
"$source_dir/scripts/demo_throughput.sh" "$build_dir" >"$blocks/performance/demo"

# replace_blocks DOCUMENT FOLDER: each file of FOLDER replaces the block of its name.
replace_blocks() {
    python3 - "$1" "$2" "$commit" <<'PY'
import os, re, sys
document, blocks, commit = sys.argv[1], sys.argv[2], sys.argv[3]
text = open(document).read()
for name in sorted(os.listdir(blocks)):
    body = open(os.path.join(blocks, name)).read().rstrip("\n")
    pattern = re.compile(r"(<!-- generated: %s -->\n).*?(<!-- end: %s -->)" % (re.escape(name), re.escape(name)), re.S)
    if not pattern.search(text):
        sys.exit("performance: %s has no block named %s" % (document, name))
    stamp = "_Printed by the command at commit %s._\n\n" % commit
    text = pattern.sub(lambda m: m.group(1) + stamp + body + "\n" + m.group(2), text)
open(document, "w").write(text)
PY
    echo "performance: $1 regenerated" >&2
}
replace_blocks "$document" "$blocks/performance"
