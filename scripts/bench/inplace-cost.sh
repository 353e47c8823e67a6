#!/usr/bin/env bash
# Benchmark (not a test): what the in-place API costs a real-size job, side by side in one run. The job
# (scripts/bench/big_model.py): DDP over gloo, two workers on one node, an MLP of LAYERS x WIDTH^2 parameters
# (6 x 4096^2 = 101M) trained with AdamW (1.2 GB of state), batches from a DataLoader over a
# DistributedSampler. RUNS times, alternated: the plain script under torchrun 2.15, then the same job written
# with muster_inplace under muster (its one cost per step: the vote, an all-reduce of one number before
# each optimizer step). Then one run with the API in which rank 1 is SIGKILLed as step 15's backward begins:
# the survivor's time from the fault to its first step after it, and the new rank's transfer (bytes, seconds)
# against the time to send the same bytes once over a loopback TCP connection.
# Goal: the API's steps per second at least 98% of the plain script's.
#
# Usage: scripts/bench/inplace-cost.sh             (RUNS=2 STEPS=30 LAYERS=6 WIDTH=4096: about 6 minutes)
set -euo pipefail
cd "$(dirname "$0")/../.."
RUNS="${RUNS:-2}"
STEPS="${STEPS:-30}"
LAYERS="${LAYERS:-6}"
WIDTH="${WIDTH:-4096}"
source scripts/lib.sh
require_positive_ints RUNS STEPS LAYERS WIDTH
cargo build --release --quiet
ensure_venv
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$MUSTER_PYTHON" scripts/bench/inplace_cost.py --muster "$PWD/target/release/muster" --torchrun "$(command -v torchrun)" \
    --script "$PWD/scripts/bench/big_model.py" --work "$work" --runs "$RUNS" \
    --model "--steps=$STEPS" "--layers=$LAYERS" "--width=$WIDTH"
