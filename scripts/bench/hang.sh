#!/usr/bin/env bash
# Benchmark (not a test): what hang detection costs a running job and a launch.
#
# (1) Throughput. examples/train.py (a real gloo DDP job, CPU bound: --steps STEPS, default 300, no
# --step-sleep, checkpoints into a fresh temp dir each run) under `muster --standalone --nproc-per-node 2`
# in three configurations, interleaved (the order turning from run to run), RUNS runs each (default 3):
#   plain    no hang detection;
#   pattern  --hang-timeout 60 --progress-pattern 'step \d+' (the workers' output goes through muster's
#            pipes and every line is matched; train.py's rank 0 prints a "step N" line every 10 steps);
#   timeout  --hang-timeout 60 alone (progress from $MUSTER_PROGRESS_FILE, which train.py never touches).
# Each worker runs train.py under a small wrapper that imports torch first and then notes the wall clock
# (time.time()) before and after train.py's own main (process group, DDP, STEPS steps, teardown). The worker
# time of a run is from the later rank's start to the later rank's end (the first rank to start waits in
# init_process_group for the other's torch import, which is not the job's time); steps/s is STEPS / that.
# Also reported: muster's wall time around the whole command (EPOCHREALTIME; interpreter start and the
# torch import included) and STEPS / that wall time.
# Each run checks that muster exited 0 and that rank 0's --result says STEPS steps.
#
# (2) Launch. As scripts/bench/launch.sh: a two-worker job running `true` (--no-python), so what is measured
# is the launcher itself; wall time with and without --hang-timeout 60, one untimed warm-up each, then the
# median of LAUNCH_RUNS runs (default 10).
#
# Medians, a table and the ratios against plain at the end; no pass/fail on timing.
#
# Usage: scripts/bench/hang.sh        RUNS=1 STEPS=300 LAUNCH_RUNS=10 scripts/bench/hang.sh
#        MUSTER=/path/to/muster scripts/bench/hang.sh   (another build; default: cargo build --release)
set -euo pipefail
export LC_ALL=C # '.' as the decimal point, for EPOCHREALTIME, printf and awk alike
if [ -z "${EPOCHREALTIME:-}" ]; then echo "bench: needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; fi
cd "$(dirname "$0")/../.."

RUNS="${RUNS:-3}"
STEPS="${STEPS:-300}"
LAUNCH_RUNS="${LAUNCH_RUNS:-10}"
source scripts/lib.sh
require_positive_ints RUNS STEPS LAUNCH_RUNS

if [ -z "${MUSTER:-}" ]; then
    cargo build --release --quiet
    MUSTER="$PWD/target/release/muster"
fi
ensure_venv # exports MUSTER_PYTHON and puts the venv first on PATH
TRAIN="$PWD/examples/train.py"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The wrapper: torch is imported before the clock starts, so the time is train.py's main alone.
cat >"$work/timed.py" <<'EOF'
import os, runpy, sys, time
import torch, torch.distributed  # noqa: F401 (imported before the clock starts)
script = sys.argv[1]
sys.argv = sys.argv[1:]
t0 = time.time()
runpy.run_path(script, run_name="__main__")
t1 = time.time()
with open(os.path.join(os.environ["BENCH_TIMES"], f"rank_{os.environ['RANK']}"), "w") as f:
    f.write(f"{t0:.6f} {t1:.6f}\n")
EOF

# median FILE: the median of the numbers in FILE, one a line (the mean of the middle two for an even count).
median() {
    sort -g "$1" | awk '{ v[NR] = $1 } END { if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2 }'
}

CASES=(plain pattern timeout)
flags() { # flags CASE: muster's extra flags for CASE, one a line
    case "$1" in
        plain) ;;
        pattern) printf '%s\n' --hang-timeout 60 --progress-pattern 'step \d+' ;;
        timeout) printf '%s\n' --hang-timeout 60 ;;
    esac
}

