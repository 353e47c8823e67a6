#!/usr/bin/env bash
# Store throughput: muster's store vs torch's own (libuv) TCPStore server under the same load
# (examples/store_load.rs: N connections each looping set/get/add/wait), at 64 and 1024
# connections. Prints ops/s for each, the ratio muster/torch, each server's CPU time per
# operation (throughput on a shared host is noisy; CPU per op is not), and how long connecting
# the N clients took (outside the measured period; torch's libuv server accepts bursts slowly).
#
# Env: MUSTER_PYTHON (a Python with torch; default: the cached venv), BENCH_SECONDS (per run,
# default 5), BENCH_CONNECTIONS (default "64 1024").
set -euo pipefail
cd "$(dirname "$0")/../.."

python=${MUSTER_PYTHON:-/root/.cache/muster/venv/bin/python}
seconds=${BENCH_SECONDS:-5}
sizes=${BENCH_CONNECTIONS:-64 1024}

# Each connection is a socket on both ends, all in this process tree.
ulimit -n "$(ulimit -Hn)"

cargo build --release --quiet --example store_load --bin muster

tmp=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    rm -rf "$tmp"
}
trap cleanup EXIT

# Waits for "<...> listening on <...>:PORT" or "<...> listening on PORT" in $1; prints PORT.
port_from() {
    for _ in $(seq 600); do
        if grep -q "listening on" "$1" 2>/dev/null; then
            grep -m1 "listening on" "$1" | sed 's/.*[: ]//'
            return
        fi
        sleep 0.1
    done
    echo "no server announcement in $1" >&2
    exit 1
}

RUST_LOG=warn target/release/muster store --host 127.0.0.1 --port 0 >"$tmp/muster.out" 2>"$tmp/muster.err" &
pids+=($!)
# The torch helper serves until its stdin closes: hold a FIFO open for it.
mkfifo "$tmp/torch.in"
"$python" tests/interop/torch_store_server.py libuv <"$tmp/torch.in" >"$tmp/torch.out" 2>"$tmp/torch.err" &
pids+=($!)
exec 3>"$tmp/torch.in"

muster_port=$(port_from "$tmp/muster.out")
torch_port=$(port_from "$tmp/torch.out")
muster_pid=${pids[0]}
torch_pid=${pids[1]}

# CPU time (user + system, in clock ticks) a process has used so far.
cpu_ticks() {
    awk '{ print $14 + $15 }' "/proc/$1/stat"
}

# Runs the load against port $2 with $3 connections; prints "ops/s connect_s cpu_us_per_op",
# the last being the server's ($1) CPU time per operation: robust to other load on the host.
measure() {
    local before after ops_per_sec connect total
    before=$(cpu_ticks "$1")
    read -r ops_per_sec connect total < <(target/release/examples/store_load "127.0.0.1:$2" "$3" "$seconds")
    after=$(cpu_ticks "$1")
    awk -v o="$ops_per_sec" -v c="$connect" -v t="$total" -v d="$((after - before))" -v hz="$(getconf CLK_TCK)" \
        'BEGIN { printf "%s %s %.2f\n", o, c, d * 1e6 / hz / t }'
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "load: set/get/add/wait per connection, ${seconds}s per run, client and server on this host"
format='%-12s %13s %13s %6s %16s %16s %11s %11s\n'
# shellcheck disable=SC2059
printf "$format" connections "muster ops/s" "torch ops/s" ratio "muster cpu us/op" "torch cpu us/op" \
    "muster conn" "torch conn"
for n in $sizes; do
    read -r muster muster_connect muster_cpu < <(measure "$muster_pid" "$muster_port" "$n")
    read -r torch torch_connect torch_cpu < <(measure "$torch_pid" "$torch_port" "$n")
    ratio=$(awk -v m="$muster" -v t="$torch" 'BEGIN { printf "%.2f", m / t }')
    # shellcheck disable=SC2059
    printf "$format" "$n" "$muster" "$torch" "$ratio" "$muster_cpu" "$torch_cpu" \
        "${muster_connect}s" "${torch_connect}s"
done
