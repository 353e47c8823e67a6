#!/usr/bin/env bash
# Benchmark (not a test): how fast a two-node job recovers, muster against torchrun side by side. Two agents
# on loopback (c10d rendezvous, --nnodes=1:2, two workers each, --max-restarts=3), a fresh job per run, and
# scripts/bench/recovery_worker.py as the worker (it records when it is running: after init_process_group).
#
#   (a) a worker crashes (exits 1): the time from the crash trigger until all 4 workers of the next
#       generation are running again (world size 4);
#   (b) the second agent is killed with SIGKILL: the time until the survivor's workers are running again in
#       the smaller world (world size 2), or "not detected" after DETECT_TIMEOUT seconds (default 60);
#   (c) muster only (torchrun has no health gate): a worker of the second agent crashes and the storage
#       check of its health gate (--gate-path, removed first) fails before it rejoins, so it drains (exit
#       75): the time until the survivor's workers are running again in world size 2, at the default
#       last_call_timeout (30 s), which a shrink must not wait for.
#
# muster runs twice: as is, and with --warm-spares (one idle interpreter per worker with torch.distributed
# already imported, which the next start takes over; the kill comes once the spares have had time to import).
# Times come from the workers' own "running" timestamps, so the script's polling adds nothing. RUNS runs per
# scenario and launcher (default 5); medians and ratios at the end, with the time a bare
# `python -c "import torch.distributed"` takes on this machine for scale.
# Goals: (a) muster at least 10x faster than torchrun; (b) muster under 1 s.
#
# Then the training table (scripts/bench/inplace_recovery.py; TRAINING=0 skips it): the same two agents with
# a worker that trains (an all-reduced step every 20 ms) and whose every start loads a checkpoint of CKPT_MB
# megabytes (default 300), under torchrun, muster (--in-place off), muster-warm (--in-place off with warm
# spares) and muster-inplace (in place, with warm spares): the time from a worker's crash, or from the second
# agent's SIGKILL, to the survivors' first step (median and p95 of RUNS runs). Goals: muster-inplace within
# 1 s of both (a peer's loss: the group shrinks; a worker's death: its replacement comes from a spare).
# TRAINING_MODEL=big: the workers train 101M parameters with AdamW (1.2 GB of state) instead of a small model.
#
# SCENARIOS picks the scenarios (default "crash agent-kill drain").
# METRICS=1 runs every muster agent with --metrics-port=0 and scrapes each one's /metrics every 100 ms
# (curl, for the whole run), to compare recovery with the metrics endpoint on and off. LAUNCHERS picks
# the launchers (default "muster muster-warm torchrun").
#
# Usage: scripts/bench/recovery.sh          RUNS=3 DETECT_TIMEOUT=30 scripts/bench/recovery.sh
#        METRICS=1 LAUNCHERS=muster scripts/bench/recovery.sh
set -euo pipefail
export LC_ALL=C
if [ -z "${EPOCHREALTIME:-}" ]; then echo "bench: needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; fi
cd "$(dirname "$0")/../.."

RUNS="${RUNS:-5}"
DETECT_TIMEOUT="${DETECT_TIMEOUT:-60}"
WARM_WAIT="${WARM_WAIT:-6}"
METRICS="${METRICS:-0}"
TRAINING="${TRAINING:-1}"
CKPT_MB="${CKPT_MB:-300}"
read -r -a LAUNCHERS <<<"${LAUNCHERS:-muster muster-warm torchrun}"
read -r -a SCENARIOS <<<"${SCENARIOS:-crash agent-kill drain}"
source scripts/lib.sh
require_positive_ints RUNS DETECT_TIMEOUT WARM_WAIT CKPT_MB
case "$TRAINING" in 0 | 1) ;; *) echo "TRAINING must be 0 (skip the training table) or 1, got '$TRAINING'" >&2; exit 2 ;; esac
case "$METRICS" in 0 | 1) ;; *) echo "METRICS must be 0 (off) or 1 (scrape every 100 ms), got '$METRICS'" >&2; exit 2 ;; esac
for sc in "${SCENARIOS[@]}"; do
    case "$sc" in crash | agent-kill | drain) ;; *) echo "SCENARIOS: unknown scenario '$sc' (crash, agent-kill, drain)" >&2; exit 2 ;; esac