# train_run CASE N: one training run; appends "<worker s> <muster wall s>" to $work/CASE.times.
train_run() {
    local case="$1" dir="$work/$1.$2" extra t0 t1
    mkdir -p "$dir/times"
    mapfile -t extra < <(flags "$case")
    t0="$EPOCHREALTIME"
    if ! BENCH_TIMES="$dir/times" "$MUSTER" --standalone --nproc-per-node 2 "${extra[@]}" "$work/timed.py" "$TRAIN" \
        --steps "$STEPS" --ckpt-dir "$dir/ckpt" --result "$dir/result.json" >"$dir/log" 2>&1; then
        echo "bench: $case run $2 failed:" >&2
        tail -n 30 "$dir/log" >&2
        exit 1
    fi
    t1="$EPOCHREALTIME"
    if ! grep -q "\"steps\": $STEPS," "$dir/result.json" 2>/dev/null; then
        echo "bench: $case run $2: rank 0's result does not say $STEPS steps" >&2
        exit 1
    fi
    local n worker wall
    n="$(find "$dir/times" -name 'rank_*' | wc -l)"
    if [ "$n" != 2 ]; then echo "bench: $case run $2: $n of 2 ranks reported their time" >&2; exit 1; fi
    worker="$(cat "$dir/times"/rank_* | awk '{ if ($1 > s) s = $1; if ($2 > e) e = $2 } END { printf "%.4f", e - s }')"
    wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')"
    printf '  %-8s run %d/%d: worker %6.2f s (%7.1f steps/s), muster wall %6.2f s\n' "$case" "$2" "$RUNS" \
        "$worker" "$(awk -v s="$STEPS" -v w="$worker" 'BEGIN { print s / w }')" "$wall"
    echo "$worker $wall" >>"$work/$case.times"
    rm -rf "$dir"
}

# launch_run NAME FLAGS...: LAUNCH_RUNS timed runs of the `true` job (after one warm-up) into $work/NAME.wall.
launch_run() {
    local name="$1" i t0 t1 wall
    shift
    : >"$work/$name.wall"
    "$MUSTER" --standalone --nproc-per-node 2 "$@" --no-python true >"$work/$name.log" 2>&1 ||
        { echo "bench: launch $name failed on its warm-up run:" >&2; cat "$work/$name.log" >&2; exit 1; }
    for ((i = 1; i <= LAUNCH_RUNS; i++)); do
        t0="$EPOCHREALTIME"
        "$MUSTER" --standalone --nproc-per-node 2 "$@" --no-python true >"$work/$name.log" 2>&1 ||
            { echo "bench: launch $name failed on run $i:" >&2; cat "$work/$name.log" >&2; exit 1; }
        t1="$EPOCHREALTIME"
        wall="$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.4f", b - a }')"
        echo "$wall" >>"$work/$name.wall"
    done
    printf '  launch %-8s %d runs, median %7.1f ms\n' "$name" "$LAUNCH_RUNS" "$(awk -v w="$(median "$work/$name.wall")" 'BEGIN { printf "%.4f", w * 1000 }')"
}

echo "hang bench: examples/train.py --steps $STEPS, 2 workers, $RUNS runs per configuration; launch $LAUNCH_RUNS runs; $MUSTER"
echo "($(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), torch $("$MUSTER_PYTHON" -c "import torch; print(torch.__version__)"))"
for n in $(seq "$RUNS"); do
    # The order turns each run (plain pattern timeout, pattern timeout plain, ...): no configuration is always first.
    for k in 0 1 2; do train_run "${CASES[$(((n - 1 + k) % 3))]}" "$n"; done
done
launch_run plain
launch_run hang --hang-timeout 60

echo
for case in "${CASES[@]}"; do
    awk '{ print $1 }' "$work/$case.times" >"$work/$case.worker"
    awk '{ print $2 }' "$work/$case.times" >"$work/$case.muster"
done
pw="$(median "$work/plain.worker")"
pm="$(median "$work/plain.muster")"
printf '%-9s %12s %10s %8s   %12s %10s\n' config "worker (s)" "steps/s" "vs plain" "muster (s)" "steps/s"
for case in "${CASES[@]}"; do
    w="$(median "$work/$case.worker")"
    m="$(median "$work/$case.muster")"
    awk -v c="$case" -v s="$STEPS" -v w="$w" -v m="$m" -v pw="$pw" 'BEGIN {
        printf "%-9s %12.2f %10.1f %8.3f   %12.2f %10.1f\n", c, w, s / w, (s / w) / (s / pw), m, s / m }'
done
lp="$(median "$work/plain.wall")"
lh="$(median "$work/hang.wall")"
echo
printf '%-9s %14s\n' launch "median wall"
awk -v p="$lp" -v h="$lh" 'BEGIN {
    printf "%-9s %11.1f ms\n%-9s %11.1f ms\n", "plain", p * 1000, "hang", h * 1000
    printf "\nlaunch ratio (hang/plain): %.3f\n", h / p }'
echo "steps/s ratios above are worker steps/s against plain's (1.000: no cost); medians of $RUNS runs; load now $(cut -d' ' -f1-3 /proc/loadavg)"
