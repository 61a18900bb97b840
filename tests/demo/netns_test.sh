#!/usr/bin/env bash
# Multi-host without a second host: two network namespaces joined by a veth pair. The
# rendezvous and peers 0 and 1 run in the first namespace, peers 2 and 3 in the second, each on
# the software device listening on its namespace's address, so every byte between the two
# halves crosses the veth pair. The namespaces are removed on every exit path.
# Usage: tests/demo/netns_test.sh <path to rdmachan-demo>
set -euo pipefail
demo=${1:?usage: netns_test.sh <rdmachan-demo>}

source "$(dirname "${BASH_SOURCE[0]}")/../netns_hosts.sh"
netns_hosts_create netns_test
world=4
netns_start_rendezvous "$demo" $world netns

peer_pids=()
for rank in 0 1 2 3; do
    if [ $rank -lt 2 ]; then namespace=$first address=$first_address; else namespace=$second address=$second_address; fi
    ip netns exec "$namespace" env RDMACHAN_JOB_TOKEN="$token" RDMACHAN_SOFT_ADDRESS="$address" \
        RDMACHAN_RANK=$rank RDMACHAN_WORLD_SIZE=$world RDMACHAN_RENDEZVOUS="$first_address:$port" \
        "$demo" peer --job netns --device soft --iterations 5 --size 16384 --json --timeout 60 \
        >"$work/peer-$rank.json" 2>"$work/peer-$rank.err" &
    peer_pids+=($!)
done

failed=0
for rank in 0 1 2 3; do
    if ! wait "${peer_pids[$rank]}"; then
        echo "netns_test: rank $rank FAILED:" >&2
        cat "$work/peer-$rank.err" >&2
        failed=1
    fi
done
if ! wait $rendezvous_pid; then
    echo "netns_test: the rendezvous FAILED:" >&2
    cat "$work/rendezvous.err" >&2
    failed=1
fi
[ $failed -eq 0 ] || exit 1

# Every peer verified every byte (it exits non-zero otherwise) and saw every peer; the devices
# of the second namespace really are on the second address.
for rank in 0 1 2 3; do
    grep -q "\"rank\": $rank" "$work/peer-$rank.json" || { echo "netns_test: rank $rank wrote no report" >&2; exit 1; }
    peers=$(grep -c '"peer":' "$work/peer-$rank.json")
    [ "$peers" -eq $world ] || { echo "netns_test: rank $rank reports $peers peers, not $world" >&2; exit 1; }
done
grep -q "soft:$second_address" "$work/peer-2.json" || { echo "netns_test: rank 2 did not use $second_address" >&2; exit 1; }
grep -q "soft:$first_address" "$work/peer-0.json" || { echo "netns_test: rank 0 did not use $first_address" >&2; exit 1; }
echo "netns_test: 4 peers in 2 namespaces ($first_address, $second_address) exchanged and verified everything"
