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

# ensure_prometheus: Debian's prometheus server, which tests/observe.rs starts on loopback to scrape the agents.
ensure_prometheus() {
    if command -v prometheus >/dev/null 2>&1; then
        return
    fi
    echo "muster: installing prometheus with apt-get (once)" >&2
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null
}
