#!/usr/bin/env bash
# Builds muster and runs a real two-worker gloo training job (examples/train.py) under it, exactly as a
# torchrun user would: `muster --standalone --nproc-per-node=2 examples/train.py`.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_venv
cargo build --release --quiet
ckpt="$(mktemp -d)"
trap 'rm -rf "$ckpt"' EXIT
exec_args=(--standalone --nproc-per-node=2 examples/train.py --ckpt-dir "$ckpt" "$@")
echo "+ muster ${exec_args[*]}" >&2
target/release/muster "${exec_args[@]}"
