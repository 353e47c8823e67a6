#!/usr/bin/env bash
# The comparison docs/multi-node.md makes ("etcd: no node is special"): the node that would host the store
# dies. LAUNCHER=torchrun (default):
# torchrun's c10d rendezvous, whose store lives in the first agent. LAUNCHER=muster-etcd: muster with
# --rdzv-backend etcd against a three-member etcd cluster on loopback (scripts/etcd/cluster.py), where no agent
# holds the rendezvous. Three agents on loopback (--nnodes 2:3, two gloo workers each, --max-restarts 3)
# train examples/train.py; once training runs, the first agent (torchrun: is_host=1, the one whose process
# holds the TCPStore; muster: the first to join, group rank 0, which serves the workers' store) is killed
# with SIGKILL. MODE=node (default) kills its workers at the same instant, as when the host
# goes away; MODE=agent kills the agent process alone (torchrun starts workers in sessions of their own, so they
# would outlive it). The other two agents get WAIT seconds (default 120) to finish or fail; whatever is left then
# is killed by PID. Prints each agent's exit code and a one-paragraph outcome; logs are kept with KEEP=1.
#
# Usage: scripts/etcd/store-host-kill.sh     LAUNCHER=muster-etcd MODE=agent WAIT=60 scripts/etcd/store-host-kill.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."
source scripts/lib.sh
MODE="${MODE:-node}"
LAUNCHER="${LAUNCHER:-torchrun}"
WAIT="${WAIT:-120}"
STEPS="${STEPS:-600}"      # with STEP_SLEEP 0.1: a run of at least 60 s
STEP_SLEEP="${STEP_SLEEP:-0.1}"
KILL_AT_STEP="${KILL_AT_STEP:-50}"
require_positive_ints WAIT STEPS KILL_AT_STEP
case "$MODE" in node | agent) ;; *) echo "MODE must be node or agent, got '$MODE'" >&2; exit 2 ;; esac
case "$LAUNCHER" in torchrun | muster-etcd) ;; *) echo "LAUNCHER must be torchrun or muster-etcd, got '$LAUNCHER'" >&2; exit 2 ;; esac
ensure_venv

work="$(mktemp -d /tmp/muster-c10d-kill.XXXXXX)"
etcd_dir="$work-etcd" # beside the work dir: its members are not the run's processes ours() counts
agents=()

