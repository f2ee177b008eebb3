#!/usr/bin/env bash
# What runs on a lent GPU machine, from the bundle `scripts/gpu/package.sh` makes: unpacks the
# binary, brings the Vulkan loaders when the machine has none (as the device README says), lists
# the adapters, then — each step under a hard time limit, the whole under 8 minutes —
#   1. `bench kernels`: every kernel checked against its reference, then timed against the
#      ceilings (H200: 4 300 GB/s, 790 TFLOP/s);
#   2. `bench train`: `small` 8 × 2048 in float32 and in bfloat16 (float16 where the adapter has
#      no bfloat16), `1B` 2 × 2048 in half precision, each beside PyTorch eager on the same GPU
#      and shapes in the same run where the image has PyTorch; then `small` as FSDP 2 and as
#      TP 2, two ranks sharing the GPU: tokens/s, MFU, host↔device bytes per step.
# Writes $OUT/report.json and $OUT/report.md (and $OUT/run.log with every step's output); a step
# that fails or runs out of time is recorded in both, never a silent stop.
#
#   run.sh                  on the GPU machine ($OUT: the device tool's output folder)
#   run.sh --backend cuda   the same through burn's CUDA backend (`titan-rs-cuda.xz`, the bundle
#                           `package.sh --cuda` makes; the default there): no Vulkan loaders, bfloat16
#   run.sh --dry-run        here, on Mesa's software adapter, tiny shapes: proves the bundle runs alone
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
DRY=0
BACKEND=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --backend) BACKEND=${2:-}; shift ;;
        *) echo "run.sh: unknown argument $1 (expected --dry-run, --backend wgpu|cuda)" >&2; exit 2 ;;
    esac
    shift
done
# Without --backend: the binary the bundle holds (package.sh makes one per bundle).
if [ -z "$BACKEND" ]; then
    BACKEND=wgpu
    [ ! -f "$HERE/titan-rs.xz" ] && [ -f "$HERE/titan-rs-cuda.xz" ] && BACKEND=cuda
fi
case "$BACKEND" in
    wgpu) PACKED=titan-rs.xz ;;
    cuda) PACKED=titan-rs-cuda.xz ;;
    *) echo "run.sh: --backend $BACKEND: expected wgpu or cuda" >&2; exit 2 ;;
esac
if [ ! -f "$HERE/$PACKED" ]; then
    echo "run.sh: --backend $BACKEND needs $HERE/$PACKED (made by scripts/gpu/package.sh$([ "$BACKEND" = cuda ] && echo " --cuda"))" >&2
    exit 2
fi
OUT=${OUT:-$HERE/out}
mkdir -p "$OUT"
LOG="$OUT/run.log"
: > "$LOG"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
export RUST_LOG="${RUST_LOG:-warn}"
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
STEPS_JSON=""
FAILED=""

