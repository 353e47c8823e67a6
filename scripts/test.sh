#!/usr/bin/env bash
# The one test command: sets up what the tests need (the cached torch venv, etcd 3.4 and 3.5, kube-apiserver,
# nftables), then builds, lints and runs every test. Usage: scripts/test.sh [extra cargo test args]
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_venv
# etcd 3.4 and 3.5 for the etcd rendezvous tests: exports MUSTER_ETCD_34 and MUSTER_ETCD_35.
ensure_etcd
ensure_etcd35 >/dev/null
# kube-apiserver for the Kubernetes rendezvous (built once from the Go module proxy): exports MUSTER_KUBE_APISERVER.
ensure_kube_apiserver

ensure_slurm

# A two-node Slurm cluster for tests/it/slurm.rs, stopped however this script ends.
slurm_dir=$(mktemp -d "${TMPDIR:-/tmp}/muster-slurm.XXXXXX")
trap 'scripts/slurm/cluster.sh stop "$slurm_dir"; rm -rf "$slurm_dir"' EXIT
SLURM_CONF=$(scripts/slurm/cluster.sh start "$slurm_dir")
export SLURM_CONF

ensure_prometheus # tests/it/observe.rs scrapes the agents with a real Prometheus
ensure_nftables # tests/it/partition.rs cuts hosts in network namespaces with nftables (as root)
ensure_fuse # tests/it/gate.rs stalls a FUSE mount for the storage check

# The house, checked before anything builds: no import circle between files of src/, observe independent
# of the agent, nothing pointing outside the repository, signals and exit statuses each made in one place,
# every link in the docs resolving.
python3 scripts/check-imports.py
python3 scripts/check-imports.py --check-no-dep observe agent
scripts/check-self-contained.sh
scripts/check-house.sh
python3 scripts/check-links.py

cargo build --release --quiet
# clippy with -D warnings also fails the run on any rustc warning.
cargo clippy --quiet --workspace --all-targets -- -D warnings
# Integration tests start real torch workers; two at a time keeps a 2-core machine honest. In the full run each
# module of tests/it runs on its own, as when each was a test binary: a test that times a failover then shares
# the machine only with tests of its own kind, never with another module's torch jobs. The partition scenarios
# measure seconds, the straggler scenarios judge a job's pace by the window and the hang scenarios a rank's
# silence by --hang-timeout (with py-spy sampling every rank): they run one at a time (a DDP job of four ranks
# already loads both cores). A run given arguments runs what they select together.
threads="${MUSTER_TEST_THREADS:-2}"
if [ $# -eq 0 ]; then
    cargo test --quiet --workspace --exclude muster -- --test-threads="$threads"
    cargo test --quiet -p muster --lib --bins -- --test-threads="$threads"
    cargo test --quiet -p muster --doc
    # The in-place API's pure parts (the restore's plan), with the venv's torch.
    (cd src/inplace/python && PYTHONDONTWRITEBYTECODE=1 "$MUSTER_PYTHON" -m unittest discover -s tests)
    filter="" skip=()
    for module in $(it_modules); do
        it_tests "$module"
        echo "tests/it/$module.rs" >&2
        cargo test --quiet --test it -- --test-threads="$(case "$module" in partition | straggler | hang) echo 1 ;; *) echo "$threads" ;; esac)" "${tests[@]}"
    done
else
    cargo test --quiet --workspace -- --test-threads="$threads" "$@"
fi
# The same store and rendezvous suites against etcd 3.5 (the run above used 3.4): both supported majors.
MUSTER_ETCD="$MUSTER_ETCD_35" cargo test --quiet --lib -- --test-threads="$threads" etcd
# The wheel, the .deb and the Kubernetes manifests, from the release build above.
scripts/package-test.sh
# Chaos, bounded (a few minutes on 2 cores): workers, agents, the store and fake GPUs broken on purpose.
scripts/chaos.sh --seed 1 --events 8
