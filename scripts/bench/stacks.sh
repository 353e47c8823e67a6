#!/usr/bin/env bash
# Benchmark (not a test): what reading the workers' Python stacks costs.
#
# (i) GET /stacks latency. `muster --standalone --nproc-per-node N` (N default 8) with --metrics-port 0 on
# 127.0.0.1 runs N Python workers that import torch and sleep. Once every worker has imported torch and
# /stacks shows N "rank " headers, REQS (default 20) sequential `curl -s` GETs of /stacks (text) and then
# REQS of /stacks?format=json are timed with curl's %{time_total} (connect to last byte; muster captures
# every worker with py-spy per request, bounded at 0.8 s). Reported: median and max in ms, how many
# captures in all came back without a stack ("no stack: ...", and why), and the median and max of the
# captures' own took_ms from the json replies. Each reply must name N ranks, or the bench
# stops. muster is then stopped with SIGTERM (by PID) and waited for; the stop time is shown too.
#
# (ii) --stacks-on-failure stop delay. A 4-worker job (--max-restarts 0, --log-dir in the temp dir): every
# worker imports torch; local rank 0 then waits for the others to be ready, sleeps 5 s, writes its wall
# clock time to a file and exits 1, while the others sleep. Measured: from that timestamp to muster's exit
# (EPOCHREALTIME after it returns; the same clock), with and without --stacks-on-failure, interleaved,
# median of RUNS (default 3). The difference is the delay the capture adds (muster bounds it at 2 s). Each
# run checks that muster exited non-zero and, with the flag, that it logged `stacks written to <dir>` and
# that the dir holds the 3 survivors' stacks.
#
# No pass/fail on timing. Use a release build: py-spy in a debug build is about 10x slower (a capture of an
# idle worker ~350 ms instead of ~25 ms), which puts /stacks near its 0.8 s bound and the failure capture
# in the hundreds of ms.
#
# Usage: scripts/bench/stacks.sh        N=8 REQS=10 RUNS=1 scripts/bench/stacks.sh
#        MUSTER=/path/to/muster scripts/bench/stacks.sh   (another build; default: cargo build --release)
set -euo pipefail
export LC_ALL=C # '.' as the decimal point, for EPOCHREALTIME, printf and awk alike
if [ -z "${EPOCHREALTIME:-}" ]; then echo "bench: needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; fi
cd "$(dirname "$0")/../.."

N="${N:-8}"
REQS="${REQS:-20}"
RUNS="${RUNS:-3}"
source scripts/lib.sh
require_positive_ints N REQS RUNS
command -v curl >/dev/null || { echo "bench: needs curl" >&2; exit 2; }

if [ -z "${MUSTER:-}" ]; then
    cargo build --release --quiet
    MUSTER="$PWD/target/release/muster"
fi
ensure_venv # exports MUSTER_PYTHON and puts the venv first on PATH
work="$(mktemp -d)"
agent=""
cleanup() {
    # Only the muster this script started (by PID); it stops its own workers.
    if [ -n "$agent" ] && kill -0 "$agent" 2>/dev/null; then
        kill -TERM "$agent" 2>/dev/null || true
        wait "$agent" 2>/dev/null || true
    fi
    rm -rf "$work"
}
trap cleanup EXIT

# median FILE: the median of the numbers in FILE, one a line (the mean of the middle two for an even count).
median() {
    sort -g "$1" | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}
ms() { awk -v s="$1" 'BEGIN { printf "%.1f", s * 1000 }'; }

# The workers. sleeper.py: import torch, say so in READY/rank_<R> (its pid), sleep.
cat >"$work/sleeper.py" <<'EOF'
import os, sys, time
import torch  # noqa: F401 (a real worker's stack: the interpreter with torch loaded)
ready = sys.argv[1]
with open(os.path.join(ready, f"rank_{os.environ['RANK']}.tmp"), "w") as f:
    f.write(f"{os.getpid()}\n")
os.replace(os.path.join(ready, f"rank_{os.environ['RANK']}.tmp"), os.path.join(ready, f"rank_{os.environ['RANK']}"))
while True:
    time.sleep(3600)
EOF
# failer.py READY FAILED_AT: as sleeper.py; local rank 0 waits for every local worker to be ready, sleeps 5 s,
# writes time.time() to FAILED_AT and exits 1.
cat >"$work/failer.py" <<'EOF'
import os, sys, time
import torch  # noqa: F401
ready, failed_at = sys.argv[1], sys.argv[2]
rank, local_rank, n = os.environ["RANK"], int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
with open(os.path.join(ready, f"rank_{rank}.tmp"), "w") as f:
    f.write(f"{os.getpid()}\n")
