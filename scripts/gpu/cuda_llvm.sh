#!/usr/bin/env bash
# Installs LLVM 23.1 where burn's `cuda` feature looks for it, from PyPI, so that
# `cargo build --release -p titan-rs --features cuda` builds offline.
#
# cubecl-cuda compiles kernels to PTX through LLVM's NVPTX back end, linked statically; its build
# script (`tracel-llvm-bundler`) wants LLVM 23.1 in `<data_local_dir>/tracel/tracel-llvm-23.1.0-4`
# and downloads a bundle from GitHub unless that folder holds the sentinel
# `.tracel-llvm-installed`. GitHub is not reachable from our machines; PyPI carries the same LLVM
# as static SDK wheels (`mlc-llvm-static`, with `mlc-llvm-static-extra-targets` for NVPTX).
#
#   scripts/gpu/cuda_llvm.sh            (idempotent; ≈ 92 MB of wheels, ≈ 1 GB unpacked)
#
# Needs: pip, unzip. Not part of CI: the default build and the tests do not use CUDA.
set -euo pipefail
VERSION=23.1.1.post0
DEST="${XDG_DATA_HOME:-$HOME/.local/share}/tracel/tracel-llvm-23.1.0-4"
if [ -f "$DEST/.tracel-llvm-installed" ] && "$DEST/bin/llvm-config" --targets-built | grep -q NVPTX; then
    echo "LLVM $("$DEST/bin/llvm-config" --version) with NVPTX already in $DEST"
    exit 0
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: -d "$work/wheels" \
    "mlc-llvm-static==$VERSION" "mlc-llvm-static-extra-targets==$VERSION"
mkdir -p "$work/x"
for w in "$work"/wheels/*.whl; do
    unzip -q -o "$w" -d "$work/x"
done
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
cp -r "$work/x/mlc_llvm_static/static" "$DEST"
chmod +x "$DEST"/bin/*
"$DEST/bin/llvm-config" --targets-built | grep -q NVPTX || {
    echo "error: the LLVM in $DEST has no NVPTX target (mlc-llvm-static-extra-targets missing?)" >&2
    exit 1
}
touch "$DEST/.tracel-llvm-installed"
echo "LLVM $("$DEST/bin/llvm-config" --version) with NVPTX installed in $DEST"
