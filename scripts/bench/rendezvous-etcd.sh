#!/usr/bin/env bash
# Benchmark (not a test): one rendezvous round of N nodes on etcd v3 and on the Kubernetes API server beside
# the embedded store, and what a node costs each store every second once its round is sealed (heartbeats
# running, as while training).
#
# Rows (`muster bench rendezvous --json`, RUNS runs each, default 3, the median of those that finished):
#   - the embedded store (a `muster store` child);
#   - etcd 3.4 (Debian's etcd-server) and etcd 3.5 (scripts/lib.sh's ensure_etcd35), each as the bench's own
#     single member and as a 3-member cluster on loopback (scripts/etcd/cluster.py), the nodes spread over
#     the members as etcd's own clients spread;
#   - a kube-apiserver (scripts/lib.sh's ensure_kube_apiserver) in front of a single etcd 3.5 member, on
#     loopback (scripts/kube/apiserver.py), the nodes signed in as its admin (who may read /metrics);
# for N in NODES (default "256 1024 4096"); STORES (an extended regular expression, default: all) picks
# rows by label. Then one run per store with `--steady STEADY` seconds (default 60) at STEADY_NODES nodes
# (default 1024): store operations, and the server's requests, writes and watch events, per node per second.
#
# Usage: scripts/bench/rendezvous-etcd.sh      NODES="256 1024" RUNS=1 STEADY=20 scripts/bench/rendezvous-etcd.sh
#        STORES='embedded|3.5, own|Kubernetes' scripts/bench/rendezvous-etcd.sh
#        MUSTER_BIN=/path/to/muster scripts/bench/rendezvous-etcd.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."

NODES="${NODES:-256 1024 4096}"
RUNS="${RUNS:-3}"
STEADY="${STEADY:-60}"
STEADY_NODES="${STEADY_NODES:-1024}"
TIMEOUT="${TIMEOUT:-300}"
STORES="${STORES:-.}"
source scripts/lib.sh
require_positive_ints RUNS STEADY STEADY_NODES TIMEOUT

# MUSTER_BIN: a muster binary built already (else this checkout's release build).
[ -n "${MUSTER_BIN:-}" ] || cargo build --release --quiet
ensure_venv >/dev/null # MUSTER_PYTHON reads the reports
ensure_etcd >/dev/null
ETCD34="$(command -v etcd)"
ETCD35="$(ensure_etcd35)"
ensure_kube_apiserver

MUSTER="${MUSTER_BIN:-${CARGO_TARGET_DIR:-$PWD/target}/release/muster}"
work="$(mktemp -d)"
clusters=()
cleanup() {
    local d
    for d in "${clusters[@]}"; do
        python3 scripts/etcd/cluster.py stop --dir "$d" >/dev/null 2>&1 || python3 scripts/kube/apiserver.py stop --dir "$d" >/dev/null 2>&1 || true
    done
    rm -rf "$work"
}
trap cleanup EXIT

# field FILE KEY: a value from the JSON object in FILE ("a.b" for nested keys).
field() {
    "$MUSTER_PYTHON" -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v[k]
print(v)' "$1" "$2"
}

median() {
    sort -g "$1" | awk '{ v[NR] = $1 } END { if (NR == 0) print ""; else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# start_cluster NAME SPEC: a 3-member etcd cluster of binary SPEC, or with SPEC "kube" an API server, stopped
# on exit; what the bench is given ($work/NAME.at): the cluster's endpoints, or the admin's kubeconfig.
start_cluster() {
    clusters+=("$work/$1")
    if [ "$2" = kube ]; then
        python3 scripts/kube/apiserver.py start --dir "$work/$1" --apiserver "$MUSTER_KUBE_APISERVER" --etcd "$ETCD35" \
            --owner $$ >"$work/$1.json"
        "$MUSTER_PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["kubeconfig"]["admin"])' "$work/$1.json" >"$work/$1.at"
    else
        python3 scripts/etcd/cluster.py start --members 3 --dir "$work/$1" --etcd "$2" --owner $$ >"$work/$1.at"
    fi
}

# The stores, as "label|what start_cluster starts (none: nothing)|bench flags", @AT@ in the flags standing
# for what the cluster gives.
all_stores=("embedded store||--backend tcp")
all_stores+=("etcd 3.4, own member||--backend etcd --etcd-binary $ETCD34")
all_stores+=("etcd 3.4, 3 members|$ETCD34|--backend etcd --etcd-endpoint @AT@")
all_stores+=("etcd 3.5, own member||--backend etcd --etcd-binary $ETCD35")
all_stores+=("etcd 3.5, 3 members|$ETCD35|--backend etcd --etcd-endpoint @AT@")
all_stores+=("Kubernetes API server|kube|--backend k8s --kubeconfig @AT@")
stores=()
for s in "${all_stores[@]}"; do
    [[ "${s%%|*}" =~ $STORES ]] && stores+=("$s")
done
[ "${#stores[@]}" -gt 0 ] || { echo "STORES='$STORES' matches no store" >&2; exit 2; }

# open_store S: store S's bench flags in $flags, its cluster started first, fresh. A cluster runs only for
# its own rows (close_store stops it): no other cluster idles beside them with an earlier run's state (a
# 3.4 cluster after a 4096-node round holds over a gigabyte a member).
cluster_runs=0
open_store() {
    local rest="${stores[$1]#*|}"
    local binary="${rest%%|*}"
    flags="${rest#*|}"
    cluster=""
    if [ -n "$binary" ]; then
        cluster_runs=$((cluster_runs + 1))
        cluster="c$1_$cluster_runs"
        start_cluster "$cluster" "$binary"
        flags="${flags//@AT@/$(cat "$work/$cluster.at")}"
    fi
}
close_store() {
    [ -z "$cluster" ] || python3 scripts/etcd/cluster.py stop --dir "$work/$cluster" >/dev/null 2>&1 ||
        python3 scripts/kube/apiserver.py stop --dir "$work/$cluster" >/dev/null 2>&1 || true
}

# server_figures FILE PATH: "requests writes watch-events" of the report's server share at PATH
# (server_per_node, steady.server_per_node_per_s), or "- - -" where the server's metrics were not read.
server_figures() {
    "$MUSTER_PYTHON" -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2].split("."):
    v = v.get(k) if isinstance(v, dict) else None
print("- - -" if v is None else "%.3f %.3f %.3f" % (v["requests"], v["writes"], v["watch_events"]))' "$1" "$2"
}