os.replace(os.path.join(ready, f"rank_{rank}.tmp"), os.path.join(ready, f"rank_{rank}"))
if local_rank == 0:
    while len([p for p in os.listdir(ready) if not p.endswith(".tmp")]) < n:
        time.sleep(0.05)
    time.sleep(5)
    with open(failed_at, "w") as f:
        f.write(f"{time.time():.6f}\n")
    os._exit(1)
while True:
    time.sleep(3600)
EOF

# ranks_in FILE FORMAT: how many ranks a /stacks reply names (text: "rank R (local rank ..." headers).
ranks_in() {
    if [ "$2" = json ]; then
        "$MUSTER_PYTHON" -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' "$1" 2>/dev/null || echo 0
    else
        grep -c '^rank [0-9]* (local rank ' "$1" || true
    fi
}
# missing_in FILE FORMAT: how many captures in a reply came back without a stack.
missing_in() {
    if [ "$2" = json ]; then
        "$MUSTER_PYTHON" -c 'import json, sys; print(sum("Err" in c["threads"] if isinstance(c["threads"], dict) else 0 for c in json.load(open(sys.argv[1]))))' "$1" 2>/dev/null || echo "?"
    else
        grep -c '^no stack: ' "$1" || true
    fi
}

echo "stacks bench: GET /stacks with $N workers, $REQS requests per format; --stacks-on-failure with 4 workers, $RUNS runs; $MUSTER"
echo "($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), torch $("$MUSTER_PYTHON" -c "import torch; print(torch.__version__)"))"

# --- (i) GET /stacks latency -------------------------------------------------------------------------------
mkdir -p "$work/ready"
"$MUSTER" --standalone --nproc-per-node "$N" --metrics-port 0 --metrics-host 127.0.0.1 \
    "$work/sleeper.py" "$work/ready" >"$work/agent.log" 2>&1 &
agent=$!
url=""
deadline=$((SECONDS + 60))
while [ -z "$url" ]; do
    url="$(grep -o 'stacks on http://[^ ]*/stacks' "$work/agent.log" | head -n 1 | sed 's/^stacks on //' || true)"
    if [ -z "$url" ]; then
        if ! kill -0 "$agent" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
            echo "bench: muster logged no stacks address:" >&2; cat "$work/agent.log" >&2; exit 1
        fi
        sleep 0.1
    fi
done
# Every worker has imported torch (N torch imports on this machine's CPUs can take a while) ...
deadline=$((SECONDS + 300))
t_start="$EPOCHREALTIME"
while [ "$(find "$work/ready" -name 'rank_*' ! -name '*.tmp' | wc -l)" -lt "$N" ]; do
    if ! kill -0 "$agent" 2>/dev/null || [ "$SECONDS" -ge "$deadline" ]; then
        echo "bench: the $N workers did not all get ready:" >&2; tail -n 30 "$work/agent.log" >&2; exit 1
    fi
    sleep 0.2
done
# ... and /stacks names them all.
while :; do
    curl -s -o "$work/reply" "$url" || true
    [ "$(ranks_in "$work/reply" text)" = "$N" ] && break
    if [ "$SECONDS" -ge "$deadline" ]; then
        echo "bench: /stacks never showed $N ranks; last reply:" >&2; cat "$work/reply" >&2; exit 1
    fi
    sleep 0.2
done
echo "  $N workers ready $(awk -v a="$t_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }') s after the address was logged; $url"

for fmt in text json; do
    q=""
    [ "$fmt" = json ] && q="?format=json"
    : >"$work/$fmt.lat"
    missing=0
    for ((i = 1; i <= REQS; i++)); do
        t="$(curl -s -o "$work/reply" -w '%{time_total}' "$url$q")"
        got="$(ranks_in "$work/reply" "$fmt")"
        if [ "$got" != "$N" ]; then
            echo "bench: /stacks$q request $i named $got of $N ranks:" >&2; head -c 2000 "$work/reply" >&2; exit 1
        fi
        [ "$fmt" = json ] || grep '^no stack: ' "$work/reply" >>"$work/why" || true
        m="$(missing_in "$work/reply" "$fmt")"
        [ "$m" = "?" ] || missing=$((missing + m))
        if [ "$fmt" = json ]; then # each capture's own time, as muster reports it
            "$MUSTER_PYTHON" -c 'import json, sys; [print(c["took_ms"]) for c in json.load(open(sys.argv[1]))]' \
                "$work/reply" >>"$work/took_ms"
        fi
        echo "$t" >>"$work/$fmt.lat"
    done
    echo "$missing" >"$work/$fmt.missing"
    printf '  /stacks%-13s %d requests: median %7.1f ms, max %7.1f ms, %d of %d captures without a stack\n' "$q" "$REQS" \
        "$(ms "$(median "$work/$fmt.lat")")" "$(ms "$(sort -g "$work/$fmt.lat" | tail -n 1)")" "$missing" $((REQS * N))
