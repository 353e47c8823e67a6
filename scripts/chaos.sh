#!/usr/bin/env bash
# Chaos: four muster agents x two workers train examples/train.py against an external `muster store` on
# loopback while a seeded driver (scripts/chaos/driver.py) SIGKILLs workers and agents, SIGSTOPs agents
# below and past the liveness deadline, injects fake XID 79 / 13, fills the rendezvous port with idle
# connections and restarts the store; then checks the job finished, its checkpoint loads, nothing is left,
# every restart had a cause and the budget held. Usage: scripts/chaos.sh --seed S --events N [--work-dir D]
# [--only KIND]... (draw only these kinds of event, e.g. --only xid79)
set -euo pipefail
cd "$(dirname "$0")/.."

usage="usage: scripts/chaos.sh --seed S --events N [--work-dir DIR] [--only KIND]..."
seed="" events="" extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        --seed) [ $# -ge 2 ] || { echo "--seed needs a value; $usage" >&2; exit 2; }; seed="$2"; shift 2 ;;
        --events) [ $# -ge 2 ] || { echo "--events needs a value; $usage" >&2; exit 2; }; events="$2"; shift 2 ;;
        --work-dir) [ $# -ge 2 ] || { echo "--work-dir needs a value; $usage" >&2; exit 2; }; extra+=(--work-dir "$2"); shift 2 ;;
        # The driver checks KIND against its list of events.
        --only) [ $# -ge 2 ] || { echo "--only needs a value; $usage" >&2; exit 2; }; extra+=(--only "$2"); shift 2 ;;
        *) echo "unknown argument '$1'; $usage" >&2; exit 2 ;;
    esac
done
case "$seed" in '' | *[!0-9]*) echo "--seed must be an integer >= 0, got '$seed'; $usage" >&2; exit 2 ;; esac
case "$events" in '' | *[!0-9]* | 0) echo "--events must be an integer > 0, got '$events'; $usage" >&2; exit 2 ;; esac

source scripts/lib.sh
ensure_venv
cargo build --release --quiet -p muster -p fake-nvml
# exec: the driver gets the signals, and its own clean-up kills everything it started.
exec "$MUSTER_PYTHON" scripts/chaos/driver.py --seed "$seed" --events "$events" "${extra[@]}" \
    --muster target/release/muster --fake-nvml target/release/libnvidia_ml_fake.so --train examples/train.py
