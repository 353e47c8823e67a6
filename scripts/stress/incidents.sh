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
play_rows incidents INCIDENT MUSTER_INCIDENT_RUNS incident
