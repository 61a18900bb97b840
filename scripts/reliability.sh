#!/usr/bin/env bash
# Regenerates the figures of docs/RELIABILITY.md: the block between
# "<!-- generated: reliability -->" and "<!-- end: reliability -->" is replaced by the results
# of CI's command, scripts/test.sh, as it wrote them in build/test-summary.txt: the commit it
# tested, each suite's passed and failed counts, the fuzzers' inputs and coverage edges, and
# where the time went.
#   scripts/reliability.sh                run scripts/test.sh (all of it), then write the block
#   scripts/reliability.sh --summary FILE write the block from an earlier run's summary
# The block names the commit test.sh ran on, not the current one; scripts/check_figures.sh fails
# when the code the block measures changed after that commit.
set -euo pipefail

source_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
document="$source_dir/docs/RELIABILITY.md"
summary="$source_dir/build/test-summary.txt"
case "${1:-}" in
    --summary) summary="${2:?usage: scripts/reliability.sh [--summary FILE]}" ;;
    "")
        rm -f "$summary"
        # The block records a failed run as well: the document shows what happened.
        "$source_dir/scripts/test.sh" || echo "reliability: scripts/test.sh failed; the block says so" >&2
        ;;
    *) echo "usage: scripts/reliability.sh [--summary FILE]" >&2; exit 2 ;;
esac
[ -f "$summary" ] || { echo "reliability: no summary at $summary (did scripts/test.sh finish?)" >&2; exit 1; }

python3 - "$document" "$summary" <<'PY'
import re, sys
document, summary = sys.argv[1], sys.argv[2]
fields = {"suite": [], "fuzzer": [], "time": []}
for line in open(summary).read().splitlines():
    key, _, value = line.partition("\t")
    if key in fields:
        fields[key].append(value)
    else:
        fields[key] = value
for required in ("commit", "date", "machine", "options", "total"):
    if required not in fields:
        sys.exit("reliability: %s has no '%s' line" % (summary, required))

def minutes(seconds):
    seconds = float(seconds)
    return "%d min %02d s" % (seconds // 60, seconds % 60)

lines = ["_Printed by `scripts/reliability.sh` at commit %s._" % fields["commit"], ""]
lines.append("`scripts/test.sh` (CI's command, `.ci/run`), %s, %s, %s; %s in all." %
             (fields["date"], fields["machine"], fields["options"], minutes(fields["total"])))
lines += ["", "| suite | passed | failed |", "|---|---:|---:|"]
passed = failed = 0
for suite in fields["suite"]:
    name, good, bad = suite.split("\t")
    passed += int(good); failed += int(bad)
    lines.append("| %s | %s | %s |" % (name, good, bad))
lines.append("| **all** | **%d** | **%d** |" % (passed, failed))
if fields["fuzzer"]:
    lines += ["", "| fuzzer (20 s each, run at once) | figures |", "|---|---|"]
    for fuzzer in fields["fuzzer"]:
        target, _, figures = fuzzer.partition(": ")
        lines.append("| %s | %s |" % (target, figures))
lines += ["", "| where the time went | |", "|---|---:|"]
for timing in fields["time"]:
    match = re.match(r"\s*([0-9.]+) s  (.*)", timing)
    lines.append("| %s | %s s |" % (match.group(2), match.group(1)))
body = "\n".join(lines)

text = open(document).read()
pattern = re.compile(r"(<!-- generated: reliability -->\n).*?(<!-- end: reliability -->)", re.S)
if not pattern.search(text):
    sys.exit("reliability: %s has no block named reliability" % document)
text = pattern.sub(lambda m: m.group(1) + body + "\n" + m.group(2), text)
open(document, "w").write(text)
PY
echo "reliability: $document regenerated from $summary" >&2