done
for l in "${LAUNCHERS[@]}"; do
    case "$l" in muster | muster-warm | torchrun) ;; *) echo "LAUNCHERS: unknown launcher '$l' (muster, muster-warm, torchrun)" >&2; exit 2 ;; esac
done
if [ "$METRICS" = 1 ] && ! command -v curl >/dev/null 2>&1; then echo "METRICS=1 needs curl" >&2; exit 2; fi

cargo build --release --quiet
ensure_venv # exports MUSTER_PYTHON and puts the venv (with torchrun) first on PATH

MUSTER="$PWD/target/release/muster"
TORCHRUN="$(command -v torchrun)"
WORKER="$PWD/scripts/bench/recovery_worker.py"
work="$(mktemp -d)"
agents=() # process group ids (each agent leads its own session)
scrapers=() # METRICS=1: the scraper loops' pids

# Stops every agent of the current job: a polite SIGTERM (both launchers then stop their workers), SIGKILL
# to the group after 5 s, then any worker of the job still alive (torchrun leaves them behind when it is
# SIGKILLed; they also exit on their own when orphaned).
stop_job() {
    local dir="${1:-}" pg pid i
    [ -n "$dir" ] && : >"$dir/finish"
    for pid in "${scrapers[@]}"; do kill "$pid" 2>/dev/null || true; done
    scrapers=()
    for pg in "${agents[@]}"; do kill -TERM -- "-$pg" 2>/dev/null || true; done
    for ((i = 0; i < 50; i++)); do
        local alive=0
        for pg in "${agents[@]}"; do kill -0 -- "-$pg" 2>/dev/null && alive=1; done
        [ "$alive" = 0 ] && break
        sleep 0.1
    done
    for pg in "${agents[@]}"; do kill -KILL -- "-$pg" 2>/dev/null || true; done
    if [ -n "$dir" ] && [ -d "$dir/running" ]; then
        for pid in $(ls "$dir/running"); do
            if grep -qs recovery_worker "/proc/$pid/cmdline"; then kill -KILL "$pid" 2>/dev/null || true; fi
        done
    fi
    agents=()
}
current_dir=""
# KEEP=1 keeps every job's directory (agent logs, worker markers) for a look afterwards.
trap 'stop_job "$current_dir"; if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work" >&2; else rm -rf "$work"; fi' EXIT
trap 'exit 130' INT TERM

