#!/usr/bin/env bash
# Stress (not a test): a balanced job names no straggler. Two nodes x two gloo workers on loopback
# (scripts/bench/pace_worker.py), every rank the same CPU-bound step (the 2-core machine's scheduling noise
# included), under muster with --straggler-window WINDOW (10: MINUTES x 6 windows judged) for MINUTES
# minutes (10). Prints the windows judged and every straggler line; fails when one was named.
#
# Usage: scripts/stress/straggler.sh        MINUTES=2 WINDOW=5 scripts/stress/straggler.sh
set -euo pipefail
export LC_ALL=C
cd "$(dirname "$0")/../.."

MINUTES="${MINUTES:-10}"
WINDOW="${WINDOW:-10}"
source scripts/lib.sh
require_positive_ints MINUTES WINDOW

cargo build --release --quiet
ensure_venv
source scripts/bench/pace_lib.sh

job control muster none compute "$((MINUTES * 60))" "--straggler-window=$WINDOW" --metrics-port=0
steps="$(rate "$work/control")"
lines="$(grep -h "straggler: rank" "$work/control"/*.log || true)"
echo "balanced job, ${MINUTES} min, ${WINDOW} s windows (~$((MINUTES * 60 / WINDOW)) judged): ${steps} steps/s"
if [ -n "$lines" ]; then
    echo "FAIL: a balanced job named a straggler:"
    echo "$lines"
    exit 1
fi
echo "PASS: nobody named"