# Our processes only: the agents, and every process whose command line names this run's work dir (the workers).
ours() {
    local p
    for p in /proc/[0-9]*; do
        if tr '\0' ' ' 2>/dev/null <"$p/cmdline" | grep -qF -- "$work/"; then echo "${p#/proc/}"; fi
    done
}
cleanup() {
    local pid
    for pid in "${agents[@]}" $(ours); do kill -KILL "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    if [ -f "$etcd_dir/cluster.json" ]; then python3 scripts/etcd/cluster.py stop --dir "$etcd_dir" >/dev/null 2>&1 || true; fi
    rm -rf "$etcd_dir"
    if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work" >&2; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

train=(examples/train.py --steps "$STEPS" --step-sleep "$STEP_SLEEP" --ckpt-dir "$work/ckpt" --ckpt-every 10)
if [ "$LAUNCHER" = torchrun ]; then
    port="$("$MUSTER_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')"
    common=(--nnodes 2:3 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port"
        --rdzv-id "c10dkill$RANDOM" --max-restarts 3)
    for node in a b c; do
        host=0
        [ "$node" = a ] && host=1
        "$MUSTER_PYTHON" -m torch.distributed.run "${common[@]}" --rdzv-conf "is_host=$host" "${train[@]}" \
            >"$work/$node.log" 2>&1 &
        agents+=("$!")
        [ "$node" = a ] && sleep 2 # the store host binds its port first
    done
else
    ensure_etcd
    muster="${MUSTER_BIN:-target/release/muster}"
    [ -x "$muster" ] || { echo "build muster first (cargo build --release) or set MUSTER_BIN" >&2; exit 2; }
    python3 scripts/etcd/cluster.py start --members 3 --dir "$etcd_dir" --etcd "$MUSTER_ETCD_34" >/dev/null
    endpoints="$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["endpoints"])' "$etcd_dir/cluster.json")"
    common=(--nnodes 2:3 --nproc-per-node 2 --rdzv-backend etcd --rdzv-endpoint "$endpoints"
        --rdzv-id "etcdkill$RANDOM" --max-restarts 3 --rdzv-conf last_call_timeout=5)
    for node in a b c; do
        "$muster" "${common[@]}" "${train[@]}" >"$work/$node.log" 2>&1 &
        agents+=("$!")
        [ "$node" = a ] && sleep 1 # the first to join: group rank 0
    done
fi

# Rank 0 prints "step N: loss=…" every 10 steps; wait until training is well under way.
t0=$SECONDS
until grep -qs "step $KILL_AT_STEP: loss" "$work"/[abc].log; do
    if ((SECONDS - t0 > 180)); then
        echo "the job did not reach step $KILL_AT_STEP within 180 s; agent logs:" >&2
        tail -n 20 "$work"/[abc].log >&2
        exit 1
    fi
    sleep 0.2
done
workers_a="$(ps -o pid= --ppid "${agents[0]}" | tr -s ' \n' ' ')"
echo "training at step $KILL_AT_STEP after $((SECONDS - t0)) s; kill -9 of agent a (pid ${agents[0]}, the first agent)" \
    "$([ "$MODE" = node ] && echo "and its workers ($workers_a)")"
if [ "$MODE" = node ]; then
    # shellcheck disable=SC2086 # a list of PIDs
    kill -KILL "${agents[0]}" $workers_a
else
    kill -KILL "${agents[0]}"
fi
wait "${agents[0]}" 2>/dev/null || true
t_kill=$SECONDS

# The survivors: an exit code each, or "running" when WAIT passes first.
declare -A code when
for i in 1 2; do code[$i]=running; done
while ((SECONDS - t_kill < WAIT)); do
    left=0
    for i in 1 2; do
        [ "${code[$i]}" != running ] && continue
        if kill -0 "${agents[$i]}" 2>/dev/null; then
            left=1
        else
            rc=0
            wait "${agents[$i]}" || rc=$?
            code[$i]=$rc
            when[$i]=$((SECONDS - t_kill))
        fi
    done
    [ "$left" = 0 ] && break
    sleep 0.2
done

finished="$(grep -h "done: steps=" "$work"/[bc].log || true)"
orphans="$(ours | wc -l)"
summary() {
    local i=$1 node=$2
    if [ "${code[$i]}" = running ]; then
        echo "agent $node was still running after $WAIT s (killed then)"
    else
        echo "agent $node exited with code ${code[$i]} ${when[$i]} s after the kill"
    fi
}
# first_line PATTERN LOG: the first line of LOG matching PATTERN (grep -E), or "none"; last_line likewise.
first_line() { { grep -E -m 1 -- "$1" "$2" || echo none; } | cut -c1-220; }
last_line() { { grep -E -- "$1" "$2" || echo none; } | tail -n 1 | cut -c1-220; }
worker_error="$(first_line '^\[rank[0-9]+\]: [A-Za-z_.]*(Error|Exception): ' "$work/b.log")"
agent_error="$(last_line '^[A-Za-z_.]*(Error|Exception): ' "$work/b.log")"
echo
echo "--- last lines of agent b:"; tail -n 8 "$work/b.log"
echo "--- last lines of agent c:"; tail -n 8 "$work/c.log"
echo
what="$([ "$LAUNCHER" = torchrun ] && echo "torchrun agents" || echo "muster agents (etcd, 3 members)")"
victim="$([ "$LAUNCHER" = torchrun ] && echo "the agent hosting the c10d store" || echo "the agent that joined first (group rank 0)")"
echo "Outcome (torch $("$MUSTER_PYTHON" -c 'import torch; print(torch.__version__)'), $LAUNCHER, MODE=$MODE):" \
    "three $what × two gloo workers trained examples/train.py for $STEPS steps;" \
    "at step $KILL_AT_STEP $victim was killed with SIGKILL" \
    "$([ "$MODE" = node ] && echo "together with its workers" || echo "(its workers left running)")." \
    "$(summary 1 b); $(summary 2 c)." \
    "In b's log, the first worker error: '$worker_error'; the agent's last error: '$agent_error'." \
    "$([ -n "$finished" ] && echo "A survivor reported the training done ($finished)." ||
        echo "No survivor finished the training: the job ended with its store host.")" \
    "Processes of the run still alive at the end of the wait: $orphans (killed by PID)."
