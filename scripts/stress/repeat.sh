#!/usr/bin/env bash
# Runs one integration test N times in a row (50) with K busy loops beside it (1: a second CPU load on the
# 2-core machine), to show a test that once failed by luck now waits for its events. Prints one line per failed
# run and a closing count; exit 1 if any run failed. Each failed run's output is kept in target/stress/repeat-*.log.
# Usage: scripts/stress/repeat.sh [--runs N] [--load K] [test-name]
#        (test-name: a test of tests/it, MODULE::NAME; warm::a_warm_worker_sees_what_a_cold_one_sees by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh

runs=50 load=1 name="warm::a_warm_worker_sees_what_a_cold_one_sees"
while [ $# -gt 0 ]; do
    case "$1" in
        --runs) runs="${2:-}"; shift 2 ;;
        --load) load="${2:-}"; shift 2 ;;
        -h | --help) sed -n 2,6p "$0"; exit 0 ;;
        -*) echo "repeat.sh: unknown option '$1'; use --runs N --load K [MODULE::NAME]" >&2; exit 2 ;;
        *) name="$1"; shift ;;
    esac
done
require_positive_ints runs
case "$load" in '' | *[!0-9]*) echo "load must be an integer >= 0, got '$load'" >&2; exit 2 ;; esac

ensure_venv
# Built once; each run is then the test binary alone (no cargo between runs).
bin="$(cargo test --quiet --test it --no-run --message-format=json |
    python3 -c 'import json, sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "it" and m.get("executable"):
        print(m["executable"])')"
if ! "$bin" --list --exact "$name" | grep -qx "$name: test"; then
    echo "repeat.sh: no test of tests/it is named '$name'" >&2
    exit 2
fi

# The load: K shell loops, each keeping one core busy, ended by PID however this script ends.
busy=()
trap 'for p in "${busy[@]}"; do kill "$p" 2>/dev/null || true; done' EXIT
for ((i = 0; i < load; i++)); do
    bash -c 'while :; do :; done' &
    busy+=("$!")
done

mkdir -p target/stress
failed=0
for ((run = 1; run <= runs; run++)); do
    log="target/stress/repeat-$run.log"
    if "$bin" --exact "$name" >"$log" 2>&1; then
        rm -f "$log"
    else
        failed=$((failed + 1))
        echo "run $run failed: $(grep -m1 -E 'panicked|assertion' "$log" || tail -n 1 "$log") (log: $log)"
    fi
done
echo "$name: $runs runs under $load busy loop(s): $((runs - failed)) passed, $failed failed"
[ "$failed" -eq 0 ]
