#!/usr/bin/env bash
# Runs the network-partition scenarios of tests/it/partition.rs N times (hosts in network namespaces, silent
# cuts with nftables; root needed) and prints one row per scenario: runs, passed, the worst split brain
# (seconds an old worker of the cut node overlapped a new-round worker), the survivors' re-form time and the
# cut node's exit time after the cut (median / max), and the medians of the scenario's other measurements.
# Exit 1 if any run failed. Every run's log is kept in target/stress/partition.log and the measurements (one
# JSON line per scenario run) in target/stress/partition.jsonl.
# Usage: scripts/stress/partition.sh [--runs N] [--skip PATTERN]... [test-name-filter]
#   --skip PATTERN   leaves out the tests whose name contains PATTERN (as the test harness's --skip), e.g.
#                    --skip loss:: for the four minutes of packet loss; the filter too is a part of the name
set -euo pipefail
cd "$(dirname "$0")/../.."
source scripts/lib.sh
stress_args "scripts/stress/$(basename "$0")" 2,11 5 "$@"
[ "$(id -u)" = 0 ] || { echo "partition.sh: must run as root (network namespaces and nftables)" >&2; exit 2; }
ensure_venv
ensure_etcd
ensure_nftables
cargo test --quiet --test it --no-run
it_tests partition
mkdir -p target/stress
log=target/stress/partition.log
report=target/stress/partition.jsonl
: >"$log"
: >"$report"
failed=0
for ((run = 1; run <= runs; run++)); do
    echo "=== run $run of $runs" >>"$log"
    set +e
    MUSTER_PARTITION_REPORT="$PWD/$report" cargo test --quiet --test it -- --test-threads=1 "${tests[@]}" >>"$log" 2>&1
    rc=$?
    set -e
    if [ "$rc" -ne 0 ]; then
        failed=$((failed + 1))
        echo "partition.sh: run $run failed (see $log)" >&2
    fi
done
python3 - "$report" <<'EOF'
import json, statistics, sys

rows = {}
for line in open(sys.argv[1]):
    line = line.strip()
    if line:
        r = json.loads(line)
        rows.setdefault(r["scenario"], []).append(r)


def values(rs, key):
    return [r[key] for r in rs if isinstance(r.get(key), (int, float))]


def med_max(vs):
    return f"{statistics.median(vs):.2f} / {max(vs):.2f}" if vs else "-"


COLUMNS = {"scenario", "passed", "split_brain_s", "reform_s", "cut_exit_s"}


def others(rs):
    """The medians of the other numeric measurements (a list counts as its largest value)."""
    keys = sorted({k for r in rs for k in r} - COLUMNS)
    out = []
    for k in keys:
        vs = [max(v) if isinstance(v, list) and v else v for v in (r.get(k) for r in rs)]
        vs = [v for v in vs if isinstance(v, (int, float)) and not isinstance(v, bool)]
        if vs:
            out.append(f"{k} {statistics.median(vs):g}")
    return ", ".join(out) or "-"


print("| scenario | runs | passed | split brain max (s) | survivors re-form (s) median / max | cut node exit (s) median / max | other (median) |")
print("|---|---|---|---|---|---|---|")
for scenario, rs in rows.items():
    split = values(rs, "split_brain_s")
    print(f"| {scenario} | {len(rs)} | {sum(1 for r in rs if r.get('passed'))} | "
          f"{f'{max(split):.3f}' if split else '-'} | {med_max(values(rs, 'reform_s'))} | "
          f"{med_max(values(rs, 'cut_exit_s'))} | {others(rs)} |")
if not rows:
    print("partition.sh: no measurements were reported (did the tests build and run?)", file=sys.stderr)
EOF
if [ "$failed" -ne 0 ]; then
    echo "partition.sh: $failed of $runs runs failed; the failures:" >&2
    grep -E '^(---- |- |thread .* panicked)' "$log" | tail -n 60 >&2
    exit 1
fi
