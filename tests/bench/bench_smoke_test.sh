#!/usr/bin/env bash
# rdmachan-bench runs end to end with tiny settings and prints what it promises: perftest-style
# columns, valid JSON with the rows and per-peer counters, CSV; a bad flag is named. Figures are
# not checked (the benchmark is not a timed test). Send latency and write bandwidth only: write
# latency polls memory the peer writes, which ThreadSanitizer would report on the software device.
set -euo pipefail
bench=${1:?usage: bench_smoke_test.sh <rdmachan-bench>}
out=$(mktemp); trap 'rm -f "$out"' EXIT

"$bench" -t send -n 50 >"$out"
grep -q 't_typical\[usec\]' "$out" || { echo "no latency columns:"; cat "$out"; exit 1; }
grep -q '99% percentile' "$out" || { echo "no p99 column"; exit 1; }

"$bench" -t write --bw -s 4096 -n 256 --window 16 --peers 3 --format json >"$out"
python3 - "$out" <<'PY' || { echo "bad JSON:"; cat "$out"; exit 1; }
import json, sys
data = json.load(open(sys.argv[1]))
row = data["rows"][0]
assert row["kind"] == "bw" and row["bytes"] == 4096 and row["iterations"] == 256, row
# Bandwidth is bytes x iterations over the same time as the message rate: the two must agree
# (the bench sets peak = max(peak, average), so peak >= average would prove nothing).
assert row["bw_average_mb_s"] > 0 and row["bw_peak_mb_s"] > 0, row
assert abs(row["bw_average_mb_s"] - row["message_rate_mpps"] * 4096) <= 1e-6 * row["bw_average_mb_s"], row
assert len(data["counters"]) == 3 and all(c["errors"] == 0 for c in data["counters"]), data["counters"]
assert sum(c["operations"] for c in data["counters"]) >= 256
# The library's per-peer counters (not the bench's arithmetic) saw at least the bytes written.
assert sum(c["bytes"] for c in data["counters"]) >= 256 * 4096, data["counters"]
PY

# Warm-up iterations run (the peer's counters see them) but are not in the row: 50 measured +
# 30 warm-up writes + 3 control sends and 3 receives (go/ready before each loop, end of size).
"$bench" -t write -s 8 -n 50 --warmup 30 --device soft --format json >"$out"
python3 - "$out" <<'PY' || { echo "warm-up not run or counted in the row:"; cat "$out"; exit 1; }
import json, sys
data = json.load(open(sys.argv[1]))
assert data["rows"][0]["iterations"] == 50, data["rows"][0]
assert data["counters"][1]["operations"] == 50 + 30 + 6, data["counters"][1]
PY

"$bench" -t read --bw -s 1024 -n 64 --window 8 --mode dc --format csv >"$out"
head -1 "$out" | grep -q '^test,kind,mode,peers,bytes,iterations' || { echo "no CSV header"; exit 1; }
grep -q '^read,bw,dc,2,1024,64,' "$out" || { echo "no CSV row:"; cat "$out"; exit 1; }

if "$bench" -t send --mode dc -s 16385 >"$out" 2>&1; then echo "a DC send above the receive buffers was accepted"; exit 1; fi
grep -q -- 'at most 16384 bytes' "$out" || { echo "the DC send limit is not named:"; cat "$out"; exit 1; }

if "$bench" --bogus >"$out" 2>&1; then echo "a bad flag was accepted"; exit 1; fi
grep -q -- '--bogus' "$out" || { echo "the error does not name the flag"; cat "$out"; exit 1; }
echo "bench smoke test: ok"
