#!/usr/bin/env bash
# A few "hosts" on one machine, by hand: network namespaces joined by a bridge, the same recipe as
# tests/it/common/netns.rs, to reproduce a partition test step by step. Needs root, iproute2 and nftables
# (scripts/lib.sh's ensure_nftables installs it).
#
#   scripts/netns.sh up N            N hosts PREFIX-h0..h(N-1), host I at 198.18.0.(I+1)/24, plus PREFIX-br
#   scripts/netns.sh exec I CMD...   runs CMD in host I (its network namespace only), e.g. exec 1 muster --local-addr 198.18.0.2 ...
#   scripts/netns.sh addr I          prints host I's address
#   scripts/netns.sh cut I           host I silently cut off, both ways (packets dropped: no FIN, no RST)
#   scripts/netns.sh cut-inbound I   only the packets *to* host I are dropped (it still sends)
#   scripts/netns.sh loss I K        1 packet in K dropped, each way
#   scripts/netns.sh link-down I     host I's bridge port down (the peer sees no carrier)
#   scripts/netns.sh heal            every fault removed, every port up
#   scripts/netns.sh status          the namespaces, their addresses and the fault rules
#   scripts/netns.sh down            kills the processes in the namespaces, removes everything `up` made
#
# PREFIX is $NETNS_PREFIX (default "mn"); the tests use their own prefixes (mu<pid>x<n>), so this never
# touches a running test's namespaces. 198.18.0.0/15 is the RFC 2544 benchmarking range: these addresses
# exist only inside the namespaces. All hosts share one hostname (which /etc/hosts maps to loopback), so give
# each muster `--local-addr <its address>`. The fault table is `bridge $PREFIX` in the bridge namespace.
#
# tests/it/partition.rs's first scenario by hand (c10d, the store hosted by host 0's agent; mkdir /tmp/out first):
#   scripts/netns.sh up 3
#   for i in 0 1 2; do scripts/netns.sh exec $i env MUSTER_TEST_NODE=h$i target/debug/muster --nnodes 2:3 \
#       --rdzv-backend c10d --rdzv-endpoint 198.18.0.1:29400 --rdzv-id demo --local-addr 198.18.0.$((i + 1)) \
#       --rdzv-conf keep_alive_interval=1,keep_alive_max_attempt=3,read_timeout=10,last_call_timeout=1 \
#       --event-log /tmp/out/events-h$i.jsonl tests/fixtures/netns_worker.py /tmp/out & done
#   scripts/netns.sh cut 2      # host 2 fences (stops its worker) and exits 3; hosts 0 and 1 re-form
#   touch /tmp/out/finish; scripts/netns.sh down
set -euo pipefail
P="${NETNS_PREFIX:-mn}"
BR="$P-br"

die() { echo "netns.sh: $*" >&2; exit 2; }
need_root() {
    [ "$(id -u)" = 0 ] || die "must run as root (network namespaces and nftables)"
    command -v ip >/dev/null || die "ip (iproute2) is missing: apt-get install -y iproute2"
    command -v nft >/dev/null || die "nft is missing: source scripts/lib.sh; ensure_nftables"
}
host_index() {
    case "${1:-}" in '' | *[!0-9]*) die "host index must be a number, got '${1:-}'" ;; esac
    ip netns list | grep -q "^$P-h$1\b" || die "no host $1 (run: netns.sh up N)"
}
hosts() { ip netns list | awk '{print $1}' | grep -E "^$P-h[0-9]+$" | sed "s/^$P-h//" | sort -n || true; }

# The fault table holds one chain; rules are added one per line (a one-line `{ ...; }` body is refused).
add_rules() {
    ip netns exec "$BR" nft list table bridge "$P" >/dev/null 2>&1 || ip netns exec "$BR" nft -f - <<EOF
table bridge $P {
    chain faults {
        type filter hook forward priority 0; policy accept;
    }
}
EOF
    local rule
    for rule in "$@"; do
        # shellcheck disable=SC2086 # the rule is nft's words
        ip netns exec "$BR" nft add rule bridge "$P" faults $rule
    done
}

