#!/usr/bin/env bash
# Multi-host without a second host: two network namespaces joined by a veth pair. The
# rendezvous and peers 0 and 1 run in the first namespace, peers 2 and 3 in the second, each on
# the software device listening on its namespace's address, so every byte between the two
# halves crosses the veth pair. The namespaces are removed on every exit path.
# Usage: tests/demo/netns_test.sh <path to rdmachan-demo>
set -euo pipefail
demo=${1:?usage: netns_test.sh <rdmachan-demo>}

if ! command -v ip >/dev/null; then
    echo "netns_test: FAILED: 'ip' (iproute2) is not installed" >&2
    exit 1
fi

suffix=$$
first=rdmachan-a-$suffix
second=rdmachan-b-$suffix
# An address pair from the link-local range, different per run so parallel runs do not collide.
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
    echo "netns_test: FAILED: cannot create a network namespace (needs root): $(cat "$work/error")" >&2
    exit 1
fi
ip netns add "$second"
ip link add "veth-a-$suffix" netns "$first" type veth peer name "veth-b-$suffix" netns "$second"
ip -n "$first" addr add "$first_address/24" dev "veth-a-$suffix"
ip -n "$second" addr add "$second_address/24" dev "veth-b-$suffix"
for namespace in "$first" "$second"; do ip -n "$namespace" link set lo up; done
ip -n "$first" link set "veth-a-$suffix" up
ip -n "$second" link set "veth-b-$suffix" up

world=4
port=$((20000 + suffix % 20000))
ip netns exec "$first" "$demo" rendezvous --world-size $world --bind "$first_address" --port $port \
    --job netns --timeout 60 >"$work/rendezvous.out" 2>"$work/rendezvous.err" &
rendezvous_pid=$!
# The rendezvous prints the token first; wait for it (bounded).
for _ in $(seq 1 100); do
    grep -q '^export RDMACHAN_JOB_TOKEN=' "$work/rendezvous.out" 2>/dev/null && break
    sleep 0.1
done
token=$(sed -n 's/^export RDMACHAN_JOB_TOKEN=//p' "$work/rendezvous.out")
if [ -z "$token" ]; then
    echo "netns_test: FAILED: the rendezvous printed no token" >&2
    cat "$work/rendezvous.err" >&2
    exit 1
fi

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