# running_since DIR T0 WORLD: "<count> <last running time> <last process start>" of the workers running in
# a world of WORLD that started after T0.
running_since() {
    cat "$1"/running/* 2>/dev/null | awk -v t0="$2" -v w="$3" '$6 > t0 && $2 == w {
        n++; if ($1 > r) r = $1; if ($6 > s) s = $6 } END { printf "%d %.6f %.6f\n", n, r, s }'
}

# wait_running DIR T0 WORLD COUNT TIMEOUT: waits until COUNT workers started after T0 run in a world of WORLD.
# Prints "<seconds from T0 to the last of them running> <seconds from T0 to the last one's process start>",
# "exited" when every agent is gone first, or nothing after TIMEOUT seconds.
wait_running() {
    local deadline n running started pg alive
    deadline="$(awk -v t="$EPOCHREALTIME" -v s="$5" 'BEGIN { printf "%.6f", t + s }')"
    while awk -v now="$EPOCHREALTIME" -v d="$deadline" 'BEGIN { exit !(now < d) }'; do
        read -r n running started < <(running_since "$1" "$2" "$3")
        if [ "$n" -ge "$4" ]; then
            awk -v a="$2" -v r="$running" -v s="$started" 'BEGIN { printf "%.4f %.4f\n", r - a, s - a }'
            return
        fi
        alive=0
        for pg in "${agents[@]}"; do kill -0 "$pg" 2>/dev/null && alive=1; done
        if [ "$alive" = 0 ]; then
            echo exited
            return
        fi
        sleep 0.02
    done
}

free_port() {
    "$MUSTER_PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# scrape LOG COUNT: once the agent whose log is LOG says where its metrics are, GETs them every 100 ms,
# a line in COUNT for each answered scrape (so a run shows that scraping happened).
scrape() {
    local addr="" i
    for ((i = 0; i < 600; i++)); do
        addr="$(sed -n 's|.*metrics on http://\([^/]*\)/metrics.*|\1|p' "$1" | head -n 1)"
        [ -n "$addr" ] && break
        sleep 0.05
    done
    [ -z "$addr" ] && return
    while :; do
        if curl -s -f -o /dev/null --max-time 1 "http://$addr/metrics"; then echo >>"$2"; fi
        sleep 0.1
    done
}

# start_job LAUNCHER DIR: starts two agents of a fresh job whose workers write under DIR.
start_job() {
    local launcher="$1" dir="$2" run_id="bench$RANDOM$RANDOM" port i
    mkdir -p "$dir/running"
    : >"$dir/scrapes"
    # The agents' redirections happen in the background; the port is read from a.log before they may have.
    : >"$dir/a.log"
    local common=(--nnodes=1:2 --nproc-per-node=2 --rdzv-backend=c10d "--rdzv-id=$run_id" --max-restarts=3)
    if [ "$launcher" = muster-warm ]; then
        common+=(--warm-spares=torch.distributed --warm-spares-delay=0)
    fi
    if [ "$launcher" != torchrun ] && [ "$METRICS" = 1 ]; then
        common+=(--metrics-port=0)
    fi
    if [ "$launcher" != torchrun ]; then
        BENCH_NODE=a setsid "$MUSTER" "${common[@]}" --rdzv-endpoint=127.0.0.1:0 --rdzv-conf=is_host=1 \
            "$WORKER" "$dir" >"$dir/a.log" 2>&1 &
        agents+=("$!")
        port=""
        for ((i = 0; i < 300; i++)); do
            port="$(sed -n 's/.*rdzv_store=127\.0\.0\.1:\([0-9]*\) (hosted here).*/\1/p' "$dir/a.log" | head -n 1)"
            [ -n "$port" ] && break
            sleep 0.05
        done
        if [ -z "$port" ]; then echo "bench: the first muster agent reported no store port:" >&2; cat "$dir/a.log" >&2; exit 1; fi
        mkdir -p "$dir/gate"
        BENCH_NODE=b setsid "$MUSTER" "${common[@]}" "--rdzv-endpoint=127.0.0.1:$port" "--gate-path=$dir/gate" \
            "$WORKER" "$dir" >"$dir/b.log" 2>&1 &
        agents+=("$!")
        if [ "$METRICS" = 1 ]; then
            scrape "$dir/a.log" "$dir/scrapes" &
            scrapers+=("$!")
            scrape "$dir/b.log" "$dir/scrapes" &
            scrapers+=("$!")
        fi
    else
        port="$(free_port)"
        BENCH_NODE=a setsid "$TORCHRUN" "${common[@]}" "--rdzv-endpoint=127.0.0.1:$port" --rdzv-conf=is_host=1 \
            "$WORKER" "$dir" >"$dir/a.log" 2>&1 &
        agents+=("$!")
        BENCH_NODE=b setsid "$TORCHRUN" "${common[@]}" "--rdzv-endpoint=127.0.0.1:$port" --rdzv-conf=is_host=0 \
            "$WORKER" "$dir" >"$dir/b.log" 2>&1 &
        agents+=("$!")
    fi
    if [[ ! "$(wait_running "$dir" 0 4 4 120)" =~ ^[0-9] ]]; then
        echo "bench: $launcher: the job did not start 4 workers within 120 s; agent logs:" >&2
        tail -n 20 "$dir/a.log" "$dir/b.log" >&2
        exit 1
    fi
}

