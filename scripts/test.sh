#!/usr/bin/env bash
# The one test command: sets up what the tests need (the cached torch venv), then builds, lints and runs
# every test. Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_venv
ensure_prometheus # tests/observe.rs scrapes the agents with a real Prometheus

cargo build --release --quiet
# clippy with -D warnings also fails the run on any rustc warning.
cargo clippy --quiet --workspace --all-targets -- -D warnings
# Integration tests start real torch workers; two at a time keeps a 2-core machine honest.
cargo test --quiet --workspace -- --test-threads="${MUSTER_TEST_THREADS:-2}" "$@"
# Chaos, bounded (a few minutes on 2 cores): workers, agents, the store and fake GPUs broken on purpose.
scripts/chaos.sh --seed 1 --events 8
