#!/usr/bin/env bash
# Plays every way a node of a c10d job can end (tests/it/store_host.rs), on the agent hosting the store and on a
# member, N times each (three agents on loopback, light workers, fake GPUs), and prints one row per ending: runs,
# unexpected outcomes, the documented result, median and worst time from the ending to the last member's exit (or
# to the group re-formed without the node). Exit 1 if any run ended otherwise; the whole log is kept in
# target/stress/store_host.log.
# Usage: scripts/stress/store-host.sh [--runs N] [--skip PATTERN]... [test-name-filter]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
stress_args "scripts/stress/$(basename "$0")" 2,7 10 "$@"
ensure_venv
cargo build --quiet --workspace --tests
it_tests store_host
play_rows store_host STOREHOST MUSTER_STORE_HOST_RUNS ending
