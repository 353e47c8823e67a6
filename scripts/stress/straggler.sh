#!/usr/bin/env bash
# Stress (not a test): a balanced job names no straggler. Two nodes x two gloo workers on loopback
# (scripts/bench/pace_worker.py), every rank the same CPU-bound step (the 2-core machine's scheduling noise
# included), under muster with --straggler-window WINDOW (10: MINUTES x 6 windows judged) for MINUTES
# minutes (10). JOB=ddp: the job as most are written, DistributedDataParallel (its all-reduce inside
# backward), with an evaluation pass every 50 steps and a checkpoint every 100; JOB=collective (the
# default): an explicit all-reduce each step. Prints the windows judged and every straggler line; fails
# when one was named.
#
# Usage: scripts/stress/straggler.sh        MINUTES=2 WINDOW=5 JOB=ddp scripts/stress/straggler.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."

MINUTES="${MINUTES:-10}"
WINDOW="${WINDOW:-10}"
JOB="${JOB:-collective}"
case "$JOB" in collective | ddp) ;; *) echo "JOB must be collective or ddp, got '$JOB'" >&2; exit 2 ;; esac
export PACE_JOB="$JOB"
source scripts/lib.sh
require_positive_ints MINUTES WINDOW

cargo build --release --quiet
ensure_venv
source scripts/bench/pace_lib.sh

job control muster none compute "$((MINUTES * 60))" "--straggler-window=$WINDOW" --metrics-port=0
steps="$(rate "$work/control")"
lines="$(grep -h "straggler: rank" "$work/control"/*.log || true)"
echo "balanced $JOB job, ${MINUTES} min, ${WINDOW} s windows (~$((MINUTES * 60 / WINDOW)) judged): ${steps} steps/s"
if [ "$steps" = - ]; then
    # A job that never trained names nobody: that is no pass.
    echo "FAIL: the job did not train; agent a said:"
    tail -n 5 "$work/control/a.log"
    exit 1
fi
if [ -n "$lines" ]; then
    echo "FAIL: a balanced job named a straggler:"
    echo "$lines"
    exit 1
fi
echo "PASS: nobody named"
