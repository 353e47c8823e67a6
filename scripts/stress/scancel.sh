#!/usr/bin/env bash
# Stress (not a test): `scancel` of a two-node Slurm job N times (32), each agent must exit 143 every time
# (tests/it/slurm.rs, scancel_with_workers_dying_of_sigterm_ends_143_on_every_agent, on a two-node Slurm
# cluster on loopback that this script starts and stops). Prints the SCANCEL row; exit 1 on any other code.
# Usage: scripts/stress/scancel.sh [--runs N]
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
stress_args "scripts/stress/$(basename "$0")" 2,5 32 "$@"
ensure_venv
ensure_slurm
cargo build --quiet --workspace --tests
slurm_dir=$(mktemp -d "${TMPDIR:-/tmp}/muster-slurm.XXXXXX")
trap 'scripts/slurm/cluster.sh stop "$slurm_dir"; rm -rf "$slurm_dir"' EXIT
SLURM_CONF=$(scripts/slurm/cluster.sh start "$slurm_dir")
export SLURM_CONF
mkdir -p target/stress
log=target/stress/scancel.log
set +e
MUSTER_SCANCEL_RUNS="$runs" cargo test --quiet --test it -- --exact --nocapture \
    slurm::scancel_with_workers_dying_of_sigterm_ends_143_on_every_agent >"$log" 2>&1
rc=$?
set -e
grep -o "SCANCEL |.*" "$log" || true
if [ "$rc" -ne 0 ]; then
    echo "$(basename "$0"): a run ended otherwise; details:" >&2
    grep -v "SCANCEL |" "$log" | tail -n 60 >&2
    exit 1
fi
