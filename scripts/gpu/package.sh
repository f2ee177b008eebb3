#!/usr/bin/env bash
# Builds the GPU bundle: everything a lent GPU machine (no registry, no Rust, other system
# libraries) needs to run titan-rs's GPU measurement, in one git-ignored folder:
#
#   gpu-bundle/titan-rs.xz   release titan-rs with burn's wgpu backend (no MPI), stripped, linked
#                            against glibc 2.28 by `zig cc` (runs on any current Linux)
#   gpu-bundle/debs/         the Vulkan/EGL loader packages the device README names (amd64)
#   gpu-bundle/configs, assets/   the configs, tokenizer and corpus the runs use
#   gpu-bundle/run.sh        what runs on the device (scripts/gpu/run.sh)
#
#   scripts/gpu/package.sh [OUT_DIR]      (default: gpu-bundle in the repository root)
#   scripts/gpu/package.sh --cuda [OUT_DIR]      (default: gpu-bundle-cuda)
#
# `--cuda` makes the CUDA bundle instead: gpu-bundle-cuda/titan-rs-cuda.xz is titan-rs with
# burn's CUDA backend (no wgpu, no MPI; no loader packages), for `run.sh --backend cuda`. It
# installs LLVM 23.1 from PyPI first (scripts/gpu/cuda_llvm.sh: cubecl-cuda compiles kernels
# through LLVM's NVPTX back end, linked statically) and links natively: static LLVM is C++ built
# against libstdc++, so the binary needs this machine's glibc and libstdc++ or newer (printed).
# A bundle of its own because the device tool carries at most 64 MiB: the CUDA binary alone is
# ≈ 41 MB after xz. It also carries NVIDIA's libdevice (cuda/nvvm/libdevice, from PyPI's nvcc
# wheel), which the CUDA compiler links for math functions, and checks that every kernel of ours
# compiles to PTX (`titan-rs ptx`) before the bundle is done.
#
# Needs: pip (installs `ziglang` and `cargo-zigbuild` from PyPI when missing), apt-get (the debs;
# skipped with a note when it cannot reach the archive), xz, binutils. Checks the result: at most
# 60 MiB, and no GLIBC symbol version above 2.28 in the binary.
set -euo pipefail
cd "$(dirname "$0")/../.."
CUDA=0
if [ "${1:-}" = "--cuda" ]; then
    CUDA=1
    shift
fi
OUT=${1:-gpu-bundle$([ "$CUDA" -eq 1 ] && echo -cuda)}
GLIBC=2.28
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-target}"
BIN="$CARGO_TARGET_DIR/release/titan-rs"
rm -rf "$OUT"
mkdir -p "$OUT/configs" "$OUT/assets"

if [ "$CUDA" -eq 1 ]; then
    scripts/gpu/cuda_llvm.sh
    cargo build --release -p titan-rs --features cuda --bin titan-rs
    strip -o "$OUT/titan-rs-cuda" "$BIN"
    highest() { objdump -T "$OUT/titan-rs-cuda" | grep -o "$1_[0-9.]*" | sed "s/$1_//" | sort -V | tail -1; }
    echo "binary: $(du -h "$OUT/titan-rs-cuda" | cut -f1) stripped, needs GLIBC_$(highest GLIBC) and GLIBCXX_$(highest GLIBCXX) at most"
    # cubecl-cuda's LLVM back end links NVIDIA's libdevice for exp, log, tanh, … (every
    # softmax, SiLU and fused Burn kernel); it looks in $CUDA_PATH/nvvm/libdevice, then
    # /usr/local/cuda, /opt/cuda, /usr/lib/cuda, /usr. A machine with only the driver has none,
    # so the bundle carries it (from PyPI's nvcc wheel, fetched once by ptx_report.py), and run.sh points CUDA_PATH at it there.
    toolkit=$(python3 scripts/gpu/ptx_report.py --toolkit)
    mkdir -p "$OUT/cuda/nvvm/libdevice"
    cp "$toolkit/nvvm/libdevice/libdevice.10.bc" "$OUT/cuda/nvvm/libdevice/"
    # Every kernel of ours must lower to PTX for the H100/H200 before the bundle leaves.
    ptx=$(mktemp -d)
    CUDA_PATH="$OUT/cuda" "$OUT/titan-rs-cuda" ptx --out "$ptx"
    rm -rf "$ptx"
    xz -T0 -6 "$OUT/titan-rs-cuda"
