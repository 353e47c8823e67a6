#!/usr/bin/env bash
# Benchmark (not a test): launcher overhead of muster vs torchrun on the same trivial job, two workers
# that run `true` (--no-python), so what is measured is the launcher itself: start-up, rendezvous,
# spawning and reaping the workers, shutdown.
#
# For each launcher it runs the job RUNS times (default 10) and reports the median wall time (bash's
# EPOCHREALTIME around the run: /usr/bin/time's %e has 10 ms resolution, too coarse for muster) and the
# median peak RSS from /usr/bin/time's %M, then the ratios torchrun/muster. %M is the largest maximum RSS
# of the launcher and the descendants it reaped; the workers here are `true` (a few MiB at most), so it
# is the launcher's own peak RSS.
#
# METRICS=1 runs muster with --metrics-port=0 (its Prometheus endpoint and /healthz served from the start),
# to compare launch with the metrics endpoint on and off; the job ends long before a scraper would come.
# LAUNCHERS picks the launchers (default "muster torchrun"; the ratios need both).
#
# Usage: scripts/bench/launch.sh            RUNS=20 scripts/bench/launch.sh
#        METRICS=1 LAUNCHERS=muster RUNS=21 scripts/bench/launch.sh
set -euo pipefail
export LC_ALL=C # '.' as the decimal point, for EPOCHREALTIME, printf and awk alike
if [ -z "${EPOCHREALTIME:-}" ]; then echo "bench: needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; fi
cd "$(dirname "$0")/../.."

RUNS="${RUNS:-10}"
METRICS="${METRICS:-0}"
read -r -a LAUNCHERS <<<"${LAUNCHERS:-muster torchrun}"
source scripts/lib.sh
require_positive_ints RUNS
case "$METRICS" in 0 | 1) ;; *) echo "METRICS must be 0 (off) or 1 (muster serves metrics), got '$METRICS'" >&2; exit 2 ;; esac
for l in "${LAUNCHERS[@]}"; do
    case "$l" in muster | torchrun) ;; *) echo "LAUNCHERS: unknown launcher '$l' (muster, torchrun)" >&2; exit 2 ;; esac
done
ran() { [[ " ${LAUNCHERS[*]} " == *" $1 "* ]]; }

cargo build --release --quiet
ensure_venv # exports MUSTER_PYTHON and puts the venv (with torchrun) first on PATH

if [ ! -x /usr/bin/time ]; then
    echo "bench: installing GNU time with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq time >/dev/null
fi

MUSTER="$PWD/target/release/muster"
TORCHRUN="$(command -v torchrun)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# median FILE: the median of the numbers in FILE, one a line (the mean of the middle two for an even count).
median() {
    sort -g "$1" | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

# bench NAME CMD...: runs CMD RUNS times, leaving wall seconds in $work/NAME.wall and KiB in $work/NAME.rss.
bench() {
    local name="$1"
    shift
    : >"$work/$name.wall"
    : >"$work/$name.rss"
    # One untimed warm-up run, so both launchers start with the page cache equally warm.
    "$@" >"$work/$name.log" 2>&1 || { echo "bench: $name failed on its warm-up run:" >&2; cat "$work/$name.log" >&2; exit 1; }
    local i
    for ((i = 1; i <= RUNS; i++)); do
        local t0="$EPOCHREALTIME"
        if ! /usr/bin/time -f '%M' -o "$work/$name.time" "$@" >"$work/$name.log" 2>&1; then
            echo "bench: $name failed on run $i:" >&2
            cat "$work/$name.log" "$work/$name.time" >&2
            exit 1
        fi
        local t1="$EPOCHREALTIME"
        local wall rss
        wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')"
        # time's output file may begin with a "Command exited ..." line; the measurement is the last line.
        rss="$(tail -n 1 "$work/$name.time")"
        echo "$wall" >>"$work/$name.wall"
        echo "$rss" >>"$work/$name.rss"
        printf '  %-8s run %2d/%d: %8.1f ms  %8d KiB\n' "$name" "$i" "$RUNS" "$(awk -v w="$wall" 'BEGIN { print w * 1000 }')" "$rss"
    done
}

metrics=()
[ "$METRICS" = 1 ] && metrics=(--metrics-port=0)
echo "launch benchmark: 2 workers running 'true', $RUNS runs each, muster's metrics $([ "$METRICS" = 1 ] && echo on || echo off) ($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), torch $("$MUSTER_PYTHON" -c "import torch; print(torch.__version__)"))"
if ran muster; then bench muster "$MUSTER" --standalone --nproc-per-node=2 "${metrics[@]}" --no-python true; fi
if ran torchrun; then bench torchrun "$TORCHRUN" --standalone --nproc-per-node=2 --no-python true; fi

echo
printf '%-10s %15s %20s\n' launcher "median wall" "median peak RSS"
row() { # row NAME WALL_S RSS_KIB
    printf '%-10s %12.1f ms %16.1f MiB\n' "$1" "$(awk -v w="$2" 'BEGIN { print w * 1000 }')" \
        "$(awk -v k="$3" 'BEGIN { print k / 1024 }')"
}
for l in "${LAUNCHERS[@]}"; do row "$l" "$(median "$work/$l.wall")" "$(median "$work/$l.rss")"; done
if ran muster && ran torchrun; then
    echo
    awk -v mw="$(median "$work/muster.wall")" -v tw="$(median "$work/torchrun.wall")" \
        -v mr="$(median "$work/muster.rss")" -v tr="$(median "$work/torchrun.rss")" 'BEGIN {
        printf "wall time ratio (torchrun/muster): %.1fx\n", tw / mw
        printf "peak RSS ratio  (torchrun/muster): %.1fx\n", tr / mr
    }'
fi
