#!/usr/bin/env bash
# Regenerates the membership figures in docs/SCALE.md: the block between
# "<!-- generated: membership -->" and "<!-- end: membership -->" is replaced by what this prints.
# rdmachan-demo --bootstrap etcd --elastic (examples/demo/elastic_launcher.hpp), Release, on an
# etcd the demo starts on loopback: MEMBERS members join one by one, then CHANGES changes one
# second apart (a leave, a join, a kill, a join, and again) while every member keeps writing to
# every other and reading it back; each change's time until every other member saw it, and the
# members' aggregate traffic around it. Then the verdicts against the targets (docs/SCALE.md).
#   scripts/membership.sh [build-dir] [members] [changes]    (default: build-perf 64 16)
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build_dir="${1:-build-perf}"
members="${2:-64}"
changes="${3:-16}"
case "$build_dir" in /*) ;; *) build_dir="$source_dir/$build_dir" ;; esac
document="$source_dir/docs/SCALE.md"
commit="$(git -C "$source_dir" rev-parse --short=7 HEAD)"
git -C "$source_dir" diff --quiet HEAD -- . ':(exclude)docs' ':(exclude,glob)**/*.md' || commit="$commit-dirty"

"$source_dir/scripts/build_release.sh" "$build_dir" rdmachan-demo
demo="$build_dir/examples/rdmachan-demo"

block="$(mktemp)"
output="$(mktemp)"
errors="$(mktemp)"
trap 'rm -f "$block" "$output" "$errors"' EXIT
status=0
timeout 900 env -u RDMACHAN_ETCD "$demo" --bootstrap etcd --elastic --peers "$members" --churn "$changes" --size 4096 \
    >"$output" 2>"$errors" || status=$?
{
    echo '```'
    echo "\$ rdmachan-demo --bootstrap etcd --elastic --peers $members --churn $changes --size 4096" \
         "   # $(nproc) cores, $(uname -r), $(date -u +%Y-%m-%dT%H:%MZ)"
    # The etcd address and key prefix change every run; the rest is the demo's output. Its
    # standard error holds the members' logs (a killed member's peers warn about it once each,
    # hundreds of lines at 64 members): shown only when the run failed, its last lines.
    grep -v '^elastic run:' "$output"
    if [ "$status" -ne 0 ]; then
        echo "FAILED (exit $status); the end of its standard error:"
        tail -n 20 "$errors"
    fi
    echo '```'
    echo
    python3 - "$output" "$members" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
members = int(sys.argv[2])
rows = [line.split("|")[1:-1] for line in text.splitlines() if re.match(r"\| (join|leave|kill)", line)]
def ms(cell):
    match = re.match(r"\s*([\d.]+) ms", cell)
    return float(match.group(1)) if match else None
joins_full = [ms(r[3]) for r in rows if r[0].strip() == "join" and int(r[2]) == members - 1]
leaves = [ms(r[3]) for r in rows if r[0].strip() == "leave"]
kills = [ms(r[3]) for r in rows if r[0].strip().startswith("kill")]
steady = re.search(r"steady state ([\d.]+) MB/s.*?lowest second during the \d+ changes ([\d.]+) MB/s, (\d+)% of it", text)
def worst(values):
    values = [v for v in values if v is not None]
    return max(values) if values else None
def verdict(value, limit):
    if value is None:
        return "not measured"
    return "met" if value <= limit else "missed by %.0f%%" % (100.0 * (value - limit) / limit)
print("| what | measured | target | verdict |")
print("|---|---:|---|---|")
value = worst(joins_full)
print("| a member joining as the %dth (%d others), slowest until all saw it | %s | <= 1 s | %s |" %
      (members, members - 1, "%.0f ms" % value if value is not None else "-", verdict(value, 1000.0)))
value = worst(leaves)
print("| a graceful leave, slowest until all saw it | %s | <= 100 ms | %s |" %
      ("%.0f ms" % value if value is not None else "-", verdict(value, 100.0)))
value = worst(kills)
print("| a SIGKILLed member, slowest until all saw it failed | %s | <= TTL (2 s) + 1 s | %s |" %
      ("%.0f ms" % value if value is not None else "-", verdict(value, 3000.0)))
if steady:
    share = float(steady.group(3))
    print("| aggregate throughput, lowest second during the changes | %s%% of the steady state | >= 80%% | %s |" %
          (steady.group(3), "met" if share >= 80 else "missed by %.0f points" % (80 - share)))
PY
} >"$block"
cat "$block"

"$source_dir/scripts/replace_block.py" "$document" membership "$block" "_Printed by \`scripts/membership.sh\` at commit $commit._"
echo "membership: $document regenerated" >&2