else
    if ! command -v cargo-zigbuild >/dev/null 2>&1 || ! python3 -m ziglang version >/dev/null 2>&1; then
        python3 -m pip install --quiet ziglang==0.13.0 cargo-zigbuild==0.24.1
    fi
    # One compile serves the tests and the bundle: the binary is built for this machine's target
    # in the same target folder as `cargo test --release` (every dependency is reused; only the
    # titan-rs crates compile again, without MPI), and only its final link goes through `zig cc`
    # with glibc 2.28's symbol versions. (`cargo zigbuild` would name the target explicitly and
    # compile everything a second time: 36 minutes on 2 cores from scratch.)
    zigcc="$(mktemp -d)/zig-cc-$GLIBC"
    printf '#!/bin/sh\nexec %s zig cc -- -target x86_64-linux-gnu.%s "$@"\n' "$(command -v cargo-zigbuild)" "$GLIBC" > "$zigcc"
    chmod +x "$zigcc"
    cargo rustc --release -p titan-rs --features wgpu --bin titan-rs -- -C linker="$zigcc"
    mkdir -p "$OUT/debs"
    strip -o "$OUT/titan-rs" "$BIN"
    # The highest GLIBC symbol version the binary needs.
    need=$(objdump -T "$OUT/titan-rs" | grep -o 'GLIBC_[0-9.]*' | sed 's/GLIBC_//' | sort -V | tail -1)
    if [ "$(printf '%s\n%s\n' "$need" "$GLIBC" | sort -V | tail -1)" != "$GLIBC" ]; then
        echo "error: the binary needs GLIBC_$need, above $GLIBC" >&2
        exit 1
    fi
    echo "binary: $(du -h "$OUT/titan-rs" | cut -f1) stripped, needs GLIBC_$need at most"
    xz -T0 -6 "$OUT/titan-rs"

    # The loaders, as the device README downloads them (amd64 whatever this machine is).
    lists=$(mktemp -d)
    o="-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists=$lists"
    mkdir -p "$lists/partial"
    if apt-get $o update -q >/dev/null 2>&1 && (cd "$OUT/debs" && apt-get $o download -q \
            libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 >/dev/null 2>&1); then
        echo "loaders: $(ls "$OUT/debs" | tr '\n' ' ')"
    else
        echo "note: could not download the loader packages (no archive reachable); the bundle relies on the machine's own libvulkan"
    fi
    rm -rf "$lists"
fi

cp configs/llama_small.toml configs/llama_debug.toml "$OUT/configs/"
mkdir -p "$OUT/assets/tokenizer" "$OUT/assets/shakespeare"
cp assets/tokenizer/tokenizer.json "$OUT/assets/tokenizer/"
cp assets/shakespeare/*.txt "$OUT/assets/shakespeare/"
mkdir -p "$OUT/scripts"
cp scripts/pytorch_baseline.py "$OUT/scripts/"
cp scripts/gpu/run.sh "$OUT/run.sh"
chmod +x "$OUT/run.sh"
size=$(du -sb "$OUT" | cut -f1)
echo "bundle: $OUT, $((size / 1024 / 1024)) MiB"
if [ "$size" -gt $((60 * 1024 * 1024)) ]; then
    echo "error: the bundle is $((size / 1024 / 1024)) MiB, above 60 MiB" >&2
    exit 1
fi
