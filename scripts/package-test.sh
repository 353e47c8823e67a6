#!/usr/bin/env bash
# The packaging checks (called by scripts/test.sh): the wheel built with maturin, installed into a fresh venv,
# its muster run and its muster_inplace imported from there; the .deb installed with dpkg, run, its
# muster_inplace imported by the system's python3, and removed; the release binary's libraries; the
# Kubernetes manifests against their schemas and docs/exit-codes.md. Needs root for dpkg (skipped, with a
# line, when not root). The release build behind the wheel is the one scripts/test.sh made.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/lib.sh
ensure_venv

# ensure_tool_venv NAME PACKAGE: a cached venv under $MUSTER_CACHE with one PyPI package, made once.
ensure_tool_venv() {
    local venv="$MUSTER_CACHE/$1" marker="$MUSTER_CACHE/$1/.muster-$2"
    if [ ! -f "$marker" ]; then
        echo "muster: creating $venv with $2 (once; cached afterwards)" >&2
        python3 -m venv "$venv"
        "$venv/bin/pip" install -q "$2"
        touch "$marker"
    fi
}

root=$PWD
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

echo "== release binary links only glibc"
bad=$(readelf -d target/release/muster | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p' |
    grep -v -E '^(libc|libm|libgcc_s|libpthread|libdl|librt)\.so\.[0-9]+$|^ld-linux' || true)
[ -z "$bad" ] || { echo "target/release/muster needs more than glibc: $bad" >&2; exit 1; }

echo "== wheel (maturin)"
ensure_tool_venv maturin 'maturin>=1.16,<2'
(cd packaging/python && "$MUSTER_CACHE/maturin/bin/maturin" build --quiet --release --out "$scratch/wheels")
wheel=$(ls "$scratch"/wheels/muster_launcher-*.whl)
echo "$(basename "$wheel"): $(du -k "$wheel" | cut -f1) KiB"
# The binary's size the README states ("about N MB") is the wheel's, within 5%.
python3 - "$wheel" README.md <<'PY'
import re, sys, zipfile
wheel, readme = sys.argv[1], sys.argv[2]
sizes = [i.file_size for i in zipfile.ZipFile(wheel).infolist() if i.filename.endswith("/scripts/muster")]
stated = re.search(r"stripped binary \(about ([0-9.]+) MB", open(readme).read())
if len(sizes) != 1 or not stated:
    sys.exit(f"cannot compare the binary's size: {len(sizes)} muster binaries in the wheel, README figure {stated}")
actual, said = sizes[0] / 1e6, float(stated.group(1))
print(f"the wheel's binary: {actual:.1f} MB (the README says about {said} MB)")
if abs(actual - said) > 0.05 * said:
    sys.exit(f"README.md says the binary is about {said} MB; the wheel's is {actual:.1f} MB: correct the README")
PY
# A fresh venv that sees the torch venv's packages, so the job runs without a second torch download.
site=$("$MUSTER_PYTHON" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
python3 -m venv "$scratch/venv"
"$scratch/venv/bin/pip" install -q --no-index "$wheel"
echo "$site" > "$("$scratch/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch-venv.pth"
( # From the venv alone: its muster first on PATH, its python the workers'.
    export PATH="$scratch/venv/bin:/usr/bin:/bin" VIRTUAL_ENV="$scratch/venv"
    [ "$(command -v muster)" = "$scratch/venv/bin/muster" ] || { echo "muster is not on the venv's PATH" >&2; exit 1; }
    muster --version
    # The API from the venv's own site-packages (torch, which it imports, through the .pth above).
    python -c 'import sys, muster_inplace as m
assert m.__file__.startswith(sys.prefix + "/"), m.__file__
assert callable(m.run) and isinstance(m.State, type)
print("import muster_inplace from the wheel: ok,", m.__file__)'
    muster --standalone --nproc-per-node 2 --log-dir "$scratch/logs" examples/train.py --steps 4 >"$scratch/job.log" 2>&1 ||
        { cat "$scratch/job.log" >&2; echo "the job under the wheel's muster failed" >&2; exit 1; }
    echo "standalone job from the wheel's venv: ok"
)

echo "== .deb (dpkg-deb)"
deb=$(packaging/deb/build.sh target/release/muster "$scratch/deb")
dpkg-deb --info "$deb" | sed -n 's/^ \(Package\|Version\|Depends\): /  \1: /p'
if [ "$(id -u)" -ne 0 ]; then
    echo "not root: skipping dpkg -i of $deb"
elif dpkg -s muster >/dev/null 2>&1; then
    echo "a muster package is already installed: leaving it alone, skipping dpkg -i" >&2
else
    dpkg -i "$deb" >/dev/null
    trap 'dpkg -r muster >/dev/null; rm -rf "$scratch"' EXIT
    /usr/bin/muster --version
    # The system's python3 finds the API where the .deb put it (torch from the torch venv); bytecode written,
    # as a root import writes it, so that dpkg -r is seen to remove it too.
    env -u PYTHONDONTWRITEBYTECODE PYTHONPATH="$site" /usr/bin/python3 -c 'import muster_inplace as m
assert m.__file__ == "/usr/lib/python3/dist-packages/muster_inplace/__init__.py", m.__file__
assert callable(m.run) and isinstance(m.State, type)
print("import muster_inplace from the .deb: ok,", m.__file__)'
    (cd "$scratch" && /usr/bin/muster --standalone --nproc-per-node 1 "$root/examples/train.py" --steps 2 \
        >deb-job.log 2>&1) ||
        { cat "$scratch/deb-job.log" >&2; echo "the job under /usr/bin/muster failed" >&2; exit 1; }
    dpkg -r muster >/dev/null
    trap 'rm -rf "$scratch"' EXIT
    for left in /usr/bin/muster /usr/lib/python3/dist-packages/muster_inplace; do
        [ ! -e "$left" ] || { echo "dpkg -r muster left $left" >&2; exit 1; }
    done
    echo "dpkg -i, run, dpkg -r: ok"
fi

echo "== Kubernetes manifests (kubernetes-validate --strict, exit-code policies)"
ensure_tool_venv kubernetes-validate kubernetes-validate
"$MUSTER_CACHE/kubernetes-validate/bin/python" packaging/k8s/check.py .
