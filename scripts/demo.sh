#!/usr/bin/env bash
# Builds muster and runs a real two-worker gloo training job (examples/train.py) under it, exactly as a
# torchrun user would: `muster --standalone --nproc-per-node=2 examples/train.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_venv
# Not --quiet: a first build takes minutes, and a newcomer must be able to tell it from a hang.
echo "muster: building the release binary (cargo build --release: about 5 minutes the first time on a 2-core machine, seconds afterwards)" >&2
cargo build --release
ckpt="$(mktemp -d)"
trap 'rm -rf "$ckpt"' EXIT
exec_args=(--standalone --nproc-per-node=2 examples/train.py --ckpt-dir "$ckpt" "$@")
echo "+ muster ${exec_args[*]}" >&2
target/release/muster "${exec_args[@]}"
