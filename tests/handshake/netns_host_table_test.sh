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

source "$(dirname "${BASH_SOURCE[0]}")/../netns_hosts.sh"
netns_hosts_create netns_host_table_test
world=6
netns_start_rendezvous "$demo" $world hosts

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