# run_scenario LAUNCHER SCENARIO RUN: one run; appends "<total s> <launcher s>", "-" (not detected in time)
# or "x" (the agents gave up) to $work/LAUNCHER.SCENARIO.
run_scenario() {
    local launcher="$1" scenario="$2" run="$3" dir t0 secs total share
    dir="$work/$launcher-$scenario-$run"
    current_dir="$dir"
    start_job "$launcher" "$dir"
    sleep 1 # let the round settle (torchrun's keep-alive timers, muster's watches)
    # Four spares import torch on this machine's cores once the workers run; give them the time it takes.
    [ "$launcher" = muster-warm ] && sleep "$WARM_WAIT"
    t0="$EPOCHREALTIME"
    if [ "$scenario" = crash ]; then
        : >"$dir/crash"
        secs="$(wait_running "$dir" "$t0" 4 4 "$DETECT_TIMEOUT")"
    elif [ "$scenario" = drain ]; then
        rmdir "$dir/gate"
        : >"$dir/crash-b"
        secs="$(wait_running "$dir" "$t0" 2 2 "$DETECT_TIMEOUT")"
        # b says why it drained as it exits (75), which may come after a's workers run again.
        for ((i = 0; i < 100; i++)); do kill -0 "${agents[1]}" 2>/dev/null || break; sleep 0.1; done
        grep -qs "health check 'storage' failed" "$dir/b.log" || echo "  (b did not drain at its gate: see $dir/b.log)"
    else
        kill -KILL "${agents[1]}"
        wait "${agents[1]}" 2>/dev/null || true # reaped here, so bash reports no "Killed" job
        secs="$(wait_running "$dir" "$t0" 2 2 "$DETECT_TIMEOUT")"
    fi
    stop_job "$dir"
    current_dir=""
    if [ "$launcher" = muster-warm ] && grep -qs "warm spare still importing" "$dir/a.log" "$dir/b.log"; then
        echo "  (a spare had not finished importing when it was needed: raise WARM_WAIT, now $WARM_WAIT s)"
    fi
    if [[ "$secs" =~ ^[0-9] ]]; then
        echo "$secs" >>"$work/$launcher.$scenario"
        read -r total share <<<"$secs"
        printf '  %-8s %-12s run %d/%d: %8.1f ms (last worker spawned after %.1f ms)%s\n' "$launcher" "$scenario" "$run" \
            "$RUNS" "$(awk -v s="$total" 'BEGIN { print s * 1000 }')" "$(awk -v s="$share" 'BEGIN { print s * 1000 }')" \
            "$([ "$METRICS" = 1 ] && [ "$launcher" != torchrun ] && echo ", $(wc -l <"$dir/scrapes" 2>/dev/null || echo 0) scrapes answered")"
    elif [ "$secs" = exited ]; then
        echo "x" >>"$work/$launcher.$scenario"
        printf '  %-8s %-12s run %d/%d: did not recover: every agent exited (see its last lines below)\n' "$launcher" \
            "$scenario" "$run" "$RUNS"
        grep -h -m 1 -E "Gloo connectFullMesh failed|RendezvousConnectionError|ChildFailedError" "$dir/a.log" "$dir/b.log" |
            cut -c1-160 | sed 's/^/      /' || true
    else
        echo "-" >>"$work/$launcher.$scenario"
        printf '  %-8s %-12s run %d/%d: not detected within %d s\n' "$launcher" "$scenario" "$run" "$RUNS" "$DETECT_TIMEOUT"
    fi
}

