#!/usr/bin/env bash
# Benchmark (not a test): what one slowed rank costs a job, and what straggler detection costs a job without
# one. Two nodes x two gloo workers on loopback (scripts/bench/pace_worker.py), node b's local rank 1 three
# times slower per step:
#   torchrun                 the job as it runs today;
#   muster report            muster names the rank (the line is checked) and the job runs as slowly;
#   muster drain + spare     a third agent waits as a hot spare (--nnodes 2:2); --on-straggler drain takes b
#                            out after its second window and the spare takes its place;
# each for DURATION seconds (60), steps per second of the whole run (and, for drain, after the spare took over).
# The same slowed rank in a DistributedDataParallel job (PACE_JOB=ddp: the all-reduce inside backward, where
# only the ranks' kernel state tells waiting from computing): torchrun, and muster report (the line checked).
# Then the cost of sampling on a balanced job with CPU-bound steps, the explicit-collective job and the DDP one
# (stacks and kernel state read on a fixed schedule): muster with detection on (--straggler-window 10) and off
# (0), RUNS interleaved runs each (3) of COST_SECONDS (30), medians.
#
# Usage: scripts/bench/straggler.sh        DURATION=30 RUNS=1 scripts/bench/straggler.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."

SECONDS_RUN="${DURATION:-60}"
COST_SECONDS="${COST_SECONDS:-30}"
RUNS="${RUNS:-3}"
WINDOW=10
source scripts/lib.sh
require_positive_ints SECONDS_RUN COST_SECONDS RUNS

cargo build --release --quiet
ensure_venv # exports MUSTER_PYTHON and puts the venv (with torchrun) first on PATH
source scripts/bench/pace_lib.sh


echo "== one slowed rank (node b, local rank 1, 3x its step), ${SECONDS_RUN} s each"
job torchrun torchrun b sleep "$SECONDS_RUN"
job report muster b sleep "$SECONDS_RUN" "--straggler-window=$WINDOW"
job drain muster b sleep "$SECONDS_RUN" "--straggler-window=$WINDOW" --on-straggler=drain
# The stretches sort by their start: the last one is the job after the spare took b's place.
balanced_after="$(ls "$work/drain"/steps-* 2>/dev/null | sort | tail -n 1 | xargs cat 2>/dev/null | awk '{ if ($2 > 0) printf "%.2f", $1 / $2; else print "-" }')"
printf '%-22s | %-10s | %s\n' case "steps/s" "what the launcher said"
printf '%-22s | %-10s | %s\n' torchrun "$(rate "$work/torchrun")" "nothing"
printf '%-22s | %-10s | %s\n' "muster report" "$(rate "$work/report")" "$(named "$work/report")"
printf '%-22s | %-10s | %s\n' "muster drain + spare" "$(rate "$work/drain")" \
    "b exited $(grep -c 'its node drains' "$work/drain/b.log" 2>/dev/null || echo 0)x with the drain line; after the spare: ${balanced_after:-?} steps/s"

echo "== one slowed rank in a DDP job (node b, local rank 1, 3x its data wait), ${SECONDS_RUN} s each"
export PACE_JOB=ddp
job ddp-torchrun torchrun b sleep "$SECONDS_RUN"
job ddp-report muster b sleep "$SECONDS_RUN" "--straggler-window=$WINDOW"
printf '%-22s | %-10s | %s\n' case "steps/s" "what the launcher said"
printf '%-22s | %-10s | %s\n' "DDP torchrun" "$(rate "$work/ddp-torchrun")" "nothing"
printf '%-22s | %-10s | %s\n' "DDP muster report" "$(rate "$work/ddp-report")" "$(named "$work/ddp-report")"

median() { sort -n | awk 'NF {a[++n]=$1} END {print (n % 2) ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2}'; }
# cost JOB: the sampling cost on a balanced job of kind JOB (collective or ddp), one line.
cost() {
    export PACE_JOB="$1"
    : >"$work/$1-on.rates"
    : >"$work/$1-off.rates"
    for ((r = 1; r <= RUNS; r++)); do
        job "$1-on$r" muster none compute "$COST_SECONDS" "--straggler-window=$WINDOW"
        rate "$work/$1-on$r" >>"$work/$1-on.rates"; echo >>"$work/$1-on.rates"
        job "$1-off$r" muster none compute "$COST_SECONDS" --straggler-window=0
        rate "$work/$1-off$r" >>"$work/$1-off.rates"; echo >>"$work/$1-off.rates"
        if grep -qs "straggler: rank" "$work/$1-on$r"/*.log; then echo "bench: a balanced job named a straggler:" >&2; named "$work/$1-on$r" >&2; fi
    done
    local on off
    on="$(median <"$work/$1-on.rates")"
    off="$(median <"$work/$1-off.rates")"
    printf '%s job: detection on: %s steps/s (runs: %s); off: %s steps/s (runs: %s); on/off %s\n' "$1" "$on" \
        "$(tr '\n' ' ' <"$work/$1-on.rates")" "$off" "$(tr '\n' ' ' <"$work/$1-off.rates")" \
        "$(awk -v a="$on" -v b="$off" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "-" }')"
}
echo "== sampling cost: a balanced job, CPU-bound steps, ${COST_SECONDS} s per run, $RUNS interleaved runs each"
cost collective
cost ddp
