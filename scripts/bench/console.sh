#!/usr/bin/env bash
# Benchmark (not a test): a slow console must not slow the workers. One worker (tests/fixtures/flood.py)
# writes SIZE_MIB MiB to its stdout under `muster --tee 3 --log-dir`, twice per run:
#   (file) the agent's stdout and stderr redirected to a file;
#   (slow) the agent's stdout and stderr piped through a reader that takes RATE bytes/s (default 1 MB/s).
# Reported per case: the worker's own writing time (from its OUTDIR/0.flooded) and muster's wall time (which
# includes its bounded exit flush of what the console still had queued, at most 5 s). Each run checks that
# the log file is complete; the slow case also checks the console shows the drop notice. Medians over RUNS
# runs (default 3) and the slow/file ratio of the workers' times at the end. Goal: within +-20%.
#
# Usage: scripts/bench/console.sh        SIZE_MIB=50 RUNS=1 scripts/bench/console.sh
#        MUSTER=/path/to/muster scripts/bench/console.sh   (another build, e.g. one from before the change)
set -euo pipefail
export LC_ALL=C
if [ -z "${EPOCHREALTIME:-}" ]; then echo "bench: needs bash >= 5 (EPOCHREALTIME)" >&2; exit 2; fi
cd "$(dirname "$0")/../.."

SIZE_MIB="${SIZE_MIB:-200}"
RATE="${RATE:-1000000}"
RUNS="${RUNS:-3}"
source scripts/lib.sh
require_positive_ints SIZE_MIB RATE RUNS

if [ -z "${MUSTER:-}" ]; then
  cargo build --release --quiet
  MUSTER="$PWD/target/release/muster"
fi
ensure_venv # exports MUSTER_PYTHON and puts the venv first on PATH
WORKER="$PWD/tests/fixtures/flood.py"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

kib=$((SIZE_MIB * 1024))
lines=$((kib * 1024 / 100))
expected_bytes=$((lines * 100 + ${#lines} + 24)) # + "flood end rank 0 lines <n>\n"

# Copies stdin to stdout at no more than $1 bytes/s.
slow_reader() {
  python3 -c '
import sys, time
rate, inp, out = float(sys.argv[1]), sys.stdin.buffer.raw, sys.stdout.buffer
start, total = time.monotonic(), 0
while chunk := inp.read(16384):
    out.write(chunk)
    total += len(chunk)
    ahead = total / rate - (time.monotonic() - start)
    if ahead > 0:
        time.sleep(ahead)
' "$1"
}

# one_run CASE N: runs the job, checks it, and appends "<worker s> <muster s>" to $work/CASE.times.
one_run() {
  local case="$1" dir="$work/$1.$2" t0 t1
  mkdir -p "$dir/out" "$dir/logs"
  local cmd=("$MUSTER" --nproc-per-node=1 --tee 3 --log-dir "$dir/logs" "$WORKER" "$dir/out" "$kib")
  if [ "$case" = file ]; then
    t0=$EPOCHREALTIME
    "${cmd[@]}" >"$dir/console" 2>&1
    t1=$EPOCHREALTIME
  else
    { t0=$EPOCHREALTIME; "${cmd[@]}"; echo "$t0 $EPOCHREALTIME" >"$dir/wall"; } 2>&1 |
      slow_reader "$RATE" >"$dir/console"
    read -r t0 t1 <"$dir/wall"
  fi
  local log size
  log="$(find "$dir/logs" -name stdout.log)"
  size="$(stat -c %s "$log")"
  if [ "$size" != "$expected_bytes" ]; then
    echo "bench: $case run $2: log file has $size bytes, expected $expected_bytes" >&2
    exit 1
  fi
  local notices
  local notice='^\[muster\] dropped [0-9]* console lines of rank 0; the log file has them$'
  notices="$(grep -c "$notice" "$dir/console" || true)"
  if [ "$case" = slow ] && [ "$notices" = 0 ]; then
    echo "bench: slow run $2: no drop notice on the console" >&2
    exit 1
  fi
  local worker
  worker="$(awk '{print $2}' "$dir/out/0.flooded")"
  printf '%-5s run %d: worker %6.2f s, muster %6.2f s, console %s bytes, %s drop notices\n' \
    "$case" "$2" "$worker" "$(echo "$t1 - $t0" | bc)" "$(stat -c %s "$dir/console")" "$notices"
  echo "$worker $(echo "$t1 - $t0" | bc)" >>"$work/$case.times"
  rm -rf "$dir"
}

median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }

echo "console bench: $SIZE_MIB MiB from one worker, --tee 3, slow console at $RATE bytes/s, $RUNS runs; $MUSTER"
for n in $(seq "$RUNS"); do
  one_run file "$n"
  one_run slow "$n"
done
for case in file slow; do
  w="$(awk '{print $1}' "$work/$case.times" | median)"
  m="$(awk '{print $2}' "$work/$case.times" | median)"
  printf '%-5s median: worker %6.2f s, muster %6.2f s\n' "$case" "$w" "$m"
  eval "${case}_worker=$w"
done
ratio="$(echo "scale=3; $slow_worker / $file_worker" | bc)"
echo "slow/file worker time: $ratio (goal 0.8 .. 1.2)"
