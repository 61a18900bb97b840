#!/usr/bin/env bash
# Two hosts without a second machine: two network namespaces joined by a veth pair, three ranks
# in each, and the rendezvous server in the first. The ranks of each namespace must share one
# copy of the table: per namespace exactly one rank publishes it and the two others read it,
# and every rank's table is right (rendezvous_rank_program checks it). The namespaces are
# removed on every exit path.
# Usage: netns_host_table_test.sh <rdmachan-demo> <rendezvous_rank_program>
set -euo pipefail
demo=${1:?usage: netns_host_table_test.sh <rdmachan-demo> <rendezvous_rank_program>}
program=${2:?usage: netns_host_table_test.sh <rdmachan-demo> <rendezvous_rank_program>}

if ! command -v ip >/dev/null; then
    echo "netns_host_table_test: FAILED: 'ip' (iproute2) is not installed" >&2
    exit 1
fi

suffix=$$
first=rdmachan-ta-$suffix
second=rdmachan-tb-$suffix
subnet=$((suffix % 250 + 1))
first_address=169.254.$subnet.1
second_address=169.254.$subnet.2
work=$(mktemp -d)

cleanup() {
    local pids
    pids=$(jobs -p)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
    ip netns del "$first" 2>/dev/null || true
    ip netns del "$second" 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

if ! ip netns add "$first" 2>"$work/error"; then
    echo "netns_host_table_test: FAILED: cannot create a network namespace (needs root): $(cat "$work/error")" >&2
    exit 1
fi
ip netns add "$second"
ip link add "veth-ta-$suffix" netns "$first" type veth peer name "veth-tb-$suffix" netns "$second"
ip -n "$first" addr add "$first_address/24" dev "veth-ta-$suffix"
ip -n "$second" addr add "$second_address/24" dev "veth-tb-$suffix"
for namespace in "$first" "$second"; do ip -n "$namespace" link set lo up; done
ip -n "$first" link set "veth-ta-$suffix" up
ip -n "$second" link set "veth-tb-$suffix" up

world=6
port=$((20000 + suffix % 20000))
ip netns exec "$first" "$demo" rendezvous --world-size $world --bind "$first_address" --port $port \
    --job hosts --timeout 60 >"$work/rendezvous.out" 2>"$work/rendezvous.err" &
rendezvous_pid=$!
for _ in $(seq 1 100); do
    grep -q '^export RDMACHAN_JOB_TOKEN=' "$work/rendezvous.out" 2>/dev/null && break
    sleep 0.1
done
token=$(sed -n 's/^export RDMACHAN_JOB_TOKEN=//p' "$work/rendezvous.out")
if [ -z "$token" ]; then
    echo "netns_host_table_test: FAILED: the rendezvous printed no token" >&2
    cat "$work/rendezvous.err" >&2
    exit 1
fi

rank_pids=()
for rank in $(seq 0 $((world - 1))); do
    if [ $rank -lt 3 ]; then namespace=$first; else namespace=$second; fi
    ip netns exec "$namespace" env RDMACHAN_JOB_TOKEN="$token" \
        "$program" "$first_address" $port $rank $world hosts >"$work/rank-$rank.out" 2>"$work/rank-$rank.err" &
    rank_pids+=($!)
done

failed=0
for rank in $(seq 0 $((world - 1))); do
    if ! wait "${rank_pids[$rank]}"; then
        echo "netns_host_table_test: rank $rank FAILED:" >&2
        cat "$work/rank-$rank.out" "$work/rank-$rank.err" >&2
        failed=1
    fi
done
if ! wait $rendezvous_pid; then
    echo "netns_host_table_test: the rendezvous FAILED:" >&2
    cat "$work/rendezvous.err" >&2
    failed=1
fi
[ $failed -eq 0 ] || exit 1

# Per namespace: one publisher, two readers of its copy, nothing refused.
for half in 0 1; do
    ranks=$(seq $((half * 3)) $((half * 3 + 2)))
    published=0
    read_copy=0
    for rank in $ranks; do
        cat "$work/rank-$rank.out"
        grep -q 'source=published_for_host' "$work/rank-$rank.out" && published=$((published + 1))
        grep -q 'source=host_copy' "$work/rank-$rank.out" && read_copy=$((read_copy + 1))
        grep -q 'refused=$' "$work/rank-$rank.out" || { echo "netns_host_table_test: rank $rank refused a copy" >&2; exit 1; }
    done
    if [ $published -ne 1 ] || [ $read_copy -ne 2 ]; then
        echo "netns_host_table_test: namespace $half: $published ranks published and $read_copy read the host's copy (want 1 and 2)" >&2
        exit 1
    fi
done
echo "netns_host_table_test: 2 namespaces of 3 ranks each shared one table copy per namespace, every table right"
