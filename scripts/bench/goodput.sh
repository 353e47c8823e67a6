#!/usr/bin/env bash
# Benchmark (not a test): goodput under faults, torchrun against muster side by side. One job per launcher
# and seed: two agents x two gloo workers on loopback (c10d rendezvous, --nnodes 1:2, --max-restarts 100),
# examples/train_inplace.py with a checkpoint every K steps, sized to take M minutes fault-free, under a seeded
# schedule of one fault every T seconds for M minutes: a worker SIGKILLed, the second node's agent SIGKILLed
# (its workers die with it, as with a host that vanishes), or the second node leaving (SIGTERM); a node that
# went is replaced by a fresh agent R seconds later. The same seed gives every launcher the same schedule.
# The script uses the in-place API (under torchrun and --in-place off it runs as a plain torchrun script,
# resuming from its checkpoint), and every start loads a frozen backbone of BACKBONE_MB megabytes (default
# 300), as a real job's start loads its checkpoint. Launchers: torchrun 2.15, muster (--in-place off),
# muster-warm (--in-place off, --warm-spares torch,torch._dynamo, 10 s after each start), muster-inplace (in
# place, with the same warm spares). Goal: muster-inplace's ETTR at least 95% (T=60 M=10).
#
# MODEL=small (default): the example's MLP of 577 parameters, each step paced by a 0.2 s sleep (what the
# launcher costs). MODEL=big: 101M parameters with AdamW (1.2 GB of state; --width=4096 --layers=7), no sleep,
# a checkpoint of 1.2 GB every K steps (what a real-size state costs).
#
# First, a fault-free reference: the plain script under torchrun (the API does nothing there), REF_STEPS
# steps; its median step time sizes every job (M minutes fault-free) and is what every ETTR is measured
# against, so that anything the API adds to a step counts as lost.
# Reported per launcher (the mean over seeds): ETTR (the furthest step reached x the reference step time /
# the wall time from launch; steps redone after a checkpoint restore do not count; a job that did not finish
# is charged the whole M minutes at least), the time from each fault to the first step of the group that
# replaced the one it broke (mean; p95 the worst seed's), faults never recovered from, restarts spent by the
# first node, and whether the job finished (within twice its fault-free time; a job that makes no step for
# 120 s once the last fault is behind it is stuck and stopped there, not finished). The per-run figures are
# JSON lines; the agents' logs and step logs stay in the work directory with KEEP=1.
#
# Usage: scripts/bench/goodput.sh                         (T=60 M=10 SEEDS=1,2,3: about 2 hours)
#        MODEL=big LAUNCHERS=torchrun,muster,muster-inplace scripts/bench/goodput.sh   (about 1.7 hours)
#        T=30 M=4 SEEDS=1,2,3 scripts/bench/goodput.sh    LAUNCHERS=muster,torchrun T=20 M=2 ...
set -euo pipefail
cd "$(dirname "$0")/../.."
T="${T:-60}"
M="${M:-10}"
SEEDS="${SEEDS:-1,2,3}"
LAUNCHERS="${LAUNCHERS:-torchrun,muster,muster-warm,muster-inplace}"
BACKBONE_MB="${BACKBONE_MB:-300}"
K="${K:-25}"
R="${R:-5}"
REF_STEPS="${REF_STEPS:-40}"
MODEL="${MODEL:-small}"
source scripts/lib.sh
require_positive_ints T M K R BACKBONE_MB REF_STEPS
case "$MODEL" in
    small) model_args="" sleep=0.2 ;;
    big) model_args="--width=4096 --layers=7 --optimizer=adamw" sleep=0 ;;
    *) echo "MODEL must be small or big, got '$MODEL'" >&2; exit 2 ;;
esac
[[ "$SEEDS" =~ ^[0-9]+(,[0-9]+)*$ ]] || { echo "SEEDS: comma-separated integers, got '$SEEDS'" >&2; exit 2; }
cargo build --release --quiet
ensure_venv # exports MUSTER_PYTHON and puts the venv (with torchrun) first on PATH
work="$(mktemp -d)"
trap 'if [ "${KEEP:-0}" = 1 ]; then echo "logs kept in $work" >&2; else rm -rf "$work"; fi' EXIT
"$MUSTER_PYTHON" scripts/bench/goodput.py --muster "$PWD/target/release/muster" --torchrun "$(command -v torchrun)" \
    --train "$PWD/examples/train_inplace.py" --api "$PWD/src/inplace/python" --backbone-mb "$BACKBONE_MB" --work "$work" --launchers "$LAUNCHERS" --seeds "$SEEDS" \
    --interval "$T" --minutes "$M" --ckpt-every "$K" --replace-after "$R" --reference-steps "$REF_STEPS" \
    --model="$model_args" --step-sleep "$sleep"
