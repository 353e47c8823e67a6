# What scripts/bench/straggler.sh and scripts/stress/straggler.sh share: two-node jobs of
# scripts/bench/pace_worker.py on loopback, under torchrun or muster. Source it after scripts/lib.sh and
# ensure_venv, with the release build done.
MUSTER="$PWD/target/release/muster"
TORCHRUN="$(command -v torchrun)"
WORKER="$PWD/scripts/bench/pace_worker.py"
work="$(mktemp -d)"
pgs=()

stop_all() {
    local pg
    for pg in "${pgs[@]}"; do kill -TERM -- "-$pg" 2>/dev/null || true; done
    sleep 1
    for pg in "${pgs[@]}"; do kill -KILL -- "-$pg" 2>/dev/null || true; done
    for pg in "${pgs[@]}"; do wait "$pg" 2>/dev/null || true; done # reaped here: bash says no "Killed"
    pgs=()
}
# KEEP=1 keeps every job's directory (agent logs, step counts) for a look afterwards.
trap 'stop_all; if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work" >&2; else rm -rf "$work"; fi' EXIT
trap 'exit 130' INT TERM

free_port() {
    "$MUSTER_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# agent DIR NODE LAUNCHER PORT HOST ARGS...: starts one agent in a session of its own.
agent() {
    local dir="$1" node="$2" launcher="$3" port="$4" host="$5"
    shift 5
    local bin="$MUSTER"
    [ "$launcher" = torchrun ] && bin="$TORCHRUN"
    BENCH_NODE="$node" setsid "$bin" --nproc-per-node=2 --rdzv-backend=c10d "--rdzv-endpoint=127.0.0.1:$port" \
        "--rdzv-id=$(basename "$dir")" "--rdzv-conf=is_host=$host" --max-restarts=0 "$@" "$WORKER" "$dir" \
        >"$dir/$node.log" 2>&1 &
    pgs+=("$!")
}

# rate DIR: steps per second over every stretch rank 0 wrote.
rate() { cat "$1"/steps-* 2>/dev/null | awk '{ s += $1; t += $2 } END { if (t > 0) printf "%.2f", s / t; else print "-" }' || true; }

# job NAME LAUNCHER SLOW_NODE WORK SECONDS [muster flags...]: one run of a two-node job (and, with
# --on-straggler=drain among the flags, a spare c started once the job runs); waits for its end.
job() {
    local name="$1" launcher="$2" slow="$3" kind="$4" secs="$5"
    shift 5
    local dir="$work/$name" port deadline i
    mkdir -p "$dir"
    port="$(free_port)"
    deadline="$(awk -v t="$EPOCHREALTIME" -v s="$secs" 'BEGIN { printf "%.3f", t + s + 15 }')"
    export PACE_DEADLINE="$deadline" PACE_SLOW_NODE="$slow" PACE_WORK="$kind"
    local nnodes=2
    [[ " $* " == *" --on-straggler=drain "* ]] && nnodes=2:2
    agent "$dir" a "$launcher" "$port" 1 "--nnodes=$nnodes" "$@"
    agent "$dir" b "$launcher" "$port" 0 "--nnodes=$nnodes" "$@"
    if [ "$nnodes" = 2:2 ]; then
        sleep 10 # a and b form the round first; c then waits as a spare
        agent "$dir" c "$launcher" "$port" 0 "--nnodes=$nnodes" "$@"
    fi
    for ((i = 0; i < (secs + 60) * 10; i++)); do
        local alive=0 pg
        # The agent itself: its session may not exist yet when it was just started.
        for pg in "${pgs[@]}"; do kill -0 "$pg" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    stop_all
    unset PACE_DEADLINE PACE_SLOW_NODE PACE_WORK
}

named() { grep -h "straggler: rank" "$1"/*.log 2>/dev/null | head -n 1 | sed 's/.*straggler: /straggler: /'; }