echo "recovery benchmark: 2 agents x 2 workers on loopback, c10d rendezvous, metrics $([ "$METRICS" = 1 ] && echo "on, scraped every 100 ms" || echo off), $RUNS runs each ($(nproc) CPUs, torch $("$MUSTER_PYTHON" -c 'import torch; print(torch.__version__)'))"
import_times=()
for ((i = 0; i < 3; i++)); do
    t0="$EPOCHREALTIME"
    "$MUSTER_PYTHON" -c "import torch.distributed"
    import_times+=("$(awk -v a="$t0" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.0f", (b - a) * 1000 }')")
done
import_ms="$(printf '%s\n' "${import_times[@]}" | sort -n | sed -n 2p)"
echo "a bare python -c 'import torch.distributed' takes $import_ms ms here (median of 3)"
echo "goals: (a) worker crash: muster >= 10x faster than torchrun; (b) agent SIGKILL, (c) a drain: muster < 1 s"
for scenario in crash agent-kill drain; do
    for launcher in muster muster-warm torchrun; do : >"$work/$launcher.$scenario"; done
    [[ " ${SCENARIOS[*]} " == *" $scenario "* ]] || continue
    for launcher in "${LAUNCHERS[@]}"; do
        [ "$scenario" = drain ] && [ "$launcher" = torchrun ] && continue
        for ((r = 1; r <= RUNS; r++)); do run_scenario "$launcher" "$scenario" "$r"; done
    done
done

# median FILE: the median time of all runs in FILE, a failed run counting as longer than any, so "inf" when
# half of the runs or more failed; nothing for an empty file.
median() {
    awk '{ print ($1 == "-" || $1 == "x") ? "1e18" : $1 }' "$1" | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit; m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; if (m >= 1e17) print "inf"; else print m }'
}

