#!/usr/bin/env bash
# One prepared run on a GPU machine (an H200 for the numbers in the issue): builds titan-rs with
# burn's wgpu backend, checks every fused kernel against its reference and times it against the
# card's ceilings, then measures tokens/s and MFU of `small` training steps on the GPU.
#
#   scripts/gpu_bench.sh [peak GB/s] [peak TFLOP/s]     (defaults: H200, 4300 and 790)
#
# Needs a Vulkan driver (NVIDIA's, or Mesa's for other GPUs); cubecl's CUDA runtime would need
# `--features cuda`, which downloads an LLVM bundle while building.
set -euo pipefail
cd "$(dirname "$0")/.."
gbs="${1:-4300}"
tflops="${2:-790}"
cargo build --release -p titan-rs --features wgpu
bin=target/release/titan-rs
"$bin" bench kernels --config configs/llama_small.toml --training.device wgpu \
    --training.local_batch_size 8 --training.seq_len 2048 --iters 10 --peak-gbs "$gbs" --peak-tflops "$tflops"
"$bin" bench train --config configs/llama_small.toml --training.device wgpu \
    --training.local_batch_size 8 --training.seq_len 2048 --metrics.peak_tflops "$tflops" \
    --parallelism.data_parallel_shard_degree 1 --warmup 2 --steps 5
