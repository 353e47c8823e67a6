#!/usr/bin/env bash
# Benchmark (not a test): how long N nodes take to form one rendezvous round, muster against torch 2.15's
# own DynamicRendezvousHandler (the c10d backend torchrun uses), on this machine, min = max = N.
#
# muster: `muster bench rendezvous --nodes N` (simulation mode: a real store server and N agents'
# rendezvous logic as tasks in one process, each with its own loopback connection), RUNS times per N
# (default 3), each bounded by MUSTER_TIMEOUT seconds (default 300); the median of the runs that finished.
# Each node is one descriptor in the bench and one in its store: an N the open-file limit cannot hold
# (32768 under a hard limit of 20000) is refused at once, and its row says so.
# torch: scripts/bench/torch_rendezvous.py (N threads, each a handler with its own TCPStore client), once
# per N, bounded by TORCH_TIMEOUT seconds (default 600). torch's time grows much faster than linearly, so
# once it misses the bound the larger N are not run (TORCH_ALL=1 runs them anyway).
#
# Usage: scripts/bench/rendezvous.sh        NODES="64 256" TORCH_TIMEOUT=300 scripts/bench/rendezvous.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."

NODES="${NODES:-64 256 1024 4096 16384 32768}"
RUNS="${RUNS:-3}"
MUSTER_TIMEOUT="${MUSTER_TIMEOUT:-300}"
TORCH_TIMEOUT="${TORCH_TIMEOUT:-600}"
TORCH_ALL="${TORCH_ALL:-0}"
source scripts/lib.sh
require_positive_ints RUNS MUSTER_TIMEOUT TORCH_TIMEOUT

cargo build --release --quiet
ensure_venv # exports MUSTER_PYTHON and puts the venv first on PATH

MUSTER="$PWD/target/release/muster"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# field FILE KEY: a number from the JSON object in FILE ("a.b" for nested keys).
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

echo "rendezvous benchmark: one round, min = max = N ($(nproc) CPUs, torch $("$MUSTER_PYTHON" -c 'import torch; print(torch.__version__)'))"
echo "goals: muster 1024 nodes < 1 s, 4096 nodes < 5 s"
echo

torch_gave_up=""
for n in $NODES; do
    : >"$work/m$n.total"
    : >"$work/m$n.ops"
    hung=0
    for ((i = 1; i <= RUNS; i++)); do
        if "$MUSTER" bench rendezvous --nodes "$n" --timeout "$MUSTER_TIMEOUT" --json >"$work/run.json" 2>"$work/run.err"; then
            total="$(field "$work/run.json" total_ms)"
            echo "$total" >>"$work/m$n.total"
            echo "$(field "$work/run.json" ops_per_node.mean) $(field "$work/run.json" ops_per_node.max)" >>"$work/m$n.ops"
            # The machine may be shared: the 1-minute load average goes with each figure.
            printf '  muster N=%-5s run %d/%d: %9.1f ms (join %.1f ms, load %s), store ops/node mean %.1f max %s, read/node %.1f KiB\n' \
                "$n" "$i" "$RUNS" "$total" "$(field "$work/run.json" join_ms)" "$(cut -d' ' -f1 /proc/loadavg)" \
                "$(field "$work/run.json" ops_per_node.mean)" \
                "$(field "$work/run.json" ops_per_node.max)" "$(awk -v b="$(field "$work/run.json" read_bytes_per_node.mean)" 'BEGIN { print b / 1024 }')"
        else
            hung=$((hung + 1))
            printf '  muster N=%-5s run %d/%d: FAILED: %s\n' "$n" "$i" "$RUNS" "$(tail -n 1 "$work/run.err")"
        fi
    done
    echo "$hung" >"$work/m$n.hung"

    if [ -n "$torch_gave_up" ] && [ "$TORCH_ALL" != 1 ]; then
        echo "skipped (did not finish at N=$torch_gave_up)" >"$work/t$n"
        echo "  torch  N=$n: skipped, it did not finish within ${TORCH_TIMEOUT}s at N=$torch_gave_up"
        continue
    fi
    # The script bounds itself; the outer timeout only guards against it hanging on the way out.
    if timeout $((TORCH_TIMEOUT + 120)) "$MUSTER_PYTHON" scripts/bench/torch_rendezvous.py "$n" "$TORCH_TIMEOUT" >"$work/torch.json" 2>"$work/torch.err" &&
        grep -q '"seconds"' "$work/torch.json"; then
        field "$work/torch.json" seconds >"$work/t$n"
        echo "  torch  N=$n: $(cat "$work/t$n") s (ok: $(field "$work/torch.json" ok))"
    elif grep -q '"timeout"' "$work/torch.json" 2>/dev/null; then
        echo "did not finish within ${TORCH_TIMEOUT}s" >"$work/t$n"
        echo "  torch  N=$n: did not finish within ${TORCH_TIMEOUT}s ($(field "$work/torch.json" finished) of $n nodes had returned)"
        torch_gave_up="$n"
    else
        echo "failed" >"$work/t$n"
        echo "  torch  N=$n: failed: $(tail -n 3 "$work/torch.err")"
        torch_gave_up="$n"
    fi
done

echo
printf '%6s | %-22s | %-16s | %-34s | %s\n' N "muster seal (median)" "ops/node (mean)" "torch" "ratio torch/muster"
printf '%s\n' "-------+------------------------+------------------+------------------------------------+-------------------"
for n in $NODES; do
    m="$(median "$work/m$n.total")"
    hung="$(cat "$work/m$n.hung")"
    if [ -n "$m" ]; then
        mcol="$(awk -v m="$m" 'BEGIN { printf "%.1f ms", m }')"
        [ "$hung" -gt 0 ] && mcol="$mcol ($hung/$RUNS failed)"
        ops="$(awk '{ s += $1 } END { printf "%.1f", s / NR }' "$work/m$n.ops")"
    else
        mcol="all $RUNS runs failed"
        ops="-"
    fi
    t="$(cat "$work/t$n")"
    if [ -n "$m" ] && [[ "$t" =~ ^[0-9.]+$ ]]; then
        tcol="$t s"
        ratio="$(awk -v t="$t" -v m="$m" 'BEGIN { printf "%.0fx", t * 1000 / m }')"
    else
        tcol="$t"
        ratio="-"
    fi
    printf '%6s | %-22s | %-16s | %-34s | %s\n' "$n" "$mcol" "$ops" "$tcol" "$ratio"
done

echo
goal() { # goal N LIMIT_MS
    local m
    [ -f "$work/m$1.total" ] || return 0
    m="$(median "$work/m$1.total")"
    if [ -z "$m" ]; then
        echo "goal: muster $1 nodes < $(($2 / 1000)) s: NOT MET (no run finished)"
    elif awk -v m="$m" -v l="$2" -v h="$(cat "$work/m$1.hung")" 'BEGIN { exit !(m < l && h == 0) }'; then
        echo "goal: muster $1 nodes < $(($2 / 1000)) s: met ($(awk -v m="$m" 'BEGIN { printf "%.0f", m }') ms)"
    else
        echo "goal: muster $1 nodes < $(($2 / 1000)) s: NOT MET (median $(awk -v m="$m" 'BEGIN { printf "%.0f", m }') ms, $(cat "$work/m$1.hung")/$RUNS runs failed)"
    fi
}
goal 1024 1000
goal 4096 5000
