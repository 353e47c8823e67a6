#!/usr/bin/env bash
# Builds muster_<version>_<arch>.deb from a staged tree with dpkg-deb (no cargo-deb needed).
# Usage: packaging/deb/build.sh BINARY OUT_DIR   (BINARY: a release build, e.g. target/release/muster)
# Prints the path of the .deb. Install with `dpkg -i`, remove with `dpkg -r muster`.
set -euo pipefail
cd "$(dirname "$0")/../.."
if [ $# -ne 2 ] || [ ! -x "$1" ]; then
    echo "usage: packaging/deb/build.sh BINARY OUT_DIR (BINARY must be an executable muster build)" >&2
    exit 2
fi
binary=$1 out=$2
version=$(sed -n 's/^version = "\(.*\)"$/\1/p' Cargo.toml | head -n1)
arch=$(dpkg --print-architecture)
[ -n "$version" ] || { echo "packaging/deb/build.sh: no version = \"...\" line in Cargo.toml" >&2; exit 1; }

stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
root="$stage/muster_${version}_$arch"
install -D -m 0755 "$binary" "$root/usr/bin/muster"
strip --strip-unneeded "$root/usr/bin/muster"
# The in-place API where the system's python3 finds it, from its one copy (the binary embeds the same files).
api="$root/usr/lib/python3/dist-packages/muster_inplace"
mkdir -p "$api"
find src/inplace/python/muster_inplace -maxdepth 1 -type f -exec install -m 0644 -t "$api" {} +
mkdir -p "$root/usr/share/doc/muster"
printf 'Format: https://www.debian.org/doc/packaging-manuals/copyright-format/1.0/\nFiles: *\nLicense: Apache-2.0\n' \
    > "$root/usr/share/doc/muster/copyright"
mkdir -p "$root/DEBIAN"
# The binary links only glibc (libc, libm, libgcc_s): that is the whole dependency list.
cat > "$root/DEBIAN/control" <<CONTROL
Package: muster
Version: $version
Architecture: $arch
Maintainer: muster developers <muster@localhost>
Depends: libc6 (>= 2.34), libgcc-s1
Section: utils
Priority: optional
Installed-Size: $(du -sk "$root/usr" | cut -f1)
Description: per-node launcher for PyTorch distributed training
 A torchrun drop-in: the same flags and worker environment, started in
 milliseconds, with no worker outliving it. Needs torch in the Python
 environment the workers run in. Ships muster_inplace, the Python API with
 which a training script keeps its processes when the job's membership
 changes.
CONTROL
# Python writes __pycache__ beside the package when root imports it; dpkg removes only the files it installed.
cat > "$root/DEBIAN/prerm" <<'PRERM'
#!/bin/sh
set -e
rm -rf /usr/lib/python3/dist-packages/muster_inplace/__pycache__
PRERM
chmod 0755 "$root/DEBIAN/prerm"
mkdir -p "$out"
dpkg-deb --root-owner-group --build "$root" "$out" >/dev/null
echo "$out/muster_${version}_$arch.deb"