cmd="${1:-}"
[ $# -gt 0 ] && shift
case "$cmd" in
    up)
        need_root
        n="${1:-}"
        case "$n" in '' | *[!0-9]* | 0) die "up N: N must be a positive number" ;; esac
        [ "$n" -le 250 ] || die "up N: at most 250 hosts"
        ip netns list | grep -q "^$BR\b" && die "$BR exists: run 'netns.sh down' first"
        ip netns add "$BR"
        ip -n "$BR" link set lo up
        ip -n "$BR" link add br0 type bridge
        ip -n "$BR" link set br0 up
        for ((i = 0; i < n; i++)); do
            ip netns add "$P-h$i"
            ip link add "vh$i" netns "$P-h$i" type veth peer name "vb$i" netns "$BR"
            ip -n "$BR" link set "vb$i" master br0
            ip -n "$BR" link set "vb$i" up
            ip -n "$P-h$i" addr add "198.18.0.$((i + 1))/24" dev "vh$i"
            ip -n "$P-h$i" link set "vh$i" up
            ip -n "$P-h$i" link set lo up
            echo "$P-h$i 198.18.0.$((i + 1))"
        done
        ;;
    exec)
        need_root
        host_index "${1:-}"
        i="$1"
        shift
        [ $# -gt 0 ] || die "exec I CMD...: no command"
        # nsenter joins only the network namespace; `ip netns exec` would also unmount /sys (and with it
        # /sys/fs/cgroup, muster's job cgroup) in a mount namespace of its own.
        exec nsenter --net="/run/netns/$P-h$i" -- "$@"
        ;;
    addr)
        host_index "${1:-}"
        echo "198.18.0.$(($1 + 1))"
        ;;
    cut)
        need_root
        host_index "${1:-}"
        add_rules "iifname \"vb$1\" drop" "oifname \"vb$1\" drop"
        ;;
    cut-inbound)
        need_root
        host_index "${1:-}"
        add_rules "oifname \"vb$1\" drop"
        ;;
    loss)
        need_root
        host_index "${1:-}"
        k="${2:-}"
        case "$k" in '' | *[!0-9]* | 0 | 1) die "loss I K: K must be a number >= 2 (1 packet in K dropped)" ;; esac
        add_rules "iifname \"vb$1\" numgen random mod $k == 0 counter drop" \
            "oifname \"vb$1\" numgen random mod $k == 0 counter drop"
        ;;
    link-down)
        need_root
        host_index "${1:-}"
        ip -n "$BR" link set "vb$1" down
        ;;
    heal)
        need_root
        ip netns exec "$BR" nft delete table bridge "$P" 2>/dev/null || true
        for i in $(hosts); do ip -n "$BR" link set "vb$i" up; done
        ;;
    status)
        for i in $(hosts); do
            printf '%s-h%s %s\n' "$P" "$i" "$(ip -n "$P-h$i" -br addr show "vh$i" 2>/dev/null | awk '{print $2, $3}')"
        done
        ip netns exec "$BR" nft list table bridge "$P" 2>/dev/null || echo "(no faults)"
        ;;
    down)
        need_root
        for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-(br|h[0-9]+)$" || true); do
            # Only the processes in our namespaces, by PID.
            for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$pid" 2>/dev/null || true; done
        done
        for ns in $(ip netns list | awk '{print $1}' | grep -E "^$P-(br|h[0-9]+)$" || true); do
            ip netns del "$ns"
        done
        ;;
    -h | --help | help | '')
        sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
        ;;
    *) die "unknown command '$cmd'; use up N | exec I CMD... | addr I | cut I | cut-inbound I | loss I K | link-down I | heal | status | down" ;;
esac