done
echo "  per-capture took_ms over the json replies (py-spy, one thread per worker, in parallel): median $(median "$work/took_ms"), max $(sort -g "$work/took_ms" | tail -n 1)"
if [ -s "$work/why" ]; then
    echo "  why, over the text replies:"
    sort "$work/why" | uniq -c | sed 's/^/   /'
fi
bytes_text="$(curl -s "$url" | wc -c)"

t0="$EPOCHREALTIME"
kill -TERM "$agent"
rc=0
wait "$agent" || rc=$?
t1="$EPOCHREALTIME"
agent=""
left=0
for f in "$work/ready"/rank_*; do
    pid="$(cat "$f")"
    if kill -0 "$pid" 2>/dev/null; then left=$((left + 1)); fi
done
echo "  SIGTERM to muster: exited $rc after $(ms "$(awk -v a="$t0" -v b="$t1" 'BEGIN { print b - a }')") ms; $left of $N workers still running"
if [ "$left" != 0 ]; then echo "bench: workers outlived muster" >&2; exit 1; fi

# --- (ii) --stacks-on-failure stop delay ---------------------------------------------------------------------
# fail_run CASE N: one failing job; appends failure-to-exit seconds to $work/CASE.delay.
fail_run() {
    local case="$1" dir="$work/fail.$1.$2" extra=() rc=0 t1 t_fail delay
    [ "$case" = stacks ] && extra=(--stacks-on-failure)
    mkdir -p "$dir/ready" "$dir/logs"
    "$MUSTER" --standalone --nproc-per-node 4 --max-restarts 0 --log-dir "$dir/logs" "${extra[@]}" \
        "$work/failer.py" "$dir/ready" "$dir/failed_at" >"$dir/log" 2>&1 || rc=$?
    t1="$EPOCHREALTIME"
    if [ "$rc" = 0 ] || [ ! -s "$dir/failed_at" ]; then
        echo "bench: $case run $2: expected a failed job (muster exited $rc):" >&2; tail -n 30 "$dir/log" >&2; exit 1
    fi
    local shown=""
    if [ "$case" = stacks ]; then
        shown="$(grep -o 'stacks written to [^ ]*' "$dir/log" | head -n 1 | sed 's/^stacks written to //' || true)"
        if [ -z "$shown" ] || [ "$(find "$shown" -name 'rank_*.txt' 2>/dev/null | wc -l)" != 3 ]; then
            echo "bench: stacks run $2: no 'stacks written to' with 3 survivors' stacks:" >&2; tail -n 30 "$dir/log" >&2; exit 1
        fi
        shown=", $(cat "$shown"/rank_*.txt | grep -c '^no stack: ' || true) of 3 without a stack"
    fi
    t_fail="$(cat "$dir/failed_at")"
    delay="$(awk -v a="$t_fail" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')"
    printf '  %-6s run %d/%d: failure to muster exit %7.1f ms (exit %d%s)\n' "$case" "$2" "$RUNS" "$(ms "$delay")" "$rc" "$shown"
    echo "$delay" >>"$work/$case.delay"
    rm -rf "$dir"
}
for n in $(seq "$RUNS"); do
    fail_run plain "$n"
    fail_run stacks "$n"
done

echo
printf '%-22s %12s %12s\n' "GET /stacks ($N ranks)" median max
for fmt in text json; do
    printf '%-22s %9s ms %9s ms\n' "$fmt" "$(ms "$(median "$work/$fmt.lat")")" "$(ms "$(sort -g "$work/$fmt.lat" | tail -n 1)")"
done
echo "(text reply $bytes_text bytes)"
echo
dp="$(median "$work/plain.delay")"
ds="$(median "$work/stacks.delay")"
printf '%-22s %12s\n' "failure to exit" "median"
printf '%-22s %9s ms\n' "plain" "$(ms "$dp")" "--stacks-on-failure" "$(ms "$ds")"
echo "delay the capture adds: $(ms "$(awk -v a="$dp" -v b="$ds" 'BEGIN { print b - a }')") ms (muster bounds it at 2000 ms); medians of $RUNS runs; load now $(cut -d' ' -f1-3 /proc/loadavg)"
