#!/usr/bin/env bash
# Store throughput: muster's store vs torch's own (libuv) TCPStore server under the same load
# (examples/store_load.rs: N connections each looping set/get/add/wait), at 64 and 1024
# connections. Prints ops/s for each, the ratio muster/torch, and how long connecting the N
# clients took (outside the measured period; torch's libuv server accepts bursts slowly).
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

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "load: set/get/add/wait per connection, ${seconds}s per run, client and server on this host"
printf '%-12s %14s %14s %8s %18s %18s\n' connections "muster ops/s" "torch ops/s" ratio \
    "muster connect s" "torch connect s"
for n in $sizes; do
    read -r muster muster_connect < <(target/release/examples/store_load "127.0.0.1:$muster_port" "$n" "$seconds")
    read -r torch torch_connect < <(target/release/examples/store_load "127.0.0.1:$torch_port" "$n" "$seconds")
    ratio=$(awk -v m="$muster" -v t="$torch" 'BEGIN { printf "%.2f", m / t }')
    printf '%-12s %14s %14s %8s %18s %18s\n' "$n" "$muster" "$torch" "$ratio" "$muster_connect" "$torch_connect"
done
