#!/usr/bin/env bash
# Plays every GPU/agent incident of tests/incidents.rs N times on the fake NVML (3-4 agents on loopback each)
# and prints one row per incident: runs, unexpected outcomes, the documented result, median and worst time
# to re-form (or to the decisive event). Exit 1 if any run ended otherwise. The whole log is kept in
# target/stress/incidents.log.
# Usage: scripts/stress/incidents.sh [--runs N] [test-name-filter]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
runs=20
filter=""
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="${2:-}"; shift 2 ;;
        --runs=*) runs="${1#--runs=}"; shift ;;
        -h | --help) sed -n '2,5p' "$0"; exit 0 ;;
        -*) echo "incidents.sh: unknown option '$1'; use --runs N [filter]" >&2; exit 2 ;;
        *) filter="$1"; shift ;;
    esac
done
require_positive_ints runs
ensure_venv
cargo build --quiet --workspace --tests
mkdir -p target/stress
log=target/stress/incidents.log
set +e
MUSTER_INCIDENT_RUNS="$runs" cargo test --quiet --test incidents -- --test-threads=1 --nocapture $filter >"$log" 2>&1
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
