# Two hosts without a second machine, for the tests that source this file: two network
# namespaces joined by a veth pair, and the demo's rendezvous server in the first. The
# namespaces, the work folder and every background job are removed on every exit path.
#   netns_hosts_create NAME     sets first, second (namespaces), first_address, second_address,
#                               work (a temporary folder); NAME prefixes every message
#   netns_start_rendezvous DEMO WORLD JOB
#                               sets rendezvous_pid, port and token (RDMACHAN_JOB_TOKEN's value)

netns_hosts_cleanup() {
    local pids
    pids=$(jobs -p)
    [ -n "$pids" ] && kill $pids 2>/dev/null || true
    ip netns del "$first" 2>/dev/null || true
    ip netns del "$second" 2>/dev/null || true
    rm -rf "$work"
}

netns_hosts_create() {
    netns_name=$1
    if ! command -v ip >/dev/null; then
        echo "$netns_name: FAILED: 'ip' (iproute2) is not installed" >&2
        exit 1
    fi
    local suffix=$$
    first=rdmachan-a-$suffix
    second=rdmachan-b-$suffix
    # An address pair from the link-local range, different per run so parallel runs do not collide.
    local subnet=$((suffix % 250 + 1))
    first_address=169.254.$subnet.1
    second_address=169.254.$subnet.2
    work=$(mktemp -d)
    trap netns_hosts_cleanup EXIT
    if ! ip netns add "$first" 2>"$work/error"; then
        echo "$netns_name: FAILED: cannot create a network namespace (needs root): $(cat "$work/error")" >&2
        exit 1
    fi
    ip netns add "$second"
    ip link add "veth-a-$suffix" netns "$first" type veth peer name "veth-b-$suffix" netns "$second"
    ip -n "$first" addr add "$first_address/24" dev "veth-a-$suffix"
    ip -n "$second" addr add "$second_address/24" dev "veth-b-$suffix"
    for namespace in "$first" "$second"; do ip -n "$namespace" link set lo up; done
    ip -n "$first" link set "veth-a-$suffix" up
    ip -n "$second" link set "veth-b-$suffix" up
}

netns_start_rendezvous() {
    local demo=$1 world=$2 job=$3
    port=$((20000 + $$ % 20000))
    ip netns exec "$first" "$demo" rendezvous --world-size "$world" --bind "$first_address" --port $port \
        --job "$job" --timeout 60 >"$work/rendezvous.out" 2>"$work/rendezvous.err" &
    rendezvous_pid=$!
    # The rendezvous prints the token first; wait for it (bounded).
    for _ in $(seq 1 100); do
        grep -q '^export RDMACHAN_JOB_TOKEN=' "$work/rendezvous.out" 2>/dev/null && break
        sleep 0.1
    done
    token=$(sed -n 's/^export RDMACHAN_JOB_TOKEN=//p' "$work/rendezvous.out")
    if [ -z "$token" ]; then
        echo "$netns_name: FAILED: the rendezvous printed no token" >&2
        cat "$work/rendezvous.err" >&2
        exit 1
    fi
}