# step NAME SECONDS CMD...: runs CMD (in the bundle folder) under a time limit, appends its output
# to the log, and records its exit status (124: out of time).
step() {
    local name=$1 limit=$2
    shift 2
    local start end status
    start=$(date +%s)
    echo "=== $name (limit ${limit}s): $*" >> "$LOG"
    (cd "$HERE" && timeout --kill-after=10 "$limit" "$@") >> "$LOG" 2>&1
    status=$?
    end=$(date +%s)
    echo "=== $name: exit $status after $((end - start)) s" >> "$LOG"
    STEPS_JSON="$STEPS_JSON${STEPS_JSON:+,}{\"name\": \"$name\", \"exit\": $status, \"seconds\": $((end - start)), \"limit\": $limit}"
    if [ "$status" -ne 0 ]; then
        local why="exit $status"
        [ "$status" -eq 124 ] && why="out of time (${limit} s)"
        FAILED="$FAILED- **$name**: $why; the end of its output:\n\n\`\`\`\n$(sed -n "/^=== $name (limit/,/^=== $name: exit/p" "$LOG" | tail -15)\n\`\`\`\n"
    fi
    return "$status"
}

if ! xz -dc "$HERE/$PACKED" > "$WORK/titan-rs" 2>> "$LOG"; then
    echo "cannot unpack $HERE/$PACKED" | tee -a "$LOG" >&2
fi
chmod +x "$WORK/titan-rs"
BIN="$WORK/titan-rs"
echo "backend: $BACKEND ($PACKED)" >> "$LOG"

# The loaders: the machine's own libvulkan, else the carried packages (never on a dry run: this
# machine's / is not ours to change).
if [ "$BACKEND" = wgpu ] && ! ldconfig -p 2>/dev/null | grep -q 'libvulkan\.so\.1'; then
    if [ "$DRY" -eq 0 ] && ls "$HERE"/debs/*.deb >/dev/null 2>&1; then
        for f in "$HERE"/debs/*.deb; do dpkg -x "$f" /; done
        ldconfig
        echo "unpacked the carried loaders: $(ls "$HERE/debs" | tr '\n' ' ')" >> "$LOG"
    else
        echo "no libvulkan on this machine and no carried loaders used" >> "$LOG"
    fi
fi
NV_ICD=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
if [ "$BACKEND" = cuda ] && [ -z "${CUDA_PATH:-}" ] && [ -f "$HERE/cuda/nvvm/libdevice/libdevice.10.bc" ] \
    && ! ls /usr/local/cuda/nvvm/libdevice /opt/cuda/nvvm/libdevice /usr/lib/cuda/nvvm/libdevice /usr/nvvm/libdevice >/dev/null 2>&1; then
    # The CUDA compiler links libdevice for exp, log, tanh, …: the carried one where the machine
    # has no toolkit (CUDA_PATH is read for nothing else: the driver is loaded by name).
    export CUDA_PATH="$HERE/cuda"
    echo "CUDA_PATH=$CUDA_PATH (the carried libdevice; no CUDA toolkit on this machine)" >> "$LOG"
fi
if [ "$BACKEND" = cuda ]; then
    # cubecl-cuda loads libcuda at run time and compiles kernels itself (LLVM, linked in).
    step devices 60 sh -c "nvidia-smi -L && ! ldd '$BIN' | grep -i 'not found'"
else
    step devices 60 "$BIN" devices --json "$WORK/devices.json"
fi
if [ "$BACKEND" = wgpu ] && [ "$DRY" -eq 0 ] && ! grep -q '"kind": "discrete GPU"' "$WORK/devices.json" 2>/dev/null && [ -f "$NV_ICD" ]; then
    # No GPU adapter through the default ICDs: point the loader at NVIDIA's (device README).
    export VK_DRIVER_FILES=$NV_ICD
    export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
    step devices-nvidia-icd 60 "$BIN" devices --json "$WORK/devices.json"
fi

if [ "$DRY" -eq 1 ]; then
    SHAPE="--config configs/llama_debug.toml --model.flavor tiny --training.local_batch_size 2 --training.seq_len 32"
    BIG="$SHAPE"
    KITERS=1; TRAIN="--warmup 1 --steps 2"; KLIMIT=240; TLIMIT=120; BLIMIT=120; PLIMIT=120
    # The dry run proves the bundle runs; tuning kernels on a software adapter measures nothing,
    # so CubeCL times the fewest candidates there (a real GPU keeps the default level).
    export CUBECL_AUTOTUNE_LEVEL=minimal
else
    SHAPE="--config configs/llama_small.toml --model.flavor small --training.local_batch_size 8 --training.seq_len 2048"
    BIG="--config configs/llama_small.toml --model.flavor 1B --training.local_batch_size 2 --training.seq_len 2048"
    KITERS=10; TRAIN="--warmup 1 --steps 3"; KLIMIT=100; TLIMIT=75; BLIMIT=90; PLIMIT=60
fi
COMMON="--training.device $BACKEND --checkpoint.enable false"
ONE="--parallelism.data_parallel_shard_degree 1"
# PyTorch eager on the same GPU, same shapes, alternated with titan-rs inside each `bench train`
# (`--baseline pytorch --rounds 1`: same run, ratio in the table), where the image has it.
BASELINE=""
if [ "$DRY" -eq 0 ] && python3 -c "import torch, transformers; assert torch.cuda.is_available()" >> "$LOG" 2>&1; then
    BASELINE="--baseline pytorch --rounds 1"
    echo "PyTorch with CUDA found: each training step is compared with PyTorch eager in the same run" >> "$LOG"
fi
step kernels "$KLIMIT" "$BIN" bench kernels $SHAPE $COMMON $ONE --iters "$KITERS" --peak-gbs 4300 --peak-tflops 790 \
    --json "$WORK/kernels.json"
HALF=bfloat16
if [ "$BACKEND" = wgpu ] && ! grep -A12 '"chosen": true' "$WORK/devices.json" 2>/dev/null | grep -q '"bfloat16": true'; then
    HALF=float16
    echo "the adapter does not compute in bfloat16: the half-precision runs use float16" >> "$LOG"
fi
# name, time limit, then the flags: one rank (small in both precisions, 1B in half precision),
# then FSDP 2 and TP 2 as two ranks sharing the one GPU (the host-staging overhead against one
# rank; float32, as mixed precision with TP is refused).
TRAIN_STEPS="small-float32 small-$HALF 1B-$HALF fsdp2-small-float32 tp2-small-float32"
train_step() {
    local name=$1 limit=$2
    shift 2
    step "train-$name" "$limit" "$BIN" bench train "$@" $COMMON $TRAIN --metrics.peak_tflops 790 \
        --json "$WORK/train-$name.json"
}
train_step small-float32 "$TLIMIT" $SHAPE $ONE $BASELINE
train_step "small-$HALF" "$TLIMIT" $SHAPE $ONE $BASELINE --training.mixed_precision_param "$HALF"
train_step "1B-$HALF" "$BLIMIT" $BIG $ONE $BASELINE --training.mixed_precision_param "$HALF"
train_step fsdp2-small-float32 "$PLIMIT" $SHAPE --parallelism.data_parallel_shard_degree 2 --training.local_batch_size 4
train_step tp2-small-float32 "$PLIMIT" $SHAPE $ONE --parallelism.tensor_parallel_degree 2
# Nothing of a step that ran out of time may stay on the GPU for the next measurement.
pkill -KILL -f "$WORK/titan-rs" 2>/dev/null || true

json_or_null() { if [ -s "$1" ]; then cat "$1"; else echo null; fi; }
{
    echo "{"
    echo "  \"dry_run\": $([ "$DRY" -eq 1 ] && echo true || echo false),"
    echo "  \"date\": \"$(date -u +%Y-%m-%dT%H:%M:%SZ)\","
    echo "  \"host\": \"$(uname -srm)\","
    echo "  \"backend\": \"$BACKEND\","
    echo "  \"steps\": [$STEPS_JSON],"
    echo "  \"devices\": $(json_or_null "$WORK/devices.json"),"
    echo "  \"kernels\": $(json_or_null "$WORK/kernels.json"),"
    echo "  \"half\": \"$HALF\","
    printf '  "train": {'
    sep=""
    for n in $TRAIN_STEPS; do printf '%s"%s": %s' "$sep" "$n" "$(json_or_null "$WORK/train-$n.json")"; sep=", "; done
    echo "}"
    echo "}"
} > "$OUT/report.json"

section() { sed -n "/^=== $1 (limit/,/^=== $1: exit/p" "$LOG" | grep '^|' ; }
{
    echo "# titan-rs GPU report$([ "$DRY" -eq 1 ] && echo " (dry run on this machine's software adapter)")"
    echo
    echo "$(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm), backend $BACKEND"
    echo
    echo "## Adapters"
    echo
    section devices-nvidia-icd || section devices
    echo
    echo "## Kernels (checked against the reference, then timed; ceilings 4 300 GB/s, 790 TFLOP/s)"
    echo
    section kernels
    echo
    echo "## Training steps ($([ "$DRY" -eq 1 ] && echo "tiny flavor, 2 × 32 tokens" || echo "small 8 × 2048 and 1B 2 × 2048 tokens per step"))"
    echo
    for n in $TRAIN_STEPS; do
        echo "$n:"
        echo
        section "train-$n"
        echo
    done
    echo "## Failures"
    echo
    if [ -n "$FAILED" ]; then printf '%b' "$FAILED"; else echo "none"; fi
} > "$OUT/report.md"
echo "report: $OUT/report.md, $OUT/report.json"
[ -z "$FAILED" ]
