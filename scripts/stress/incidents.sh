#!/usr/bin/env bash
# Plays every GPU/agent incident of tests/it/incidents.rs N times on the fake NVML (3-4 agents on loopback each)
# and prints one row per incident: runs, unexpected outcomes, the documented result, median and worst time
# to re-form (or to the decisive event). Exit 1 if any run ended otherwise. The whole log is kept in
# target/stress/incidents.log.
# Usage: scripts/stress/incidents.sh [--runs N] [--skip PATTERN]... [test-name-filter]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
stress_args "scripts/stress/$(basename "$0")" 2,5 20 "$@"
ensure_venv
cargo build --quiet --workspace --tests
it_tests incidents
mkdir -p target/stress
log=target/stress/incidents.log
set +e
MUSTER_INCIDENT_RUNS="$runs" cargo test --quiet --test it -- --test-threads=1 --nocapture "${tests[@]}" >"$log" 2>&1
rc=$?
set -e
echo "| incident | runs | unexpected | documented result | median | worst |"
echo "|---|---|---|---|---|---|"
# A row may follow the test runner's own progress output on the same line.
grep -o 'INCIDENT |.*' "$log" | sed 's/^INCIDENT | /| /; s/$/ |/' || true
if [ "$rc" -ne 0 ]; then
    echo "incidents.sh: some runs ended unexpectedly; details:" >&2
    grep -v 'INCIDENT |' "$log" | tail -n 80 >&2
    exit 1
fi