echo "rendezvous on etcd and the Kubernetes API server: one round, min = max = N ($(nproc) CPUs; $("$ETCD34" --version | head -n 1), $("$ETCD35" --version | head -n 1), kube-apiserver $KUBE_VERSION)"
echo "goals: etcd 1024 nodes < 3 s, 4096 nodes < 10 s, store ops/node within 2 of the embedded store's"
echo

# run_bench FLAGS...: one run into $work/run.json; the 1-minute load average goes with each figure.
run_bench() {
    "$MUSTER" bench rendezvous --timeout "$TIMEOUT" --json "$@" >"$work/run.json" 2>"$work/run.err"
}

# why_failed: what went wrong in the last run: the bench's error, or, where it sealed (its report written),
# the membership events nodes saw after the seal (not a clean round).
why_failed() {
    if [ -s "$work/run.json" ]; then
        printf 'sealed in %.1f ms, then %s' "$(field "$work/run.json" total_ms)" "$("$MUSTER_PYTHON" -c 'import json, sys
p = json.load(open(sys.argv[1]))["problems"]
print(f"{len(p)} problem(s): {p[0]}")' "$work/run.json")"
    else
        tail -n 1 "$work/run.err"
    fi
}

for s in "${!stores[@]}"; do
    label="${stores[$s]%%|*}"
    open_store "$s"
    for n in $NODES; do
        : >"$work/$s.$n.total"
        : >"$work/$s.$n.row"
        for ((i = 1; i <= RUNS; i++)); do
            # shellcheck disable=SC2086 # the flags are words on purpose
            if run_bench $flags --nodes "$n" && [ "$(field "$work/run.json" problems)" = "[]" ]; then
                field "$work/run.json" total_ms >>"$work/$s.$n.total"
                read -r req writes events <<<"$(server_figures "$work/run.json" server_per_node)"
                printf '%.1f %s %s %s\n' "$(field "$work/run.json" ops_per_node.mean)" "$req" "$writes" "$events" >"$work/$s.$n.row"
                printf '  %-22s N=%-5s run %d/%d: %8.1f ms (register %.0f, join %.0f; load %s), ops/node %.2f, server requests/node %s (writes %s, watch events %s)\n' \
                    "$label" "$n" "$i" "$RUNS" "$(field "$work/run.json" total_ms)" "$(field "$work/run.json" register_ms)" \
                    "$(field "$work/run.json" join_ms)" "$(cut -d' ' -f1 /proc/loadavg)" \
                    "$(field "$work/run.json" ops_per_node.mean)" "$req" "$writes" "$events"
            else
                printf '  %-22s N=%-5s run %d/%d: FAILED: %s\n' "$label" "$n" "$i" "$RUNS" "$(why_failed)"
            fi
        done
    done
    close_store
done

echo
printf '%-22s | %6s | %-30s | %-9s | %-16s | %-12s | %s\n' store N "seal, median (runs)" "ops/node" "server req/node" "writes/node" "watch events/node"
printf '%s\n' "-----------------------+--------+--------------------------------+-----------+------------------+--------------+------------------"
for s in "${!stores[@]}"; do
    for n in $NODES; do
        m="$(median "$work/$s.$n.total")"
        if [ -z "$m" ]; then
            printf '%-22s | %6s | %-30s |\n' "${stores[$s]%%|*}" "$n" "no run finished"
            continue
        fi
        runs="$(sort -g "$work/$s.$n.total" | awk '{ printf "%s%.2f", (NR > 1 ? ", " : ""), $1 / 1000 }')"
        read -r ops req writes events <"$work/$s.$n.row"
        printf '%-22s | %6s | %-30s | %-9s | %-16s | %-12s | %s\n' "${stores[$s]%%|*}" "$n" \
            "$(awk -v m="$m" 'BEGIN { printf "%.2f s", m / 1000 }') ($runs)" "$ops" "$req" "$writes" "$events"
    done
done

echo
echo "steady state: $STEADY_NODES nodes, ${STEADY} s after the round is sealed"
for s in "${!stores[@]}"; do
    label="${stores[$s]%%|*}"
    open_store "$s"
    # shellcheck disable=SC2086
    if run_bench $flags --nodes "$STEADY_NODES" --steady "$STEADY" && [ "$(field "$work/run.json" problems)" = "[]" ]; then
        read -r req writes events <<<"$(server_figures "$work/run.json" steady.server_per_node_per_s)"
        printf '  %-22s store ops/node/s %.3f, server requests/node/s %s, writes/node/s %s, watch events/node/s %s\n' "$label" \
            "$(field "$work/run.json" steady.store_ops_per_node_per_s)" "$req" "$writes" "$events"
    else
        printf '  %-22s FAILED: %s\n' "$label" "$(why_failed)"
    fi
    close_store
done