# share_median FILE: the median launcher share (second column) of the runs that recovered.
share_median() {
    awk '$1 != "-" && $1 != "x" { print $2 }' "$1" | sort -g | awk '{ v[NR] = $1 }
        END { if (NR == 0) exit; print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# cell FILE: a table cell: the median, how many runs failed, and the launcher share.
cell() {
    local m failed gave_up share
    if [ ! -s "$1" ]; then printf 'not run'; return; fi
    m="$(median "$1")"
    failed="$(grep -c '^[-x]$' "$1" || true)"
    gave_up="$(grep -c '^x$' "$1" || true)"
    share="$(share_median "$1")"
    if [ "$m" = inf ]; then
        if [ "$gave_up" -gt 0 ]; then printf '> %d s (%d/%d did not recover)' "$DETECT_TIMEOUT" "$failed" "$RUNS"
        else printf 'not detected in %d s (%d/%d)' "$DETECT_TIMEOUT" "$failed" "$RUNS"; fi
    else
        awk -v m="$m" -v s="$share" -v f="$failed" -v r="$RUNS" 'BEGIN {
            printf "%.1f ms (%.1f ms)%s", m * 1000, s * 1000, (f > 0 ? sprintf(", %d/%d failed", f, r) : "") }'
    fi
}

echo
echo "medians over all runs (a run that did not recover counts as slower than any); in parentheses the"
echo "launcher's share: from the event until the last new worker process started (median of recovered runs)."
echo "muster-warm is muster --warm-spares=torch.distributed."
printf '%-27s | %-34s | %-34s | %-34s | %s\n' scenario muster muster-warm torchrun "torchrun/muster(-warm)"
for scenario in crash agent-kill drain; do
    t="$(median "$work/torchrun.$scenario")"
    ratios=""
    for launcher in muster muster-warm; do
        m="$(median "$work/$launcher.$scenario")"
        ratio="-"
        if [ -n "$m" ] && [ "$m" != inf ]; then
            if [ "$t" = inf ]; then ratio="$(awk -v m="$m" -v d="$DETECT_TIMEOUT" 'BEGIN { printf "> %.0fx", d / m }')"
            elif [ -n "$t" ]; then ratio="$(awk -v m="$m" -v t="$t" 'BEGIN { printf "%.1fx", t / m }')"; fi
        fi
        ratios="${ratios:+$ratios / }$ratio"
    done
    label="(a) worker crash -> 4 up"
    [ "$scenario" = agent-kill ] && label="(b) agent SIGKILL -> 2 up"
    [ "$scenario" = drain ] && label="(c) b drains at its gate -> 2 up"
    printf '%-27s | %-34s | %-34s | %-34s | %s\n' "$label" "$(cell "$work/muster.$scenario")" \
        "$(cell "$work/muster-warm.$scenario")" "$(cell "$work/torchrun.$scenario")" "$ratios"
done

# goal_a LAUNCHER, goal_b LAUNCHER: one verdict line each.
goal_a() {
    local m t
    m="$(median "$work/$1.crash")"
    t="$(median "$work/torchrun.crash")"
    if [ -z "$m" ] || [ "$m" = inf ]; then
        echo "goal (a) >= 10x faster than torchrun, $1: NOT MET ($1 did not recover in most runs)"
    elif [ "$t" = inf ] && awk -v m="$m" -v d="$DETECT_TIMEOUT" 'BEGIN { exit !(d / m >= 10) }'; then
        echo "goal (a) >= 10x faster than torchrun, $1: met (torchrun did not recover within ${DETECT_TIMEOUT} s in most runs)"
    elif [ "$t" != inf ] && awk -v m="$m" -v t="$t" 'BEGIN { exit !(t / m >= 10) }'; then
        echo "goal (a) >= 10x faster than torchrun, $1: met"
    else
        echo "goal (a) >= 10x faster than torchrun, $1: NOT MET"
    fi
}
# goal_fast LAUNCHER SCENARIO LETTER: under 1 s end to end (else the launcher's share, said).
goal_fast() {
    local m share
    m="$(median "$work/$1.$2")"
    share="$(share_median "$work/$1.$2")"
    if [ -n "$m" ] && [ "$m" != inf ] && awk -v m="$m" 'BEGIN { exit !(m < 1) }' && ! grep -q '^[-x]$' "$work/$1.$2"; then
        echo "goal ($3) under 1 s, $1: met ($(awk -v s="$m" 'BEGIN { printf "%.0f", s * 1000 }') ms)"
    elif [ -n "$share" ] && [ "$m" != inf ]; then
        echo "goal ($3) under 1 s, $1: NOT MET end to end ($(awk -v s="$m" 'BEGIN { printf "%.0f", s * 1000 }') ms); the" \
            "launcher's share (until the new workers were spawned) is $(awk -v s="$share" 'BEGIN { printf "%.0f", s * 1000 }') ms," \
            "the rest is the workers' own start (importing torch: $import_ms ms alone here; forming the gloo group)"
    else
        echo "goal ($3) under 1 s, $1: NOT MET"
    fi
}
echo
for launcher in muster muster-warm; do if [ -s "$work/$launcher.crash" ]; then goal_a "$launcher"; fi; done
for launcher in muster muster-warm; do if [ -s "$work/$launcher.agent-kill" ]; then goal_fast "$launcher" agent-kill b; fi; done
for launcher in muster muster-warm; do if [ -s "$work/$launcher.drain" ]; then goal_fast "$launcher" drain c; fi; done

if [ "$TRAINING" = 1 ]; then
    echo
    echo "training table: the survivors' first step after a fault (each start loads a ${CKPT_MB} MB checkpoint)"
    "$MUSTER_PYTHON" scripts/bench/inplace_recovery.py --muster "$MUSTER" --torchrun "$TORCHRUN" \
        --api "$PWD/src/inplace/python" --work "$work/training" --runs "$RUNS" --ckpt-mb "$CKPT_MB" \
        --timeout "$DETECT_TIMEOUT" --warm-wait "$WARM_WAIT" --model "${TRAINING_MODEL:-small}"
fi
